"""Scheduled jobs (docs/operator-controls.md#scheduled-jobs): a job created with a
future `run_at` waits `scheduled` in the database, and the dispatcher's `scheduled`
step moves it to `pending` once due (audited `due`; the statement NOTIFYs jobs_pending,
so the publisher takes it at once). No broker-side delay: Celery's ETA holds messages
in worker memory and does not work on quorum queues, and the database survives
restarts.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from audit.services import Actor
from jobs.queries import QUERIES
from jobs.services.transitions import change, moved

SCHEDULER = Actor.system("scheduler")
# Jobs moved per transaction: one jobs_promote_due statement each batch.
PROMOTE_BATCH = 500
# The longest the dispatcher sleeps before it looks again, whatever the next run_at: a
# job scheduled meanwhile by another host is seen within this (its creation's NOTIFY
# wakes only the publisher's listen, not this step's clock).
MAX_WAKE_SECONDS = 1.0


def promote_due_jobs(*, now: datetime | None = None, limit: int = PROMOTE_BATCH) -> int:
    """Move one batch of scheduled jobs whose run_at has come to `pending`, each audited
    `due`, in one transaction: the rows are taken FOR UPDATE SKIP LOCKED (two
    dispatchers never move the same job) and the transition's compare-and-set refuses a
    job cancelled meanwhile. Returns how many moved."""
    now = now or timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["due_scheduled_jobs"], {"now": now, "limit": limit})
            ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return 0
        rows = change("jobs_promote_due", job_ids=ids, actor=SCHEDULER)
        promoted = moved("jobs_promote_due", rows)
    return len(promoted)


def next_scheduled_run() -> datetime | None:
    """The earliest run_at of a scheduled job (None: none)."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["next_scheduled_run"])
        row = cursor.fetchone()
    return row[0] if row else None


def promote_due_once() -> dict[str, float | int]:
    """The dispatcher's `scheduled` step: every due batch, then when to look again.

    `wake_in` (seconds, a float so that jobs.processes.dispatcher.found_work does not count it as
    work) tells the loop to run this step again no later than the next run_at, bounded
    by MAX_WAKE_SECONDS: a job due in two minutes starts on time, also after a restart
    (the time is read from the table, not remembered)."""
    promoted = 0
    while True:
        moved = promote_due_jobs()
        promoted += moved
        if moved < PROMOTE_BATCH:
            break
    upcoming = next_scheduled_run()
    wake_in = MAX_WAKE_SECONDS
    if upcoming is not None:
        # At least a few milliseconds: a job due this instant must not spin the loop.
        wake_in = min(wake_in, max(0.02, (upcoming - timezone.now()).total_seconds()))
    return {"promoted": promoted, "wake_in": float(wake_in)}
