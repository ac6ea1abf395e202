"""Stragglers: jobs that keep an audit partition from being archived and detached
(docs/operations/retention.md#stragglers).

A job partition (audit_logs_job_YYYY_MM: every chain of the jobs created that month)
may go once every job of it is purged. Its retention ends when the month's last job
could have been purged: the month's end plus the longest retention of any job type. A
job still in the database AUDIT_STRAGGLER_DAYS after that is a straggler: an open dead
letter, a live idempotency key, an undecided fix-forward edit, a job that never ended or
ended late. The dashboard lists them with the partition each holds and why, for an
operator's decision: discard the dead letter (the dead letter's page), or force-purge
the job (`manage.py purge --force-job ID`, audited).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from audit.partitions import LEGACY_PART, partition_name
from jobs.domain.types import all_types
from jobs.queries import QUERIES

# Stragglers the dashboard names (the count covers all of them).
STRAGGLERS_LISTED = 20
ENDED = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Straggler:
    job_id: str
    job_type: str
    partition: str
    reason: str


def stragglers_before(now: datetime | None = None) -> datetime:
    """Jobs created before this instant hold a partition whose retention (its month's
    end plus the longest retention) ended AUDIT_STRAGGLER_DAYS ago or more: the first
    instant of the month of now - longest retention - the grace."""
    now = now or timezone.now()
    longest = max((t.retention for t in all_types().values()), default=timedelta(0))
    limit = now - longest - timedelta(days=settings.AUDIT_STRAGGLER_DAYS)
    return limit.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _reason(row: tuple[Any, ...], now: datetime) -> str:
    _, _, _, status, _, _, updated_at, key_expires, letters, held, secs = row
    if status not in ENDED:
        return f"not ended: {status} (cancel it, or let it finish)"
    if letters:
        named = ", ".join(str(d) for d in letters)
        return f"open dead letter {named}: discard or replay it"
    if held:
        return "a fix-forward edit waits for a decision: reject it on its dead letter's page"
    if key_expires is not None and key_expires > now:
        return f"its idempotency key is live until {key_expires:%Y-%m-%d}"
    if secs is None:
        return "its type is no longer configured: the purge never takes it"
    until = updated_at + timedelta(seconds=secs)
    if until > now:
        return f"ended {updated_at:%Y-%m-%d}: its retention runs until {until:%Y-%m-%d}"
    return "due: the next purge takes it"


def audit_stragglers(*, limit: int = STRAGGLERS_LISTED) -> dict[str, Any]:
    """{"total": n, "stragglers": [Straggler, ...]} (the oldest `limit`)."""
    now = timezone.now()
    types = all_types()
    params: dict[str, Any] = {
        "types": list(types),
        "keep": [t.retention.total_seconds() for t in types.values()],
        "before": stragglers_before(now),
        "limit": limit,
    }
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["audit_stragglers"], params)
        rows = cursor.fetchall()
    return {
        "total": rows[0][0] if rows else 0,
        "stragglers": [
            Straggler(
                job_id=row[1],
                job_type=row[2],
                partition=partition_name(row[4] if row[4] > LEGACY_PART else LEGACY_PART),
                reason=_reason(row, now),
            )
            for row in rows
        ],
    }


def straggler_lines(found: dict[str, Any]) -> list[str]:
    """One line per straggler for the dashboard's problems, then how many more."""
    lines = [
        f"job {s.job_id} ({s.job_type}) holds audit partition {s.partition}: {s.reason}; "
        f"or force-purge it (manage.py purge --force-job {s.job_id})"
        for s in found["stragglers"]
    ]
    more = found["total"] - len(found["stragglers"])
    if more > 0:
        lines.append(f"and {more} more jobs hold audit partitions past their retention")
    return lines
