"""The reaper (docs/architecture.md): jobs whose worker stopped heartbeating run again.

A `running` job whose lock is older than JOBOPS_LOCK_TIMEOUT moves to `retrying` now
(audit `reclaimed`), or to `failed` with a `worker_lost` dead letter once its attempts
are used up. The stale-lock condition is part of each compare-and-set, so a heartbeat
that lands first wins, and two reapers never both act on one job.
"""

from __future__ import annotations

import uuid

import structlog
from django.conf import settings
from django.db import IntegrityError, connection

from audit.services import Actor
from jobs.domain.exceptions import TransitionRefusedError
from jobs.models import Job
from jobs.queries import QUERIES
from jobs.services.dead_letters import job_fail_with_dead_letter
from jobs.services.transitions import change, moved

log = structlog.get_logger("jobs.reaper")
REAPER = Actor.system("reaper")


def job_reclaim(*, job_id: uuid.UUID | str, lock_timeout: float) -> Job | None:
    """`running` (stale lock) -> `retrying` now, audited `reclaimed`; None if the lock
    turned out live (a heartbeat landed first) or the job moved on."""
    rows = change(
        "jobs_reclaim",
        job_ids=[job_id],
        actor=REAPER,
        data={str(job_id): {"reason": "worker_lost"}},
        stale_after=float(lock_timeout),
        code="WORKER_LOST",
        message="the worker stopped heartbeating; reclaimed",
    )
    reclaimed = moved("jobs_reclaim", rows)
    return reclaimed[0] if reclaimed else None


def job_lock_is_stale(*, job_id: uuid.UUID | str) -> bool:
    """Whether a running job's lock is stale now, by the database clock (as the reaper's
    compare-and-set decides)."""
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["lock_is_stale"],
            {"job_id": job_id, "stale_after": float(settings.JOBOPS_LOCK_TIMEOUT)},
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def reap_once(*, limit: int = 500) -> dict[str, int]:
    """Reclaim or fail every `running` job whose lock went stale; returns the counts."""
    timeout = float(settings.JOBOPS_LOCK_TIMEOUT)
    counts = {"reclaimed": 0, "worker_lost": 0}
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["stale_locks"], {"stale_after": timeout, "limit": limit})
        stale = cursor.fetchall()
    for job_id, attempts, max_attempts in stale:
        if attempts < max_attempts:
            if job_reclaim(job_id=job_id, lock_timeout=timeout) is not None:
                counts["reclaimed"] += 1
                log.warning(
                    "job_reclaimed",
                    job_id=str(job_id),
                    attempt=attempts,
                    outcome="lost",
                    error_code="WORKER_LOST",
                )
            continue
        try:
            job_fail_with_dead_letter(
                job_id=job_id,
                reason="worker_lost",
                actor=REAPER,
                error_code="WORKER_LOST",
                error_message=f"the worker was lost on attempt {attempts} of {max_attempts}",
                stale_after=timeout,
            )
        except TransitionRefusedError:
            continue  # a heartbeat or another reaper got there first
        except IntegrityError:
            # An open dead letter exists already (e.g. recorded by the watcher).
            log.error("reaper_dead_letter_exists", job_id=str(job_id))
            continue
        counts["worker_lost"] += 1
        log.error(
            "job_worker_lost",
            job_id=str(job_id),
            attempt=attempts,
            outcome="failed",
            error_code="WORKER_LOST",
        )
    return counts
