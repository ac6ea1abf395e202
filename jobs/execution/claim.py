"""The claimer of a Celery threads-pool worker: the claims of the deliveries its threads
start together, made in one statement per organisation
(docs/architecture.md#claim-heartbeat-reaper: claims under the threads pool).

Each task thread hands the claimer its message's job and organisation
(`Claimer.claim`) and waits for its answer: the claimed `Job`, or None when the job was
not claimable (the caller reads why, as after a claim of its own). The claimer's thread
takes the first request and every request already queued behind it (no window: a lone
delivery's claim waits for nothing more than the hand-over; at most the pool's
concurrency, since no more threads can be waiting), groups them by organisation and lock
holder, and claims each group with one `jobs.services.jobs_claim_delivered` call: one
statement and one transaction, each job with its own `started` entry on its own chain.
An id named twice in a batch (a message delivered twice) is claimed for its first
caller; the others are answered None, as a duplicate is. A group the database refuses
(unreachable) answers each of its callers with the error, which hands their messages
back as a failed claim of their own would; the other groups are unaffected.

Only deliveries that are starting now are claimed, the horizon of run_worker's
claim-ahead rule (jobs.processes.executor: jobs expected to start soon) at its nearest:
a claimed job runs at once in the thread that asked, whose run the process's heartbeat
loop keeps alive from its claim. The messages Celery has prefetched but no thread has
started are not claimed ahead: a claimed job is `running`, its lock would need a
heartbeat through its whole wait in Celery's queue, behind jobs of any length, and a
worker killed then would hold every such job until the reaper takes it over
(JOBOPS_LOCK_TIMEOUT), where an unclaimed message is simply redelivered at once.
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

import structlog

from jobs.execution.batches import Answer, BatchThread, Pending, answer_all, fail_all
from jobs.models import Job
from jobs.services import jobs_claim_delivered

_log = structlog.get_logger("jobs.execution")


class Claim(NamedTuple):
    """One delivery's claim: its message's job and organisation, and the lock holder."""

    job_id: uuid.UUID
    org_id: int
    locked_by: str


class Claimer(BatchThread[Claim, Job]):
    """A process's claimer thread (see the module docstring); `batch`: the pool's
    concurrency. The thread (jobs.execution.batches.BatchThread) starts on first use in
    a process."""

    name = "claimer"

    def claim(self, *, job_id: uuid.UUID, org_id: int, locked_by: str) -> Job | None:
        """Claim `job_id` for `locked_by` if it is a claimable job of `org_id`
        (jobs.services.job_claim's rule), with the claims queued beside it; the claimed
        job, or None. Raises what its group's claim raised (nothing was claimed)."""
        return self.call(Claim(job_id, org_id, locked_by))

    def _serve(self, window: list[Pending[Claim, Job]]) -> None:
        groups: dict[tuple[int, str], list[tuple[uuid.UUID, Answer[Job]]]] = {}
        for _, request, answer in window:
            key = (request.org_id, request.locked_by)
            groups.setdefault(key, []).append((request.job_id, answer))
        for (org_id, locked_by), items in groups.items():
            answers = [answer for _, answer in items]
            try:
                claimed = jobs_claim_delivered(
                    job_ids=[job_id for job_id, _ in items], locked_by=locked_by, org_id=org_id
                )
            except Exception as exc:
                _log.error("claims_failed", jobs=len(items), error=repr(exc))
                fail_all(answers, exc)
                continue
            # Each claimed job to the first caller that named it (pop): a second
            # delivery of the same job is a duplicate, answered None.
            answer_all(answers, [claimed.pop(job_id, None) for job_id, _ in items])
