"""A job's history for a person, read from its audit chain: the timeline of the job
page (its entries, with who did what and the justifications they audited) and its
attempts (each run's start, end and outcome). Reads only, as the row the page shows
knows them (its chain head `audit_seq`)."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from audit.models import AuditLog
from audit.services import job_chain
from jobs.domain.states import Status
from jobs.models import DeadLetter, Job
from jobs.selectors.annotations import Annotation, job_annotations
from tenants.selectors import actor_labels

# The entries that resolve a dead letter: each carries the digest of its justification.
RESOLVING_EVENTS = ("dlq_replayed", "dlq_discarded")
JUSTIFICATION_MISMATCH = (
    "(the justification stored with the dead letter is not the one this entry audited)"
)


def job_timeline(*, job: Job, visible: QuerySet[Job] | None = None) -> list[dict[str, Any]]:
    """The job's audit trail for a person: each entry with its time, event, who did it
    (tenants.selectors.actor_labels: a username, an operator's or a service account's
    name, or the system part) and what it said. Runs of `progress` entries collapse into
    one (with their count and last value). Only the entries up to the head `job` (the
    row the page shows) knows of: an entry appended since belongs with a newer row, and
    would contradict the status shown beside it. Three queries: the chain, the actors
    it names, the dead letters it names (for the justifications).

    With `visible` (the jobs the viewer may see), each entry also lists its
    annotations by those jobs (jobs.selectors.annotations, two queries more), each
    saying whether the hash it recorded is the entry's."""
    rows = list(
        AuditLog.objects.filter(chain=job_chain(job.id), seq__lte=job.audit_seq).order_by("seq")
    )
    data = {row.seq: entry_data(row) for row in rows}
    names = actor_labels((r.actor_type, r.actor_id) for r in rows)
    letters = {
        data[r.seq].get("dead_letter_id") for r in rows if r.event_type in RESOLVING_EVENTS
    } - {None}
    justifications = dict(
        DeadLetter.objects.filter(id__in=letters).values_list("id", "justification")
    )
    entries: list[dict[str, Any]] = []
    for row in rows:
        details = data[row.seq]
        if row.event_type == "progress" and entries and entries[-1]["event"] == "progress":
            entries[-1].update(
                count=entries[-1]["count"] + 1, data=details, last_ts=row.ts, last_seq=row.seq
            )
            continue
        entries.append(
            {
                "seq": row.seq,
                "ts": row.ts,
                "last_ts": row.ts,
                "event": row.event_type,
                "actor": names[(row.actor_type, row.actor_id)],
                "count": 1,
                "data": details,
                "justification": _justification(row.event_type, details, justifications),
                "link": _linked_job(row.event_type, details),
                "last_seq": row.seq,
                "annotations": [],
            }
        )
    for entry in entries:
        entry["summary"] = _summary(entry["event"], entry["data"])
    if visible is not None:
        _annotate(entries, job_annotations(job=job, visible=visible), rows)
    return entries


def _annotate(entries: list[dict[str, Any]], notes: list[Annotation], rows: list[AuditLog]) -> None:
    """File each annotation under the entry it names (a run of collapsed progress
    entries holds every seq of the run), oldest first; one naming an entry the page
    does not show is left out."""
    hashes = {row.seq: row.chain_hash for row in rows}
    for note in reversed(notes):
        entry = next((e for e in entries if e["seq"] <= note.target_seq <= e["last_seq"]), None)
        if entry is not None:
            entry["annotations"].append(
                {
                    "annotation": note,
                    "hash_matches": hashes.get(note.target_seq) == note.target_hash,
                }
            )


# Entries that name another job: a re-run's entry on the original names the new job,
# the new job's `created` entry the original; an annotation the job it annotates.
LINKED_JOBS = {
    "rerun": ("rerun_job_id", "re-run as"),
    "created": ("rerun_of", "re-run of"),
    "annotated": ("target_job_id", "annotates"),
}


def _linked_job(event: str, data: dict[str, Any]) -> dict[str, Any] | None:
    """The job an entry names ({"id", "label"}), or None."""
    key, label = LINKED_JOBS.get(event, (None, ""))
    value = data.get(key) if key else None
    try:
        return {"id": uuid.UUID(str(value)), "label": label} if value else None
    except ValueError:
        return None


def _justification(
    event: str, data: dict[str, Any], justifications: dict[int, str | None]
) -> str | None:
    """The justification an entry audited, or None. The chain holds only its digest
    (the text stays on the dead letter, as it may name people): the row's text is shown
    under the entry that resolved the row and whose digest it matches, never under the
    row's earlier `failed` or `dead_lettered` entries."""
    if event == "rerun":
        # A re-run's justification is in its entry itself (jobs.services.retry.job_rerun).
        return str(data["justification"]) if data.get("justification") else None
    if event not in RESOLVING_EVENTS:
        return None
    text = justifications.get(data.get("dead_letter_id") or 0)
    if text is None or "justification_sha256" not in data:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return text if digest == data["justification_sha256"] else JUSTIFICATION_MISMATCH


# The attempts the job page shows, newest last; a job replayed many times says that
# earlier ones are in its audit trail.
ATTEMPTS_SHOWN = 50
# How an attempt ended, by the event of the entry that took the job out of `running`;
# any other such event (a future one) is shown by its name.
ATTEMPT_OUTCOMES = {"reclaimed": "lost"}
# What the job page calls an outcome where its name alone misleads: an attempt that ended
# `retrying` failed (the job is the one retrying), and a `lost` one lost its worker.
ATTEMPT_LABELS = {
    "retrying": "failed, retried",
    "lost": "worker lost",
    "unknown": "end not recorded",
}


@dataclass(frozen=True)
class Attempt:
    """One run of a job, from its audit trail: started by a claim (`started`), ended by
    the entry that took the job out of `running` (None while it runs)."""

    number: int
    started: datetime
    ended: datetime | None
    # succeeded, retrying, failed, cancelled, lost; `running` while it runs; `unknown`
    # when the chain lacks its end
    outcome: str
    error_code: str | None

    @property
    def seconds(self) -> float | None:
        """Its duration (None while it runs)."""
        return None if self.ended is None else (self.ended - self.started).total_seconds()

    @property
    def label(self) -> str:
        """Its outcome in words for the job page (ATTEMPT_LABELS)."""
        return ATTEMPT_LABELS.get(self.outcome, self.outcome)

    @property
    def ended_same_day(self) -> bool:
        """It ended on the (UTC) day it started: the page shows the end's time alone."""
        return self.ended is not None and self.ended.date() == self.started.date()


@dataclass(frozen=True)
class Attempts:
    """The latest attempts of a job, oldest first; `more`: earlier ones were left out."""

    rows: list[Attempt]
    more: bool


def job_attempts(*, job: Job, limit: int = ATTEMPTS_SHOWN) -> Attempts:
    """The job's attempts (number, start, end, outcome, error code) from its audit chain,
    as the row `job` (the one its page shows) knows them: only the entries up to its
    chain head `audit_seq`, each written in the statement that changed the row, so the
    attempts agree with the status beside them even if a worker claimed the job since.

    1. The latest `limit` `started` entries (one per claim), newest first, through the
       chain's (chain, seq) index; one more says that earlier attempts exist.
    2. The entries after the earliest of them, except progress: each attempt ends at the
       first entry after its start that left `running` (succeeded, retrying, failed,
       cancelled; `reclaimed` when the reaper took it from a lost worker).
    3. An attempt without such an end is `running` only when it is the latest and the
       job is running; otherwise its end is missing from the chain (`unknown`).
    Two queries, bounded by `limit` attempts whatever the job's history.
    """
    chain = job_chain(job.id)
    entries = AuditLog.objects.filter(chain=chain, seq__lte=job.audit_seq)
    starts = list(
        entries.filter(event_type="started")
        .only("seq", "ts", "payload")
        .order_by("-seq")[: limit + 1]
    )
    more = len(starts) > limit
    starts = starts[:limit][::-1]
    if not starts:
        return Attempts(rows=[], more=False)
    later = (
        entries.filter(seq__gt=starts[0].seq)
        .exclude(event_type="progress")
        .only("seq", "ts", "event_type", "payload")
        .order_by("seq")
    )
    # Both in seq order: each attempt takes the first ending entry after its start,
    # unless the next attempt started first (an end the chain lacks: no row for it).
    ends = iter([(r, d) for r in later if (d := entry_data(r)).get("from") == "running"])
    end = next(ends, None)
    rows: list[Attempt] = []
    for n, start in enumerate(starts):
        while end is not None and end[0].seq < start.seq:
            end = next(ends, None)
        latest = n + 1 == len(starts)
        until = None if latest else starts[n + 1].seq
        mine = end if end is not None and (until is None or end[0].seq < until) else None
        number = entry_data(start).get("attempt")
        if mine:
            outcome = ATTEMPT_OUTCOMES.get(mine[0].event_type, mine[0].event_type)
        else:
            outcome = "running" if latest and job.status == Status.RUNNING else "unknown"
        rows.append(
            Attempt(
                number=number if isinstance(number, int) else n + 1,
                started=start.ts,
                ended=mine[0].ts if mine else None,
                outcome=outcome,
                error_code=_attempt_error(mine[1]) if mine else None,
            )
        )
    return Attempts(rows=rows, more=more)


def _attempt_error(data: dict[str, Any]) -> str | None:
    """The error code an attempt's last entry records (a reclaim records its reason)."""
    if data.get("error_code"):
        return str(data["error_code"])
    return "WORKER_LOST" if data.get("reason") == "worker_lost" else None


def _summary(event: str, data: dict[str, Any]) -> str:
    """What an audit entry says, in a line: `running → failed · attempt 2 · FATAL`."""
    parts = []
    if data.get("from") or data.get("to"):
        parts.append(f"{data.get('from') or '∅'} → {data.get('to')}")
    if data.get("attempt"):
        parts.append(f"attempt {data['attempt']}")
    if event == "progress" and data.get("percent") is not None:
        parts.append(f"{data['percent']}%" + (f" {data['step']}" if data.get("step") else ""))
    for key in ("error_code", "reason", "queue"):
        if data.get(key):
            parts.append(str(data[key]))
    if data.get("delay_ms"):
        parts.append(f"retry in {data['delay_ms'] / 1000:.1f} s")
    if data.get("message_id"):
        parts.append(f"message {str(data['message_id'])[:24]}")
    if event == "annotated" and data.get("target_seq"):
        parts.append(f"entry #{data['target_seq']}: {data.get('label') or ''}")
    if data.get("live_lock"):
        parts.append("the job ran under a live lock: its run decides, the copy needs no action")
    return " · ".join(parts)


def entry_data(row: AuditLog) -> dict[str, Any]:
    """The `data` object of an audit entry's payload ({} when it has none)."""
    try:
        data = json.loads(row.payload).get("data") or {}
    except (ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}
