"""A job's events as its audit chain and row tell them: what the event stream
(`GET /api/v1/jobs/{id}/events`, jobs/api/stream.py) sends.

The outbox's events are built by SQL at the moment of each change (jobs_status_event,
jobs_progress_event in jobs/sql/10_entries.sql) from the row after the change. A stream
that resumes later has no such row: it reads the job's audit entries after a seq and
builds each event from the entry (its seq, time, from, to, attempt, percent, step) and
the job's row (its type, organisation, project, request), with the fields of the outbox
event (`EVENT_FIELDS`, `PROGRESS_EVENT_FIELDS`) minus `event_id`, a random id of the
outbox row that the stream replaces with the seq (its SSE `id:`). Values the entry does
not record are read from the row when the entry is the chain's newest of its kind (a
live stream sees each change within a second: then always), else as the chain last
said them: a status event's `progress` is the percent of the last progress or claim
before it; a progress event's `message` is not audited and is null for a progress
entry that a later one replaced. tests/jobs/test_job_stream.py holds a live stream's
bodies equal to the outbox's.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection

from audit.services import format_ts, job_chain
from jobs.domain.states import TERMINAL
from jobs.selectors.representation import EVENT_FIELDS

STATUS_CHANGED = "job.status.changed"
PROGRESS = "job.progress"
# The fields of a job.progress event, in the order jobs_progress_event builds them (a
# `metrics` mapping follows when the write carried one).
PROGRESS_EVENT_FIELDS = (
    "type",
    "job_id",
    "job_type",
    "seq",
    "status",
    "progress",
    "attempt",
    "timestamp",
    "request_id",
    "correlation_id",
    "org_id",
    "project_id",
)
# The entries that reset or set the percent a later status event reports.
_CLAIMS = frozenset({"started"})

_JOB = """
SELECT type, status, audit_seq, progress_percent, progress_step, progress_message,
       attempts, request_id, correlation_id, org_id, project_id
FROM jobs WHERE id = %(job_id)s
"""
# The entries after a seq, up to the row's head (read first: every entry up to it has
# committed with it, so a poll never skips one that commits later), by (chain, seq).
_ENTRIES = """
SELECT seq, event_type, ts, payload FROM audit_logs
WHERE chain = %(chain)s AND seq > %(after)s AND seq <= %(head)s
ORDER BY seq LIMIT %(limit)s
"""
# The percent the chain last said at or before a seq (a resumed stream's first poll).
_PERCENT_AT = """
SELECT event_type, payload FROM audit_logs
WHERE chain = %(chain)s AND seq <= %(seq)s AND event_type IN ('progress', 'started')
ORDER BY seq DESC LIMIT 1
"""


@dataclass(frozen=True)
class StreamJob:
    """The job's row as a poll read it."""

    id: str
    type: str
    status: str
    audit_seq: int
    progress_percent: int
    progress_step: str | None
    progress_message: str | None
    attempts: int
    request_id: str | None
    correlation_id: str | None
    org_id: int | None
    project_id: int | None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL


@dataclass
class EventCursor:
    """Where a stream stands in a job's chain: the last seq it sent, and the percent the
    chain said there (None: not read yet)."""

    job_id: uuid.UUID
    last: int = 0
    percent: int | None = None


@dataclass(frozen=True)
class Poll:
    """One poll's result: the job's row (None: it is gone, purged) and the events after
    the cursor, each (seq, type, body), in seq order."""

    job: StreamJob | None
    events: list[tuple[int, str, dict[str, Any]]]


def job_events_poll(*, cursor: EventCursor, limit: int = 500) -> Poll:
    """Read the job's row, then its entries after `cursor.last` up to the row's head
    (at most `limit`), and build their events; moves the cursor past every entry read
    (an entry that is no event, e.g. `cancel_requested`, is passed over). Three short
    statements at most, on the caller's connection."""
    with connection.cursor() as db:
        db.execute(_JOB, {"job_id": cursor.job_id})
        row = db.fetchone()
        if row is None:
            return Poll(job=None, events=[])
        job = StreamJob(str(cursor.job_id), *row)
        chain = job_chain(cursor.job_id)
        if cursor.percent is None:
            cursor.percent = 0
            if cursor.last > 0:
                db.execute(_PERCENT_AT, {"chain": chain, "seq": cursor.last})
                found = db.fetchone()
                if found is not None:
                    cursor.percent = _percent_after(found[0], _data(found[1]), cursor.percent)
        db.execute(
            _ENTRIES, {"chain": chain, "after": cursor.last, "head": job.audit_seq, "limit": limit}
        )
        entries = db.fetchall()
    events: list[tuple[int, str, dict[str, Any]]] = []
    for seq, kind, ts, payload in entries:
        data = _data(payload)
        cursor.percent = _percent_after(kind, data, cursor.percent)
        event = entry_event(
            job=job,
            seq=seq,
            kind=kind,
            ts=format_ts(ts),
            data=data,
            percent=cursor.percent,
            newest=seq == job.audit_seq,
        )
        cursor.last = seq
        if event is not None:
            events.append((seq, event["type"], event))
    return Poll(job=job, events=events)


def entry_event(
    *,
    job: StreamJob,
    seq: int,
    kind: str,
    ts: str,
    data: dict[str, Any],
    percent: int,
    newest: bool,
) -> dict[str, Any] | None:
    """The event body of one entry (None for an entry that is no event), as the outbox
    holds it without its `event_id`. `newest`: no later entry changed the job, so the
    row's progress is this entry's."""
    identity = {
        "request_id": job.request_id,
        "correlation_id": job.correlation_id,
        "org_id": job.org_id,
        "project_id": job.project_id,
    }
    if kind == "progress":
        body = {
            "type": PROGRESS,
            "job_id": job.id,
            "job_type": job.type,
            "seq": seq,
            "status": "running",  # a progress write is the running lock holder's
            "progress": {
                "percent": data.get("percent", percent),
                "step": data.get("step"),
                "message": job.progress_message if newest else None,
            },
            "attempt": data.get("attempt"),
            "timestamp": ts,
            **identity,
        }
        if isinstance(data.get("metrics"), dict):
            body["metrics"] = data["metrics"]
        return body
    if not isinstance(data.get("to"), str):
        return None
    body = {
        "type": STATUS_CHANGED,
        "job_id": job.id,
        "job_type": job.type,
        "seq": seq,
        "status": data["to"],
        "previous_status": data.get("from"),
        "progress": job.progress_percent if newest else percent,
        "attempt": data.get("attempt"),
        "timestamp": ts,
        **identity,
    }
    return body


def _percent_after(kind: str, data: dict[str, Any], percent: int) -> int:
    """The percent the chain says after an entry: a claim starts from zero, a progress
    write says it, a success is 100; anything else keeps it."""
    if kind in _CLAIMS:
        return 0
    if kind == "progress" and isinstance(data.get("percent"), int):
        return int(data["percent"])
    if data.get("to") == "succeeded":
        return 100
    return percent


def _data(payload: str) -> dict[str, Any]:
    try:
        data = json.loads(payload).get("data") or {}
    except (ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}


# The two bodies' fields, for the test that holds them to the outbox's.
STREAM_FIELDS = {
    STATUS_CHANGED: tuple(f for f in EVENT_FIELDS if f != "event_id"),
    PROGRESS: PROGRESS_EVENT_FIELDS,
}
