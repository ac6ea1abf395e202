"""The lock order of every dead-letter writer: the jobs, then their dead letters.

A job and its dead letter change together (a job fails with its row; a replay moves
the job and closes the row), so every writer takes the job rows first and the
dead-letter rows second, each in id order: two writers then wait for one another
instead of deadlocking (docs/architecture.md#dead-letters). The watcher's
reconciliation, replay and discard all lock through here; a job failing with its
dead letter locks its job by the transition's compare-and-set before the insert.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jobs.models import DeadLetter, DeadLetterState, Job

# What a writer reads of a locked dead letter: never the stored headers and x-death,
# which no decision needs and which can be large.
ROW_FIELDS = ("id", "job_id", "reason", "queue", "message_id", "broker_copy")


@dataclass(frozen=True)
class Locked:
    """The rows a writer holds: its jobs by id, then the open dead letters it asked for."""

    jobs: dict[uuid.UUID, Job]
    open_rows: list[DeadLetter]


def lock_jobs_then_open_rows(
    *,
    job_ids: Iterable[uuid.UUID | None],
    job_fields: Sequence[str] = ("id",),
    dead_letter_ids: Iterable[int] | None = None,
    of_jobs: bool = False,
) -> Locked:
    """Lock `job_ids` (their `job_fields` loaded; None ids are skipped), then the open
    dead letters among `dead_letter_ids`, or with `of_jobs` the open rows of those jobs;
    neither: the jobs alone. The caller holds the transaction."""
    wanted = [job_id for job_id in job_ids if job_id is not None]
    jobs = {
        job.id: job
        for job in Job.objects.select_for_update()
        .filter(id__in=wanted)
        .order_by("id")
        .only(*job_fields)
    }
    rows = DeadLetter.objects.select_for_update().filter(state=DeadLetterState.OPEN)
    if dead_letter_ids is not None:
        rows = rows.filter(id__in=list(dead_letter_ids))
    elif of_jobs:
        rows = rows.filter(job_id__in=list(jobs))
    else:
        return Locked(jobs=jobs, open_rows=[])
    return Locked(jobs=jobs, open_rows=list(rows.order_by("id").only(*ROW_FIELDS)))
