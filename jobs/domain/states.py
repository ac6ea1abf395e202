"""The job state machine of docs/architecture.md#states-and-transitions, as data.

`ALLOWED` maps each target state to the states it may be entered from. Every
service that changes a job's status goes through `jobs.services.transition`,
which refuses anything not listed here before it touches the database.
"""

from __future__ import annotations

from django.db import models


class Status(models.TextChoices):
    # Created with a future run_at (docs/operator-controls.md#scheduled-jobs): waits in
    # the database until the dispatcher's schedule step moves it to `pending` when due.
    SCHEDULED = "scheduled"
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Not yet ended: what a cancel, a failure or the reaper may still move.
_UNFINISHED = frozenset({Status.RUNNING, Status.PENDING, Status.QUEUED, Status.RETRYING})

ALLOWED: dict[str, frozenset[str]] = {
    # publisher on confirm; dispatcher on confirm of a due retry
    Status.QUEUED: frozenset({Status.PENDING, Status.RETRYING}),
    # claim: a message can arrive before the publisher committed `queued`
    Status.RUNNING: frozenset({Status.PENDING, Status.QUEUED, Status.RETRYING}),
    Status.SUCCEEDED: frozenset({Status.RUNNING}),
    # worker, reaper, dead-letter watcher
    Status.FAILED: _UNFINISHED,
    # worker (JobCancelled) or cancel before start (a scheduled job too, before it is due)
    Status.CANCELLED: _UNFINISHED | {Status.SCHEDULED},
    # worker retry or reaper reclaim
    Status.RETRYING: frozenset({Status.RUNNING}),
    # DLQ replay or re-run by an operator; a hold (jobs.services.holds): a worker hands
    # back a queued job it may not run now (its organisation is suspended), without
    # spending an attempt, and the dispatcher publishes it again once it may run; a
    # scheduled job come due (the dispatcher's schedule step, audited `due`)
    Status.PENDING: frozenset({Status.FAILED, Status.QUEUED, Status.SCHEDULED}),
}

TERMINAL: frozenset[str] = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})

# Audit event written for each target state (docs/architecture.md#audit-events).
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
# (progress, cancel_requested, dead_lettered, dlq_discarded, rerun) change no status.
STATUS_AFTER_EVENT: dict[str, str] = {
    **{event: status for status, event in EVENT_FOR_STATUS.items()},
    "reclaimed": Status.RETRYING,
    # a claimed job of a connector whose breaker is open waits for its probe, its
    # attempt given back (jobs.services.connectors)
    "deferred": Status.RETRYING,
    "dlq_replayed": Status.PENDING,
    "held": Status.PENDING,
    # A scheduled job come due. A scheduled job's `created` entry says to=scheduled:
    # the verifier reads a `created` entry's `to` (jobs/queries.sql status_against_chain).
    "due": Status.PENDING,
    # the owner's retry of a failed job (POST /api/v1/jobs/{id}/retry), and an
    # operator's fix-forward (a replay with edited params): both failed -> pending
    "retried": Status.PENDING,
    "dlq_fixed_forward": Status.PENDING,
}

# The audit event of a scheduled job moved to `pending` when its run_at came.
DUE_EVENT = "due"
