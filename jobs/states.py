"""The job state machine of DESIGN.md 3.4, as data.

`ALLOWED` maps each target state to the states it may be entered from. Every
service that changes a job's status goes through `jobs.services.transition`,
which refuses anything not listed here before it touches the database.
"""

from __future__ import annotations

from django.db import models


class Status(models.TextChoices):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


P, Q, R, RT = Status.PENDING, Status.QUEUED, Status.RUNNING, Status.RETRYING

ALLOWED: dict[str, frozenset[str]] = {
    # publisher on confirm; dispatcher on confirm of a due retry
    Status.QUEUED: frozenset({P, RT}),
    # claim: a message can arrive before the publisher committed `queued`
    Status.RUNNING: frozenset({P, Q, RT}),
    Status.SUCCEEDED: frozenset({R}),
    # worker, reaper, dead-letter watcher
    Status.FAILED: frozenset({R, P, Q, RT}),
    # worker (JobCancelled) or cancel before start
    Status.CANCELLED: frozenset({R, P, Q, RT}),
    # worker retry or reaper reclaim
    Status.RETRYING: frozenset({R}),
    # DLQ replay or re-run by an operator
    Status.PENDING: frozenset({Status.FAILED}),
}

TERMINAL: frozenset[str] = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})
ACTIVE: frozenset[str] = frozenset({P, Q, R, RT})

# Audit event written for each target state (DESIGN.md 5 "Events").
EVENT_FOR_STATUS: dict[str, str] = {
    Status.PENDING: "created",
    Status.QUEUED: "queued",
    Status.RUNNING: "started",
    Status.RETRYING: "retrying",
    Status.SUCCEEDED: "succeeded",
    Status.FAILED: "failed",
    Status.CANCELLED: "cancelled",
}


# The status each state-changing audit event leaves the job in; events not listed
# (progress, cancel_requested, dead_lettered, dlq_discarded) change no status.
STATUS_AFTER_EVENT: dict[str, str] = {
    **{event: status for status, event in EVENT_FOR_STATUS.items()},
    "reclaimed": Status.RETRYING,
    "dlq_replayed": Status.PENDING,
}


def is_allowed(source: str, target: str) -> bool:
    return source in ALLOWED.get(target, frozenset())
