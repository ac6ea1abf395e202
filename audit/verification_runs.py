"""Where verification runs are recorded, and the dispatcher's schedule for them
(docs/operations/audit-archives.md#incremental-verification).

A run of `verify_audit_chain --record` (the dispatcher's, cron's, or an operator's)
appends one `audit_verified` entry to the ops chain: its mode (full or incremental), the
range it proved, its result, duration and time. The record is itself in the hash chain,
so the next verification proves it; the dashboard tile and the
`audit_verification_last_success_timestamp_seconds` gauge read the newest of each mode.

The dispatcher step `audit_verify_due` starts each mode as its own process (the full walk
of a year takes most of an hour; an incremental run of a day some seconds) when its
interval has passed since the newest recorded run of that mode, and never blocks its
loop: it only looks whether the child it started has ended.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from audit.services import OPS_CHAIN, Actor, audit_append
from audit.verification import VerificationReport

log = structlog.get_logger("audit.verification_runs")

VERIFIED_EVENT = "audit_verified"
FULL = "full"
INCREMENTAL = "incremental"
MODES = (FULL, INCREMENTAL)
# The dashboard warns, and JobopsAuditFullVerificationStale fires, past this age.
FULL_STALE_AFTER = timedelta(days=8)

_LAST_RUN_SQL = """
SELECT payload::jsonb -> 'data', ts FROM audit_logs
WHERE chain = %(chain)s AND event_type = %(event)s
  AND payload::jsonb #>> '{data,mode}' = %(mode)s
  AND (NOT %(ok_only)s OR (payload::jsonb #>> '{data,ok}')::boolean)
ORDER BY seq DESC LIMIT 1
"""


def record_run(
    *, mode: str, report: VerificationReport, range_text: str, started_at: datetime
) -> None:
    """Append the run's `audit_verified` entry to the ops chain (its own transaction)."""
    data = {
        "mode": mode,
        "ok": report.ok,
        "problems": report.problems_total,
        "range": range_text,
        "rows": report.rows_checked,
        "checkpoints": report.checkpoints_checked,
        "seconds": round(report.seconds, 3),
        "started_at": started_at.isoformat(),
    }
    with transaction.atomic():
        audit_append(
            chain=OPS_CHAIN,
            event_type=VERIFIED_EVENT,
            actor=Actor.system("verify_audit_chain"),
            data=data,
        )


def last_run(mode: str, *, ok_only: bool = False) -> dict[str, Any] | None:
    """The newest recorded run of `mode`: its data and `at` (when it was recorded)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _LAST_RUN_SQL,
            {"chain": OPS_CHAIN, "event": VERIFIED_EVENT, "mode": mode, "ok_only": ok_only},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    # Django's connection hands jsonb over as text.
    data = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    data = data if isinstance(data, dict) else {}
    started = data.get("started_at")
    return {**data, "at": row[1], "started_at": parse_datetime(started) if started else None}


def audit_verification_successes() -> dict[str, float]:
    """The Unix time of the newest run of each mode that found the trail intact (0:
    none), for the audit_verification_last_success_timestamp_seconds gauge."""
    found = {mode: last_run(mode, ok_only=True) for mode in MODES}
    return {mode: run["at"].timestamp() if run else 0.0 for mode, run in found.items()}


def verification_tile() -> dict[str, Any]:
    """The dashboard tile: the last run of each mode, where runs are recorded, and
    whether the full walk is stale (older than FULL_STALE_AFTER, or never ran)."""
    runs = {mode: last_run(mode) for mode in MODES}
    full = runs[FULL]
    stale = full is None or timezone.now() - full["at"] > FULL_STALE_AFTER
    return {
        **runs,
        "runs": [{"mode": mode, "run": runs[mode]} for mode in (INCREMENTAL, FULL)],
        "full_stale": stale,
        "recorded_in": f"ops chain, event {VERIFIED_EVENT}",
    }


# The children this process started, by mode (the dispatcher is one process), and when:
# a run that ends without a record (a usage error) is not started again for an hour.
_children: dict[str, subprocess.Popen[bytes]] = {}
_started: dict[str, datetime] = {}
RETRY_AFTER = timedelta(hours=1)


def _interval(mode: str) -> timedelta:
    if mode == FULL:
        return settings.AUDIT_VERIFY_FULL_EVERY
    return settings.AUDIT_VERIFY_INCREMENTAL_EVERY


def _command(mode: str) -> list[str]:
    manage = Path(settings.BASE_DIR) / "manage.py"
    command = [sys.executable, str(manage), "verify_audit_chain", "--record"]
    if mode == INCREMENTAL:
        command.append("--since-checkpoint")
    return command


def audit_verify_due() -> dict[str, Any]:
    """The dispatcher step: start each mode whose interval has passed since its newest
    recorded run, as a child process; return what it started or found running.

    An incremental run needs a trusted start: without AUDIT_CHECKPOINT_EXPORT it is not
    started (give the hash by hand, or export the checkpoints). Two dispatchers may each
    start one; both records are correct, the second merely redundant.
    """
    result: dict[str, Any] = {}
    now = timezone.now()
    for mode in MODES:
        every = _interval(mode)
        if not every:
            continue
        child = _children.get(mode)
        if child is not None:
            if child.poll() is None:
                result[mode] = "running"
                continue
            del _children[mode]
            if child.returncode not in (0, 1):
                log.error("audit_verify_failed_to_run", mode=mode, returncode=child.returncode)
        if mode == INCREMENTAL and not settings.AUDIT_CHECKPOINT_EXPORT:
            continue
        last = last_run(mode)
        if last is not None and now - last["at"] < every:
            continue
        if mode in _started and now - _started[mode] < min(every, RETRY_AFTER):
            continue
        _started[mode] = now
        _children[mode] = subprocess.Popen(  # our own command, no shell
            _command(mode), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        log.info("audit_verify_started", mode=mode, pid=_children[mode].pid)
        result[mode] = "started"
    return result
