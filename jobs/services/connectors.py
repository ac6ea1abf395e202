"""Connectors and their circuit breakers (docs/connectors.md).

A connector is the external system a job type's handler calls (`connector` in the job
types table). Its breaker is a `connector_breakers` row (jobs.models.ConnectorBreaker),
shared by every worker host, changed only by the compare-and-set statements
`connector_*` of jobs/queries.sql and, for the ends of runs, `breakers_count`
(jobs/sql/30_breakers.sql), which the completer runs in the transaction that writes
them (jobs.services.completion):

- closed: jobs run; each connector failure (jobs.domain.errors: `connector_failure`, i.e. a
  timeout, a 5xx, a refused connection; not a 4xx) counts, a success resets the count;
  `failures` in a row open it;
- open, for the connector's cool-down: a claimed job of the connector does not start.
  It goes `running -> retrying`, audited `deferred`, its attempt given back, and comes
  due at the probe time plus jitter (`job_defer`); the dispatcher republishes it then;
- half-open, from the probe time: the first job that comes due probes (one
  compare-and-set names it); the others wait a short probe-wait; the probe's success
  closes the breaker, its connector failure opens it again.

Every change of state is audited on the ops chain in the same transaction
(`connector_opened`, `connector_half_open`, `connector_closed`, with `manual` and the
justification for an operator's). A claim reads no breaker while its connector is
closed: each process keeps a copy of the breakers, read again at most every
JOBOPS_CONNECTOR_CACHE_SECONDS; only a job whose connector that copy shows open or
half-open asks the database (`connector_admit`). A job that started on a stale copy
and meets the outage fails into an open breaker, which defers it the same way.

A connector may list providers (JOBOPS_CONNECTORS, docs/connectors.md#providers-and-a-fallback):
each is a breaker of its own (`connector:provider`), the gate chooses one of the
primary providers by weight, the fallback while they are all open, and defers the job
as above only while every provider is; each end's entry names the provider that ran it.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit.services import OPS_CHAIN, Actor, audit_append
from jobs.domain.exceptions import (
    ConnectorControlInputError,
    ConnectorNotFoundError,
    ConnectorOpenError,
    JobLost,
)
from jobs.domain.types import (
    ConnectorSpec,
    JobType,
    all_types,
    connector_providers,
    connectors_grouped,
    get_connector,
)
from jobs.models import BreakerState, ConnectorBreaker, Job
from jobs.queries import QUERIES
from jobs.services.reasons import control_reason
from jobs.services.transitions import Fence, change, moved
from jobs.services.worker import WORKER

log = structlog.get_logger("jobs.connectors")

DEFERRED_EVENT = "deferred"
# The last_error_code of a job waiting for its connector's probe (the API shows it).
CONNECTOR_OPEN_CODE = "CONNECTOR_OPEN"
OPENED_EVENT = "connector_opened"
HALF_OPEN_EVENT = "connector_half_open"
CLOSED_EVENT = "connector_closed"


# --- this process's copy of the breakers ---------------------------------------------


@dataclass(frozen=True)
class BreakerCopy:
    state: str
    probe_at: datetime | None
    probe_job_id: uuid.UUID | None
    probe_started_at: datetime | None


_copy_lock = threading.Lock()
# (monotonic time read, the rows by connector name)
_copy: tuple[float, dict[str, BreakerCopy]] = (float("-inf"), {})


def breakers_cached() -> dict[str, BreakerCopy]:
    """The breakers as this process last read them, read again when older than
    JOBOPS_CONNECTOR_CACHE_SECONDS (one small statement: a row per connector)."""
    global _copy
    with _copy_lock:
        read_at, rows = _copy
    if time.monotonic() - read_at < settings.JOBOPS_CONNECTOR_CACHE_SECONDS:
        return rows
    rows = {
        b.name: BreakerCopy(b.state, b.probe_at, b.probe_job_id, b.probe_started_at)
        for b in ConnectorBreaker.objects.all()
    }
    with _copy_lock:
        _copy = (time.monotonic(), rows)
    return rows


def breakers_forget() -> None:
    """Read the breakers again at the next use (after this process changed one)."""
    global _copy
    with _copy_lock:
        _copy = (float("-inf"), {})


def _blocked(copy: BreakerCopy | None, spec: ConnectorSpec, now: datetime) -> bool:
    if copy is None or copy.state == BreakerState.CLOSED:
        return False
    if copy.state == BreakerState.OPEN:
        return copy.probe_at is None or copy.probe_at > now
    # half-open: blocked while a live probe holds it (else the next job probes)
    started = copy.probe_started_at
    return (
        copy.probe_job_id is not None
        and started is not None
        and (now - started).total_seconds() < spec.probe_lease_seconds
    )


def blocked_types() -> list[str]:
    """The job types whose connector must not start a job now: open before its probe
    time, or half-open while another job probes. For a claim that can skip work before
    it counts an attempt (a batch claim's `skip_types`); at most
    JOBOPS_CONNECTOR_CACHE_SECONDS old, so a claimed job still passes `connector_gate`.
    A connector past its probe time is not blocked: one of its jobs must be claimed to
    probe it."""
    copies, now = breakers_cached(), timezone.now()
    # A connector with providers is blocked only when every provider is (the fallback too).
    blocked = {
        connector
        for connector, providers in connectors_grouped().items()
        if all(_blocked(copies.get(p.name), p, now) for p in providers)
    }
    return [t.name for t in all_types().values() if t.connector in blocked]


def connector_create_check(*, spec: JobType) -> None:
    """A create of a type that opted in (`connector_open: "refuse"`) while its
    connector's breaker is open or probing: ConnectorOpenError (409, Retry-After: until
    its probe time, or the probe-wait). Every other type's create is accepted and its
    job waits (creation keeps its promise). From this process's copy of the breakers."""
    providers = connector_providers(spec.connector) if spec.connector else ()
    if not providers or spec.connector_open != "refuse":
        return
    copies, now = breakers_cached(), timezone.now()
    waits: list[tuple[float, str]] = []
    for provider in providers:
        copy = copies.get(provider.name)
        if copy is None or copy.state == BreakerState.CLOSED:
            return  # a provider (or the fallback) takes the job's calls
        wait = provider.probe_wait_seconds
        if copy.state == BreakerState.OPEN and copy.probe_at is not None:
            wait = max(wait, (copy.probe_at - now).total_seconds())
        waits.append((wait, copy.state))
    wait, state = min(waits)
    raise ConnectorOpenError(
        connector=providers[0].connector, state=state, retry_after=max(1, math.ceil(wait))
    )


# --- a worker's run -------------------------------------------------------------------


@dataclass(frozen=True)
class Gate:
    """What `connector_gate` decided for one claimed job."""

    # The breaker the job calls through: its connector's, or the provider chosen.
    connector: ConnectorSpec | None
    # This run is the half-open breaker's one probe.
    probe: bool = False
    # Not started: the job was deferred (running -> retrying, attempt given back).
    deferred: Job | None = None
    delay: float = 0.0


def provider_choose(
    providers: list[ConnectorSpec], *, rng: random.Random | None = None
) -> ConnectorSpec:
    """One of `providers`, each with the chance of its weight among theirs; `rng`: the
    random source (a seeded one in tests), else the module's."""
    if len(providers) == 1:  # the usual case (one provider, or the fallback): no draw
        return providers[0]
    chooser = rng if rng is not None else random
    return chooser.choices(providers, weights=[p.weight for p in providers])[0]


def connector_gate(*, job: Job, fence: Fence, rng: random.Random | None = None) -> Gate:
    """Before a claimed job's handler runs: may it call its connector now, and through
    which provider (docs/connectors.md#providers-and-a-fallback)?

    1. No connector: run (no query).
    2. The primary providers that this process's copy shows closed, or due a probe:
       choose one by weight (`rng`). Closed: run (no query). Due a probe: ask its
       breaker (connector_admit, one compare-and-set): admitted (closed by now, or this
       job becomes its probe, audited `connector_half_open`): run; else choose again
       among the others.
    3. Else the fallback, the same way.
    4. Else ask every breaker the copy shows blocked (primaries, then the fallback): the
       first that admits the job runs it. A connector without providers is its own one
       primary provider, so steps 2 and 4 are today's single breaker.
    5. Else defer the job (`job_defer`) until the soonest of their probe times (open) or
       for the probe-wait (another job probes), plus jitter.
    """
    spec = all_types().get(job.type)
    providers = connector_providers(spec.connector) if spec and spec.connector else ()
    if not providers:
        return Gate(connector=None)
    copies, now = breakers_cached(), timezone.now()
    primaries = [p for p in providers if not p.fallback]
    fallbacks = [p for p in providers if p.fallback]
    waits: list[tuple[float, str, ConnectorSpec]] = []
    asked: set[str] = set()
    for group in (primaries, fallbacks):
        candidates = [p for p in group if not _blocked(copies.get(p.name), p, now)]
        while candidates:
            chosen = provider_choose(candidates, rng=rng)
            copy = copies.get(chosen.name)
            if copy is None or copy.state == BreakerState.CLOSED:
                return Gate(connector=chosen)
            gate, wait = _admit(chosen, job)
            asked.add(chosen.name)
            if gate is not None:
                return gate
            waits.append(wait)
            candidates.remove(chosen)
    for provider in primaries + fallbacks:
        if provider.name in asked:
            continue
        gate, wait = _admit(provider, job)
        if gate is not None:
            return gate
        waits.append(wait)
    wait_seconds, state, soonest = min(waits, key=lambda w: w[0])
    delay = wait_seconds + random.uniform(0, soonest.jitter_seconds)
    deferred = job_defer(
        job_id=job.id, fence=fence, connector=soonest.connector, state=state, delay=delay
    )
    return Gate(connector=soonest, deferred=deferred, delay=delay)


def _admit(spec: ConnectorSpec, job: Job) -> tuple[Gate | None, tuple[float, str, ConnectorSpec]]:
    """Ask `spec`'s breaker whether `job` may call it (connector_admit): a Gate when it
    may (closed, or as its probe), else None and how long the job would wait for it."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                QUERIES["connector_admit"],
                {"name": spec.name, "job_id": job.id, "lease": spec.probe_lease_seconds},
            )
            row = cursor.fetchone()
        if row is None:
            return Gate(connector=spec), (0.0, BreakerState.CLOSED, spec)
        state, probing, probe_at, now = row
        if probing:
            if state == BreakerState.OPEN:
                _audit(spec.name, HALF_OPEN_EVENT, WORKER, {"from": state, "job_id": str(job.id)})
            transaction.on_commit(breakers_forget)
            return Gate(connector=spec, probe=True), (0.0, state, spec)
    if state == BreakerState.CLOSED:
        return Gate(connector=spec), (0.0, state, spec)
    if state == BreakerState.OPEN:
        return None, (max(0.0, (probe_at - now).total_seconds()), state, spec)
    return None, (spec.probe_wait_seconds, state, spec)


def job_defer(
    *, job_id: uuid.UUID | str, fence: Fence, connector: str, state: str, delay: float
) -> Job:
    """`running -> retrying` before the handler ran, audited `deferred` (reason
    `connector_open`, the connector, the breaker's state), the claim's attempt given
    back, `next_run_at = now + delay`; fenced as every worker write (JobLost)."""
    waits_for = "its probe time" if state == BreakerState.OPEN else "another job's probe"
    rows = change(
        "jobs_defer",
        job_ids=[job_id],
        actor=WORKER,
        attempts=[fence.attempt],
        locked_by=fence.locked_by,
        run_in=[float(delay)],
        codes=[CONNECTOR_OPEN_CODE],
        messages=[
            f"connector {connector} is {state.replace('_', '-')}: the job waits for "
            f"{waits_for} ({round(delay)} s) without spending an attempt"
        ],
        data={
            str(job_id): {
                "reason": "connector_open",
                "connector": connector,
                "breaker": state,
                "delay_ms": round(delay * 1000),
                "attempt_given_back": True,
            }
        },
    )
    # a deferral is no retry: the handler did not run
    deferred = moved("jobs_defer", rows, retried=False)
    if not deferred:
        raise JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")
    return deferred[0]


@dataclass(frozen=True)
class FailureSeen:
    """The breaker after a connector failure: its state and, while it is not closed, how
    long the job waits (seconds): until the probe time (open) or the probe-wait
    (half-open), plus jitter."""

    state: str
    wait: float
    # False: another provider of its connector (or the fallback) takes calls, so the job
    # retries as usual and its next run goes there instead of waiting for this probe.
    holds: bool = True

    @property
    def holds_jobs(self) -> bool:
        return self.holds and self.state != BreakerState.CLOSED


@dataclass(frozen=True)
class BreakerEnd:
    """One run's end as its connector's breaker hears it: a success (`error_code` None)
    or a connector failure with the code the breaker records."""

    connector: str
    job_id: uuid.UUID | str
    error_code: str | None = None


def failure_code(error: BaseException) -> str | None:
    """The code a connector failure is counted with (jobs.errors: `connector_failure`, a
    timeout, a 5xx, a refused connection); None when `error` is none (a 4xx, a bug)."""
    if not getattr(error, "connector_failure", False):
        return None
    return str(getattr(error, "code", "") or type(error).__name__)[:64]


def breakers_count(ends: list[BreakerEnd]) -> list[FailureSeen | None]:
    """Count the ends of a batch of runs (in their order) against their connectors'
    breakers, in one statement (breakers_count, jobs/sql/30_breakers.sql) that locks and
    writes each changed breaker row once, however many of its ends the batch holds; in
    the caller's transaction (the completer's), with the entries it owes on the ops
    chain: `connector_opened` when a failure opens a breaker (a closed one reaching its
    connector's `failures`, or the half-open one whose probe failed), `connector_closed`
    when a probe's success closes it (its deferred jobs then come due within the
    jitter). Returns, for each end, None for a success, and for a failure what its
    breaker was once it was counted: a breaker that holds jobs makes a failing job wait
    for the probe instead of its usual backoff (docs/connectors.md)."""
    specs: dict[str, ConnectorSpec] = {}
    for end in ends:
        spec = get_connector(end.connector)
        if spec is None:
            raise ValueError(f"no connector {end.connector!r}")
        specs[end.connector] = spec
    return _count(ends, specs)[0]


def _count(
    ends: list[BreakerEnd], specs: dict[str, ConnectorSpec]
) -> tuple[list[FailureSeen | None], set[str]]:
    """`breakers_count`'s statement and entries; also the connectors it closed."""
    seen: list[FailureSeen | None] = [None] * len(ends)
    closed: set[str] = set()
    if not ends:
        return seen, closed
    params: dict[str, Any] = {
        "names": list(specs),
        "thresholds": [spec.failures for spec in specs.values()],
        "cooldowns": [float(spec.cooldown_seconds) for spec in specs.values()],
        "connectors": [end.connector for end in ends],
        "job_ids": [str(end.job_id) for end in ends],
        "outcomes": ["succeeded" if end.error_code is None else "failed" for end in ends],
        "codes": [end.error_code for end in ends],
    }
    with transaction.atomic(savepoint=False):  # the completer's: no savepoint of its own
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["breakers_count"], params)
            rows = cursor.fetchall()
        for n, old_state, state, failures, probe_at, now in rows:
            end = ends[n - 1]
            spec = specs[end.connector]
            if state == BreakerState.OPEN and old_state != BreakerState.OPEN:
                _opened(spec, end, old_state=old_state, failures=failures, probe_at=probe_at)
            elif state == BreakerState.CLOSED and old_state != BreakerState.CLOSED:
                _closed(spec, end, old_state=old_state)
                closed.add(spec.name)
            if end.error_code is not None:
                seen[n - 1] = _seen(spec, state, probe_at, now)
        _another_provider_open(ends, specs, seen)
    for n, end in enumerate(ends):
        if end.error_code is not None and seen[n] is None:  # a row it did not change
            seen[n] = FailureSeen(state=BreakerState.CLOSED, wait=0.0)
    return seen, closed


def _another_provider_open(
    ends: list[BreakerEnd], specs: dict[str, ConnectorSpec], seen: list[FailureSeen | None]
) -> None:
    """A failure whose provider's breaker now holds jobs holds its job only when no
    other provider of its connector takes calls: else the job retries with its usual
    backoff, and its next run goes to another provider (or the fallback). Read from the
    breaker rows in the caller's transaction (after this batch's count)."""
    held = {n: f for n, f in enumerate(seen) if f is not None and f.holds_jobs}
    siblings = {
        n: [
            p
            for p in connector_providers(specs[ends[n].connector].connector)
            if p.name != ends[n].connector
        ]
        for n in held
    }
    names = {p.name for group in siblings.values() for p in group}
    if not names:
        return
    rows = {
        b.name: BreakerCopy(b.state, b.probe_at, b.probe_job_id, b.probe_started_at)
        for b in ConnectorBreaker.objects.filter(name__in=names)
    }
    now = timezone.now()
    for n, failure in held.items():
        if any(not _blocked(rows.get(p.name), p, now) for p in siblings[n]):
            seen[n] = replace(failure, holds=False)


def _opened(
    spec: ConnectorSpec, end: BreakerEnd, *, old_state: str, failures: int, probe_at: datetime
) -> None:
    _audit(
        spec.name,
        OPENED_EVENT,
        WORKER,
        {
            "from": old_state,
            "failures": failures,
            "error_code": end.error_code,
            "job_id": str(end.job_id),
            "probe_at": probe_at.isoformat(),
            "cause": "probe_failed" if old_state == BreakerState.HALF_OPEN else "failures",
        },
    )
    transaction.on_commit(breakers_forget)
    log.warning(
        "connector_opened", connector=spec.name, failures=failures, error_code=end.error_code
    )


def _closed(spec: ConnectorSpec, end: BreakerEnd, *, old_state: str) -> None:
    released = _release_jobs(spec)
    _audit(
        spec.name,
        CLOSED_EVENT,
        WORKER,
        {
            "from": old_state,
            "cause": "probe_succeeded",
            "job_id": str(end.job_id),
            "released": released,
        },
    )
    transaction.on_commit(breakers_forget)
    log.info("connector_closed", connector=spec.name, released=released)


def _seen(spec: ConnectorSpec, state: str, probe_at: datetime | None, now: datetime) -> FailureSeen:
    if state == BreakerState.CLOSED:
        return FailureSeen(state=state, wait=0.0)
    wait = spec.probe_wait_seconds
    if state == BreakerState.OPEN and probe_at is not None:
        wait = max(0.0, (probe_at - now).total_seconds())
    return FailureSeen(state=state, wait=wait + random.uniform(0, spec.jitter_seconds))


def connector_probe_release(*, gate: Gate, job_id: uuid.UUID | str) -> None:
    """After a probe's run, whatever its end: if the breaker still names this job as its
    probe (it was cancelled, failed for another reason, lost its lock), forget it, so
    that the next job that comes due probes. A no-op once its success closed the
    breaker or its failure opened it again."""
    if gate.connector is None or not gate.probe:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["connector_probe_release"], {"name": gate.connector.name, "job_id": job_id}
        )
        released = cursor.fetchone() is not None
    if released:
        breakers_forget()


# --- operators ------------------------------------------------------------------------


def _checked(name: str, reason: str) -> tuple[ConnectorSpec, str]:
    spec = get_connector(name) if isinstance(name, str) else None
    if spec is None:
        # A connector with providers has a breaker per provider, not one of its own.
        providers = connector_providers(name) if isinstance(name, str) else ()
        hint = f" (its providers' breakers: {', '.join(p.name for p in providers)})"
        raise ConnectorNotFoundError(
            f"no connector {name!r}{hint if providers else ''}", details={"connector": str(name)}
        )
    reason = control_reason(reason, error=ConnectorControlInputError)
    return spec, reason


def connector_open(*, name: str, reason: str, actor: Actor, user: Any = None) -> bool:
    """An operator opens `name`'s breaker: its jobs stop starting (each claimed one is
    deferred to the probe time), and after the connector's cool-down one job probes,
    as after an opening of its own. True when it was not open; False when it was
    (nothing written: the first opening and its probe time stand)."""
    spec, reason = _checked(name, reason)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["connector_ensure"], {"name": spec.name})
            cursor.execute(
                QUERIES["connector_open"],
                {
                    "name": spec.name,
                    "cooldown": spec.cooldown_seconds,
                    "user_id": getattr(user, "pk", None),
                    "reason": reason,
                },
            )
            row = cursor.fetchone()
        if row is not None:
            _audit(
                spec.name, OPENED_EVENT, actor, {"from": row[0], "manual": True, "reason": reason}
            )
    breakers_forget()
    return row is not None


def connector_close(*, name: str, reason: str, actor: Actor, user: Any = None) -> bool:
    """An operator closes `name`'s breaker (the connector works again): its jobs start
    again, those it deferred within the connector's jitter (not all in one second).
    True when it was not closed; False when it was (nothing written)."""
    spec, reason = _checked(name, reason)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                QUERIES["connector_close"],
                {"name": spec.name, "user_id": getattr(user, "pk", None), "reason": reason},
            )
            row = cursor.fetchone()
        if row is not None:
            released = _release_jobs(spec)
            _audit(
                spec.name,
                CLOSED_EVENT,
                actor,
                {"from": row[0], "manual": True, "reason": reason, "released": released},
            )
    breakers_forget()
    return row is not None


# --- helpers --------------------------------------------------------------------------


def connector_of(job_type: str) -> ConnectorSpec | None:
    """The breaker of the connector a job type names; None for no connector, and for one
    with providers (its job's gate chooses the provider: `Gate.connector`)."""
    spec = all_types().get(job_type)
    return get_connector(spec.connector) if spec is not None and spec.connector else None


def _release_jobs(spec: ConnectorSpec) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["connector_jobs_release"],
            {"types": list(spec.types), "jitter": spec.jitter_seconds},
        )
        return int(cursor.fetchone()[0])


def _audit(name: str, event: str, actor: Actor, data: dict[str, Any]) -> None:
    """One entry on the ops chain, in the caller's transaction (as queue_paused)."""
    audit_append(chain=OPS_CHAIN, event_type=event, actor=actor, data={"connector": name, **data})
