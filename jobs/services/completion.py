"""The completer's write: the ends of runs of one lock holder, in batches
(docs/architecture.md#outcomes-of-a-run, docs/postgres-executor.md).

Both executors write every end here: a Celery delivery a batch of one, a run_worker host
windows of them (jobs.execution.complete). In one transaction (a statement alone, when
it is the only one: the common end):

1. The ends that tell a connector's breaker something (a success of a job of a
   connector, a connector failure) are counted by their breakers in one statement
   (jobs.services.connectors.breakers_count): each breaker row the batch changes is
   written once, with its `connector_opened` / `connector_closed` entry on the ops chain.
2. What depends on the breaker is resolved from that count: a connector failure whose
   breaker now holds the connector's jobs waits for its probe (`retrying`, the wait
   the longer of its backoff and the breaker's, jobs_retry_held) instead of its usual
   backoff, and on its last attempt instead of a dead letter (its budget grown by one).
3. One transition statement per outcome for all of the batch's ends of that outcome
   (jobs_succeed, jobs_retry, jobs_retry_held, jobs_cancel_confirm, jobs_fail_fenced),
   each job fenced by the holder and its own attempt, with its own entry and event; a
   failure's last progress value is written first (its `progress` entry), then the job
   fails, and its dead letter row is opened (no broker copy: a Celery delivery rejects
   its message after the commit, and the dead-letter watcher records the broker's copy).

An end whose fence failed (its job was reclaimed meanwhile) writes nothing of its own;
the others are unaffected. Its breaker still heard of it: the run did call the connector.
"""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from django.db import transaction

from jobs.domain.states import Status
from jobs.services.connectors import BreakerEnd, FailureSeen, breakers_count
from jobs.services.dead_letters import FencedFailure, jobs_fail_fenced_with_dead_letters
from jobs.services.worker import (
    WORKER,
    Retry,
    jobs_cancel_confirm,
    jobs_retry,
    jobs_retry_held,
    jobs_succeed,
)


@dataclass(frozen=True)
class Finish:
    """How one run of a job ended, as the execution core decided it
    (jobs.execution.decide.finish_decide): `target` succeeded (with `result`),
    cancelled, retrying (with `delay` and the error) or failed (with the dead letter's
    `reason` and the error); `progress`, the last coalesced progress value, goes with
    it. Written by the lock holder at `attempt`. `job_type` and `seconds` (the run from
    its claim to this decision) are for its log line and job_duration_seconds.

    `connector`: the connector whose breaker counts this end (a success of a job of a
    connector, or a connector failure with its `connector_error` code); the completer
    resolves what depends on the breaker. A connector failure's `delay` is its backoff
    also when it is `failed` (its last attempt): the wait it gets if its breaker holds it."""

    job_id: uuid.UUID
    attempt: int
    target: str
    result: dict[str, Any] | None = None
    error_code: str | None = None
    error_message: str | None = None
    delay: float | None = None
    reason: str | None = None
    progress: dict[str, Any] | None = None
    job_type: str = ""
    seconds: float = 0.0
    # A retry its connector's breaker holds (docs/connectors.md), as the completer
    # resolved it: the breaker's state, and how many attempts the job's budget grows by
    # (1 on its last attempt).
    breaker: str | None = None
    extend_attempts: int = 0
    connector: str | None = None
    connector_error: str | None = None
    # The provider that ran it (a connector with providers): its end's entry names it.
    provider: str | None = None


class Completion(NamedTuple):
    """What the completer wrote: each end as written (its breaker's part resolved), in
    the batch's order, and the ends whose fence failed (nothing of theirs written)."""

    written: list[Finish]
    lost: list[Finish]


def jobs_complete(*, finishes: list[Finish], locked_by: str) -> Completion:
    """Write a batch of ends of the lock holder `locked_by` (the module docstring), in
    one transaction."""
    counted = [n for n, f in enumerate(finishes) if f.connector is not None]
    # Inside a caller's transaction (a test's), no savepoint of its own: the write costs
    # its statements and nothing more. The common end needs none of its own either: no
    # breaker to count and one outcome, which one statement writes (a failure writes
    # more: its progress, the failure, its dead letter).
    alone = not counted and len({f.target for f in finishes}) == 1
    one_statement = alone and finishes[0].target != Status.FAILED
    with nullcontext() if one_statement else transaction.atomic(savepoint=False):
        seen = breakers_count(
            [
                BreakerEnd(
                    finishes[n].connector or "", finishes[n].job_id, finishes[n].connector_error
                )
                for n in counted
            ]
        )
        verdicts: dict[int, FailureSeen | None] = dict(zip(counted, seen, strict=True))
        resolved = [_resolved(f, verdicts.get(n)) for n, f in enumerate(finishes)]
        done = _write(resolved, locked_by)
    written = [f for f in resolved if (str(f.job_id), f.attempt) in done]
    return Completion(written, [f for f in finishes if (str(f.job_id), f.attempt) not in done])


def jobs_finish(*, finishes: list[Finish], locked_by: str) -> list[Finish]:
    """`jobs_complete`; returns the finishes whose fence failed (their jobs were
    reclaimed: nothing of theirs is written)."""
    return jobs_complete(finishes=finishes, locked_by=locked_by).lost


def _resolved(finish: Finish, seen: FailureSeen | None) -> Finish:
    """A connector failure as its breaker decides it (docs/connectors.md): once the
    breaker holds the connector's jobs, the job waits for the probe too (the longer of
    its backoff and the breaker's wait), and is not dead-lettered for an outage the
    breaker saw: on its last attempt its budget grows by one."""
    if seen is None or not seen.holds_jobs:
        return finish
    return replace(
        finish,
        target=Status.RETRYING,
        delay=max(finish.delay or 0.0, seen.wait),
        reason=None,
        breaker=seen.state,
        extend_attempts=1 if finish.target == Status.FAILED else 0,
    )


def _write(finishes: list[Finish], locked_by: str) -> set[tuple[str, int]]:
    """One transition statement per outcome; returns the (job id, attempt) written."""
    by = {
        target: [f for f in finishes if f.target == target]
        for target in (Status.SUCCEEDED, Status.RETRYING, Status.CANCELLED, Status.FAILED)
    }
    done: list[Any] = []
    if by[Status.SUCCEEDED]:
        group = by[Status.SUCCEEDED]
        done += jobs_succeed(
            locked_by=locked_by,
            ends=[(f.job_id, f.attempt) for f in group],
            results=[f.result for f in group],
            progress=[f.progress for f in group],
            providers=[f.provider for f in group],
        )
    retries = [_retry(f) for f in by[Status.RETRYING]]
    plain = [r for r in retries if r.breaker is None]
    if plain:
        done += jobs_retry(locked_by=locked_by, retries=plain)
    if len(plain) < len(retries):
        done += jobs_retry_held(locked_by=locked_by, retries=[r for r in retries if r.breaker])
    if by[Status.CANCELLED]:
        group = by[Status.CANCELLED]
        done += jobs_cancel_confirm(
            locked_by=locked_by,
            ends=[(f.job_id, f.attempt) for f in group],
            progress=[f.progress for f in group],
            providers=[f.provider for f in group],
        )
    if by[Status.FAILED]:
        failures = [
            FencedFailure(
                f.job_id,
                f.attempt,
                f.reason or "exhausted",
                f.error_code,
                f.error_message,
                f.progress,
                provider=f.provider,
            )
            for f in by[Status.FAILED]
        ]
        done += jobs_fail_fenced_with_dead_letters(
            locked_by=locked_by, failures=failures, actor=WORKER
        )
    return {(str(job.id), job.attempts) for job in done}


def _retry(finish: Finish) -> Retry:
    return Retry(
        finish.job_id,
        finish.attempt,
        float(finish.delay or 0),
        finish.error_code or "",
        finish.error_message or "",
        finish.progress,
        breaker=finish.breaker,
        extend_attempts=finish.extend_attempts,
        provider=finish.provider,
    )
