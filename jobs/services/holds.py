"""Holding a job: a worker hands back a queued job it may not run now
(docs/architecture.md#states-and-transitions, docs/tenancy.md#suspension).

A hold is `queued -> pending` with a `held` audit entry naming its reason, written by
the worker that received the job's message (it then acks the message). No attempt is
spent and no lock taken: the claim that found the job held matched no row, so nothing
of the job's run changed. The dispatcher publishes the job again once the reason is
gone (its statements skip held work: jobs/queries.sql due_pending_jobs), as any
pending job. One mechanism for every reason a job may wait without running: today an
organisation's suspension, and a paused queue (jobs.services.queues).
"""

from __future__ import annotations

import uuid

from django.db import models

from audit.services import Actor
from jobs.models import Job
from jobs.services.transitions import change, moved

HELD_EVENT = "held"


class HoldReason(models.TextChoices):
    # The job's organisation is suspended (tenants.models.Organisation.suspended_at).
    ORG_SUSPENDED = "org_suspended"
    # The job's queue is paused (jobs.models.QueuePause, jobs.services.queues).
    QUEUE_PAUSED = "queue_paused"


def job_hold(*, job_id: uuid.UUID | str, reason: str, actor: Actor) -> Job | None:
    """Move a `queued` job back to `pending` without spending an attempt, audited
    `held` with its `reason`; None when the job is no longer queued (a cancel, or
    another delivery's hold, got there first: nothing is written).

    Not conditional on the reason still holding: a job whose message was acked must not
    stay `queued` (nothing would publish it again). Should the organisation be resumed
    meanwhile, the dispatcher simply publishes the job again at once.
    """
    if reason not in HoldReason.values:
        raise ValueError(f"no hold reason {reason!r}; one of {', '.join(HoldReason.values)}")
    rows = change(
        "jobs_hold", job_ids=[job_id], actor=actor, data={str(job_id): {"reason": reason}}
    )
    held = moved("jobs_hold", rows)
    return held[0] if held else None
