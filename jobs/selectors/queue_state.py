"""Queues and connectors as an operator or a consumer sees them
(docs/operator-controls.md#queue-state, docs/connectors.md): counts, pauses and breakers,
never job contents; and GET /api/v1/queues's answer, memoised per process."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

from jobs.domain.types import all_connectors, primary_queue_names
from jobs.integrations.backpressure import queue_depth_cached
from jobs.models import BreakerState, ConnectorBreaker, QueuePause
from jobs.queries import QUERIES


@dataclass(frozen=True)
class QueueState:
    """One queue as an operator or a consumer sees it: no job contents."""

    name: str
    pending: int
    queued: int
    oldest_pending_age_seconds: float | None
    paused: bool
    paused_at: datetime | None = None
    paused_by: str | None = None
    reason: str | None = None


def queue_pauses() -> dict[str, QueuePause]:
    """The paused queues, by name (a handful of rows at most)."""
    return {p.queue: p for p in QueuePause.objects.select_related("paused_by")}


def queues_state() -> list[QueueState]:
    """Every configured queue (and any other that has unfinished jobs), in table order:
    pending and queued counts and the oldest pending job's age (queues_state,
    jobs_unfinished_idx), and its pause."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["queues_state"])
        counts = {row[0]: row[1:] for row in cursor.fetchall()}
    pauses = queue_pauses()
    names = list(dict.fromkeys([*primary_queue_names(), *sorted(counts)]))
    states = []
    for name in names:
        pending, age, queued = counts.get(name, (0, None, 0))
        pause = pauses.get(name)
        states.append(
            QueueState(
                name=name,
                pending=pending,
                queued=queued,
                oldest_pending_age_seconds=None if age is None else round(float(age), 3),
                paused=pause is not None,
                paused_at=pause.paused_at if pause else None,
                paused_by=pause.paused_by.get_username() if pause and pause.paused_by else None,
                reason=pause.reason if pause else None,
            )
        )
    return states


# GET /api/v1/queues answers from this process's memory for this long: pollers in a
# loop cost one grouped count per process per interval, not one per request.
QUEUES_CACHE_SECONDS = 2.0
# What a consumer is told to wait while a queue is paused: creation still answers
# 201, but nothing of the queue runs until an operator resumes it.
PAUSED_RETRY_AFTER_SECONDS = 60
_queues_memo: dict[str, tuple[float, list[dict[str, Any]]]] = {}


def queues_for_consumers() -> list[dict[str, Any]]:
    """Each queue as GET /api/v1/queues shows it (docs/operator-controls.md#queue-state):
    `name`, `depth` (its pending jobs plus the messages RabbitMQ holds for it: the
    broker depth the dispatcher caches for backpressure, or its queued jobs when that
    is unknown), `paused`, `oldest_pending_age_seconds`, `retry_after_seconds` (0: it
    takes work now; the depth cache's TTL when it is over its backpressure limit, so a
    create would be refused 429; PAUSED_RETRY_AFTER_SECONDS while paused). No job
    contents. Memoised per process for QUEUES_CACHE_SECONDS."""
    memo = _queues_memo.get("all")
    if memo is not None and time.monotonic() < memo[0]:
        return memo[1]
    rows = []
    for state in queues_state():
        cached = queue_depth_cached(state.name)
        # Without a broker the cached depth counts the pending and queued jobs themselves
        # (jobs.integrations.backpressure.queue_depths_read_database), not messages beside them.
        in_broker = cached if settings.JOBOPS_BROKER else None
        depth = state.pending + (state.queued if in_broker is None else in_broker)
        limit = settings.JOBOPS_QUEUE_DEPTH_LIMITS.get(state.name)
        retry_after = 0
        if state.paused:
            retry_after = PAUSED_RETRY_AFTER_SECONDS
        elif limit is not None and cached is not None and cached > limit:
            retry_after = settings.JOBOPS_QUEUE_DEPTH_TTL
        rows.append(
            {
                "name": state.name,
                "depth": depth,
                "paused": state.paused,
                "oldest_pending_age_seconds": state.oldest_pending_age_seconds,
                "retry_after_seconds": retry_after,
            }
        )
    _queues_memo["all"] = (time.monotonic() + QUEUES_CACHE_SECONDS, rows)
    return rows


def queues_for_consumers_forget() -> None:
    """Forget the memoised answer (tests, and this process's own pause or resume)."""
    _queues_memo.clear()


def paused_queues_detail() -> dict[str, Any]:
    """What /readyz adds to its detail (settings.JOBOPS_READY_DETAIL): the paused
    queues' names and since when. Not the reasons: /readyz answers anyone."""
    return {
        "paused_queues": [
            {"queue": p.queue, "paused_at": p.paused_at.isoformat()}
            for p in QueuePause.objects.order_by("queue")
        ]
    }


@dataclass(frozen=True)
class ConnectorState:
    """One connector's breaker as an operator or a consumer sees it (docs/connectors.md):
    no address, no credentials, no job contents."""

    name: str
    state: str
    failures: int
    last_error_code: str | None
    opened_at: datetime | None
    # When a job may probe it (open), or when the running probe started (half-open).
    next_probe_at: datetime | None
    probe_started_at: datetime | None
    job_types: tuple[str, ...]
    failure_threshold: int
    cooldown_seconds: float
    # An operator opened or closed it last (else the breaker itself); who and why are
    # for operators only (`changed_by`, `reason`).
    manual: bool
    changed_at: datetime | None
    changed_by: str | None
    reason: str


def connectors_state() -> list[ConnectorState]:
    """Every connector a job type names, in name order, with its breaker (a connector
    without a row is closed with no failures): one read of connector_breakers."""
    rows = {b.name: b for b in ConnectorBreaker.objects.select_related("changed_by")}
    states = []
    for name, spec in all_connectors().items():
        row = rows.get(name)
        states.append(
            ConnectorState(
                name=name,
                state=row.state if row else BreakerState.CLOSED,
                failures=row.failures if row else 0,
                last_error_code=row.last_error_code if row else None,
                opened_at=row.opened_at if row else None,
                next_probe_at=row.probe_at if row else None,
                probe_started_at=row.probe_started_at if row else None,
                job_types=spec.types,
                failure_threshold=spec.failures,
                cooldown_seconds=spec.cooldown_seconds,
                manual=bool(row and row.reason),
                changed_at=row.changed_at if row else None,
                changed_by=row.changed_by.get_username() if row and row.changed_by else None,
                reason=row.reason if row else "",
            )
        )
    return states
