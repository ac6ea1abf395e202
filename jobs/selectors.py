"""Reads for jobs. Visibility lives here: a job is its owner's within its organisation;
an organisation's admins (and, where it shares visibility, its members) see all of its
jobs; a caller with staff powers sees every organisation's, or those of the
organisations an operator scope limits it to (tenants.selectors.Viewer).

Staff powers are the caller's `staff` argument, not `user.is_staff`: the API grants
them only to staff with a verified second factor (core.api.permissions.staff_powers),
so a staff token without an OTP grant sees what its plain user would. Anyone else is
answered as if the job did not exist (404, never 403), so that ids cannot be probed.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.db import connection
from django.db.models import Exists, Model, OuterRef, Q, QuerySet, TextField
from django.db.models.functions import Cast

from audit.models import AuditLog
from audit.services import Actor, job_chain
from core.db import Rows, execute_prepared, model_from_row, read_within
from core.errors import ApplicationError
from core.ids import IdFragment, id_fragment
from jobs.backpressure import queue_depth_cached
from jobs.errors import TIME_LIMIT
from jobs.exceptions import JobNotFoundError
from jobs.models import (
    Artefact,
    BreakerState,
    ConnectorBreaker,
    DeadLetter,
    Job,
    PurgeState,
    QueuePause,
)
from jobs.queries import QUERIES
from jobs.states import Status
from jobs.types import all_connectors, primary_queue_names
from tenants.selectors import Viewer, actor_for, actor_labels, administers, viewer_for

M = TypeVar("M", bound=Model)


def viewer_q(viewer: Viewer, *, prefix: str = "") -> Q:
    """The jobs `viewer` may see (as job_read's condition in jobs/queries.sql), as a
    filter of jobs, or of a relation to them with `prefix` (e.g. "job__"). The
    organisations are constants: a member's list walks (owner, created_at), an org
    admin's (org, created_at)."""
    if viewer.everything:
        return Q()
    wide, own = viewer.org_sets()
    visible = Q(**{f"{prefix}pk__in": []})  # nothing, unless a branch below adds
    if wide:
        visible |= Q(**{f"{prefix}org_id__in": wide})
    if own:
        visible |= Q(**{f"{prefix}owner_id": viewer.owner_id, f"{prefix}org_id__in": own})
    return visible


def job_visible_queryset(*, user: Any, staff: bool = False) -> QuerySet[Job]:
    return Job.objects.filter(viewer_q(viewer_for(user, staff=staff)))


def job_actor_for_user(
    *,
    job_id: uuid.UUID | str,
    user: Any,
    staff: bool,
    permission: str,
    forbidden: type[ApplicationError],
) -> Actor:
    """Who acts when `user` changes a job through the API (a cancel, a retry), with one
    visibility read: its owner, and an admin of the job's organisation, as themselves
    (`user`, or `service` for a service account); staff powers with `permission` as an
    operator. `operator` is staff acting on others' work; an organisation's admin who
    is not acting with staff powers is a member of that organisation doing what its
    role allows, as a person. A job the user may not see is JobNotFoundError (404,
    never 403: ids cannot be probed); one they see but may not change, `forbidden`."""
    found = (
        job_visible_queryset(user=user, staff=staff)
        .filter(id=job_id)
        .values_list("owner_id", "org_id")
        .first()
    )
    if found is None:
        raise JobNotFoundError()
    owner_id, org_id = found
    if owner_id == user.pk:
        return actor_for(user)
    if staff and user.has_perm(permission):
        return Actor.operator(user)
    if administers(user, org_id):
        return actor_for(user)
    raise forbidden()


def _visibility(user: Any, staff: bool) -> dict[str, Any]:
    return viewer_for(user, staff=staff).sql_params()


def job_version_for_user(*, job_id: uuid.UUID, user: Any, staff: bool = False) -> int | None:
    """The job's version (its ETag) or None: one indexed row, no body, no artefacts.

    This is all a conditional GET needs to answer 304.
    """
    rows = execute_prepared(QUERIES["job_version"], {"job_id": job_id, **_visibility(user, staff)})
    return rows[0][0] if rows else None


def job_get_for_user(*, job_id: uuid.UUID, user: Any, staff: bool = False) -> Job:
    """The job with its artefacts (the body lists them), or JobNotFoundError.

    One prepared statement (the API's most frequent read: building it through the ORM
    cost more than running it): the artefacts come as a JSON array of the same row and
    are kept as `job.artefact_list`, which the body serializer reads before
    `job.artefacts`.
    """
    job = _job_read("job_read", {"job_id": job_id, **_visibility(user, staff)})
    if job is None:
        raise JobNotFoundError()
    return job


def _job_read(statement: str, params: dict[str, Any]) -> Job | None:
    """The job that `statement` (job_read) finds, with its artefacts."""
    return job_from_rows(execute_prepared(QUERIES[statement], params))


def job_from_rows(rows: Rows) -> Job | None:
    """The job of a statement that reads `jobs.*` and its artefacts (job_read,
    job_repeat_by_key), or None when it found none."""
    if not rows:
        return None
    job = model_from_row(Job, rows[0], rows.columns)
    job.artefact_list = [  # type: ignore[attr-defined]
        Artefact(job_id=job.id, **artefact) for artefact in rows[0][-1]
    ]
    return job


def job_list_for_user(
    *,
    user: Any,
    staff: bool = False,
    status: str | None = None,
    job_type: str | None = None,
    category: str | None = None,
    created_after: datetime | None = None,
) -> QuerySet[Job]:
    """The caller's jobs (every job with staff powers), filtered; ordered by the
    paginator."""
    jobs = job_visible_queryset(user=user, staff=staff).prefetch_related("artefacts")
    if status:
        jobs = jobs.filter(status=status)
    if job_type:
        jobs = jobs.filter(type=job_type)
    if category:
        # No index of its own, as type has none: the list walks (owner, created_at)
        # newest first, and an index more is a write more at every create.
        jobs = jobs.filter(category=category)
    if created_after:
        jobs = jobs.filter(created_at__gt=created_after)
    return jobs


# The longest text a search can match exactly: an idempotency key (255 characters).
SEARCH_MAX_CHARS = 255
# A search by the end of an id reads every id: no index can serve it (the end is the
# random part, and an index of it would take a write on a random page at every create
# and transition, what UUIDv7 ids are for avoiding). About half a second per million
# rows on two cores; it gives up after SUFFIX_SEARCH_SECONDS and keeps the newest
# SUFFIX_SEARCH_LIMIT matches. A search by the start is a range of the index.
SUFFIX_SEARCH_SECONDS = 3.0
SUFFIX_SEARCH_LIMIT = 100


@dataclass
class Search(Generic[M]):
    """What a portal search found, and what the operator should know about it."""

    rows: QuerySet[M]
    note: str | None = None


def id_fragment_q(rows: QuerySet[M], *, field: str, fragment: IdFragment) -> tuple[Q, str | None]:
    """A filter for `rows` whose uuid `field` begins or ends with the fragment (as it
    says), and a note when the search by the end was cut short.

    The start is a range of `field` (its index); the end a bounded scan of `rows` for
    at most SUFFIX_SEARCH_LIMIT values, newest first, within SUFFIX_SEARCH_SECONDS.
    """
    matches = Q(pk__in=[])  # nothing, until an end adds its matches
    note = None
    if fragment.start:
        low, high = fragment.prefix_range()  # gte/lte: a foreign key has no __range
        matches |= Q(**{f"{field}__gte": low, f"{field}__lte": high})
    if fragment.end:
        scan = (
            rows.alias(id_text=Cast(field, output_field=TextField()))
            .filter(id_text__endswith=fragment.suffix_text())
            .order_by(f"-{field}")
            .values_list(field, flat=True)
        )
        found = read_within(SUFFIX_SEARCH_SECONDS, lambda: list(scan[:SUFFIX_SEARCH_LIMIT]))
        if found is None:
            note = (
                f"The search for ids ending in {fragment.digits} stopped after "
                f"{SUFFIX_SEARCH_SECONDS:g} s (a large table): search by the whole id or "
                "its start."
            )
        else:
            matches |= Q(**{f"{field}__in": found})
            if len(found) == SUFFIX_SEARCH_LIMIT:
                note = (
                    f"At least {SUFFIX_SEARCH_LIMIT} ids end in {fragment.digits}: showing the "
                    f"newest {SUFFIX_SEARCH_LIMIT}; type more of the id."
                )
    return matches, note


def too_long_note(term: str) -> str:
    return (
        f"Nothing matches: the search is longer ({len(term)} characters) than any id, "
        "key or request id."
    )


def jobs_search(*, jobs: QuerySet[Job], term: str) -> Search[Job]:
    """The portal's search: `jobs` whose id is the term or begins or ends with it
    (core.ids.id_fragment), or whose idempotency key or request id is the term; or,
    for `param:key=value`, whose params hold that value (param_term_parse).

    Equalities and the start of an id use indexes; the end of an id is a bounded scan
    (id_fragment_q). A term longer than anything it could equal matches nothing.
    """
    term = term.strip()
    if len(term) > SEARCH_MAX_CHARS:
        return Search(jobs.none(), too_long_note(term))
    if term.lower().startswith(PARAM_TERM_PREFIX):
        try:
            wanted = param_term_parse(term)
        except JobFilterError as malformed:
            return Search(jobs.none(), f"Nothing searched: {malformed}")
        return Search(jobs_filtered(jobs=jobs, filters=JobFilter(params=wanted)))
    exact = Q(idempotency_key=term) | Q(request_id=term)
    try:
        return Search(jobs.filter(exact | Q(id=uuid.UUID(term))))
    except ValueError:
        pass
    fragment = id_fragment(term)
    if fragment is None:
        return Search(jobs.filter(exact))
    by_id, note = id_fragment_q(jobs, field="id", fragment=fragment)
    return Search(jobs.filter(exact | by_id), note)


def artefact_get_for_user(
    *, job_id: uuid.UUID, artefact_id: uuid.UUID, user: Any, staff: bool = False
) -> Artefact:
    """An artefact of a job the caller may see; another job's artefact id is not found."""
    artefact = Artefact.objects.filter(
        id=artefact_id, job_id=job_id, job__in=job_visible_queryset(user=user, staff=staff)
    ).first()
    if artefact is None:
        raise JobNotFoundError("No such artefact.")
    return artefact


def job_key_exists(*, owner: Any, org_id: int, key: str) -> bool:
    """Whether `owner` already made a job in the organisation under this idempotency
    key (a repeat)."""
    return Job.objects.filter(org_id=org_id, owner_id=owner.pk, idempotency_key=key).exists()


def job_get(*, job_id: uuid.UUID | str) -> Job:
    """Any job by id, with its artefacts: for operators' commands, which see every job."""
    job = Job.objects.prefetch_related("artefacts").filter(id=job_id).first()
    if job is None:
        raise JobNotFoundError(f"No job {job_id}.")
    return job


def job_counts_by_queue(
    *, finished_hours: int = 24, org_ids: tuple[int, ...] | None = None
) -> dict[str, dict[str, Any]]:
    """Per queue, for the operator dashboard (two statements, whatever the table's size),
    of the organisations `org_ids` (None: all of them):

    `unfinished` {status: count} for jobs not yet ended; `finished` {status: count} for
    jobs created in the last `finished_hours` that ended; `oldest_pending_seconds`;
    `stale_locks` (running, lock older than JOBOPS_LOCK_TIMEOUT); `retries_due`.
    """
    queues: dict[str, dict[str, Any]] = {}

    def entry(queue: str) -> dict[str, Any]:
        return queues.setdefault(
            queue,
            {
                "unfinished": {},
                "finished": {},
                "oldest_pending_seconds": None,
                "stale_locks": 0,
                "retries_due": 0,
            },
        )

    with connection.cursor() as cursor:
        orgs = None if org_ids is None else list(org_ids)
        cursor.execute(
            QUERIES["queue_unfinished"],
            {"stale_after": float(settings.JOBOPS_LOCK_TIMEOUT), "orgs": orgs},
        )
        for queue, status, count, pending_age, stale, due in cursor.fetchall():
            row = entry(queue)
            row["unfinished"][status] = count
            if status == Status.PENDING and pending_age is not None:
                row["oldest_pending_seconds"] = max(0.0, float(pending_age))
            row["stale_locks"] += stale
            row["retries_due"] += due
        cursor.execute(
            QUERIES["queue_finished_since"], {"hours": int(finished_hours), "orgs": orgs}
        )
        for queue, status, count in cursor.fetchall():
            entry(queue)["finished"][status] = count
    return queues


def job_health_gauges() -> dict[str, float | None]:
    """The on-call figures as of now (one statement, gauges): the
    oldest pending job, stale locks, outbox lag and backlog, the newest checkpoint's
    age (None when none was ever written) and the ERP events parked in the outbox."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["gauges"], {"stale_after": float(settings.JOBOPS_LOCK_TIMEOUT)})
        pending_age, stale, lag, unpublished, checkpoint_age, parked = cursor.fetchone()
    return {
        "oldest_pending_seconds": max(0.0, float(pending_age or 0)),
        "stale_locks": float(stale),
        "outbox_lag_seconds": max(0.0, float(lag or 0)),
        "outbox_unpublished": float(unpublished),
        "checkpoint_age_seconds": None if checkpoint_age is None else float(checkpoint_age),
        "erp_events_parked": int(parked),
    }


@dataclass(frozen=True)
class ParkedEvent:
    """An ERP event the receiver refused for good, parked in the outbox
    (jobs/services/erp_parked.py)."""

    id: int
    event_id: str
    job_id: str
    seq: int
    created_at: datetime
    parked_at: datetime
    status: int | None  # the receiver's HTTP status
    text: str  # the start of its answer
    job_status: str | None  # the status the event announced


def erp_parked_events(*, after: int = 0, limit: int = 100) -> list[ParkedEvent]:
    """The parked ERP events, oldest first; `after` (an outbox id) pages on."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["outbox_parked_list"], {"after": after, "limit": limit})
        rows = cursor.fetchall()
    return [
        ParkedEvent(
            id=r[0],
            event_id=r[1],
            job_id=r[2],
            seq=r[3],
            created_at=r[4],
            parked_at=r[5],
            status=r[6],
            text=r[7] or "",
            job_status=r[8],
        )
        for r in rows
    ]


def purge_last() -> dict[str, Any] | None:
    """When the purge last looked and what its last run removed (jobs/services/purge.py):
    {"checked_at", "started_at", "finished_at", "jobs": total, "removed": {...},
    "kept": {reason: {"jobs": n, ...}}}; None before the first purge."""
    state = PurgeState.objects.filter(id=1).first()
    if state is None:
        return None
    removed = dict(state.removed)
    return {
        "checked_at": state.checked_at,
        "started_at": state.started_at,
        "finished_at": state.finished_at,
        "jobs": sum(removed.get("jobs", {}).values()),
        "removed": removed,
        "kept": dict(state.kept),
    }


# The entries that resolve a dead letter: each carries the digest of its justification.
RESOLVING_EVENTS = ("dlq_replayed", "dlq_discarded")
JUSTIFICATION_MISMATCH = (
    "(the justification stored with the dead letter is not the one this entry audited)"
)


def job_timeline(*, job: Job) -> list[dict[str, Any]]:
    """The job's audit trail for a person: each entry with its time, event, who did it
    (tenants.selectors.actor_labels: a username, an operator's or a service account's
    name, or the system part) and what it said. Runs of `progress` entries collapse into
    one (with their count and last value). Only the entries up to the head `job` (the
    row the page shows) knows of: an entry appended since belongs with a newer row, and
    would contradict the status shown beside it. Three queries: the chain, the actors
    it names, the dead letters it names (for the justifications)."""
    rows = list(
        AuditLog.objects.filter(chain=job_chain(job.id), seq__lte=job.audit_seq).order_by("seq")
    )
    data = {row.seq: _payload_data(row) for row in rows}
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
            entries[-1].update(count=entries[-1]["count"] + 1, data=details, last_ts=row.ts)
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
            }
        )
    for entry in entries:
        entry["summary"] = _summary(entry["event"], entry["data"])
    return entries


# Entries that name another job: a re-run's entry on the original names the new job,
# the new job's `created` entry the original.
LINKED_JOBS = {"rerun": ("rerun_job_id", "re-run as"), "created": ("rerun_of", "re-run of")}


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


@dataclass(frozen=True)
class ClaimState:
    """What a worker whose claim matched no row needs to know of the job."""

    status: str
    org_id: int
    org_suspended: bool
    queue_paused: bool = False


def job_claim_state(*, job_id: uuid.UUID | str) -> ClaimState | None:
    """The job's status, organisation, whether it is suspended and whether its queue is
    paused, by primary key (one join to organisations, one probe of queue_pauses); None
    when no such job exists. Read only after a claim refused the job, so a normal run
    costs nothing more."""
    row = (
        Job.objects.filter(id=job_id)
        .annotate(queue_paused=Exists(QueuePause.objects.filter(queue=OuterRef("queue"))))
        .values_list("status", "org_id", "org__suspended_at", "queue_paused")
        .first()
    )
    if row is None:
        return None
    return ClaimState(
        status=row[0], org_id=row[1], org_suspended=row[2] is not None, queue_paused=row[3]
    )


def job_time_limit_retries(*, job_id: uuid.UUID | str) -> int:
    """How many of the job's attempts were retried after their soft time limit, since
    its latest DLQ replay (a replay gives the job a fresh budget).

    Read from its audit chain, where each retry is a `retrying` entry with its error
    code: the chain is the job's authoritative history, so no counter column has to be
    kept beside it. The worker asks while it holds the job's lock, so no retry of the
    job can be appended meanwhile. A chain has a few such entries (at most its
    max_attempts), read through the chain's (chain, seq) unique index."""
    rows = (
        AuditLog.objects.filter(
            chain=job_chain(job_id), event_type__in=["retrying", "dlq_replayed"]
        )
        .only("event_type", "payload")
        .order_by("seq")
    )
    count = 0
    for row in rows:
        if row.event_type == "dlq_replayed":
            count = 0
        elif _payload_data(row).get("error_code") == TIME_LIMIT:
            count += 1
    return count


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
    ends = iter([(r, d) for r in later if (d := _payload_data(r)).get("from") == "running"])
    end = next(ends, None)
    rows: list[Attempt] = []
    for n, start in enumerate(starts):
        while end is not None and end[0].seq < start.seq:
            end = next(ends, None)
        latest = n + 1 == len(starts)
        until = None if latest else starts[n + 1].seq
        mine = end if end is not None and (until is None or end[0].seq < until) else None
        number = _payload_data(start).get("attempt")
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
    if data.get("live_lock"):
        parts.append("the job ran under a live lock: its run decides, the copy needs no action")
    return " · ".join(parts)


def _payload_data(row: AuditLog) -> dict[str, Any]:
    try:
        data = json.loads(row.payload).get("data") or {}
    except (ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}


# --- search and cancel by filter (docs/operator-controls.md#searching-jobs) --------------

PARAM_TERM_PREFIX = "param:"
# Bounds of a params filter: a containment test deeper or longer than any sensible
# lookup is refused rather than handed to the GIN index.
PARAMS_FILTER_MAX_DEPTH = 4
PARAMS_FILTER_MAX_CHARS = 1000
_PARAM_KEY = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


class JobFilterError(ValueError):
    """A search term or filter that cannot be read; its text is for the operator."""


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def params_filter_check(value: Any) -> dict[str, Any]:
    """A params filter as `params @> value` takes it: a non-empty JSON object, at most
    PARAMS_FILTER_MAX_DEPTH levels deep and PARAMS_FILTER_MAX_CHARS long as JSON."""
    if not isinstance(value, dict) or not value:
        raise JobFilterError('A params filter is a non-empty JSON object, e.g. {"region": "eu"}.')
    if _depth(value) > PARAMS_FILTER_MAX_DEPTH:
        raise JobFilterError(f"A params filter is at most {PARAMS_FILTER_MAX_DEPTH} levels deep.")
    if len(json.dumps(value, separators=(",", ":"))) > PARAMS_FILTER_MAX_CHARS:
        raise JobFilterError(
            f"A params filter is at most {PARAMS_FILTER_MAX_CHARS} characters as JSON."
        )
    return value


def param_term_parse(term: str) -> dict[str, Any]:
    """`param:key=value` as a params filter: `key` a path of at most
    PARAMS_FILTER_MAX_DEPTH names joined by dots (`a.b=1` is {"a": {"b": 1}}); `value`
    JSON when it reads as JSON (`steps=2` is the number 2, `ok=true` a boolean,
    `name="2"` the string "2"), otherwise the text itself (`region=eu`)."""
    body = term.strip()[len(PARAM_TERM_PREFIX) :]  # the prefix in any case
    key, sep, raw = body.partition("=")
    names = key.strip().split(".")
    if not sep or not all(_PARAM_KEY.match(n) for n in names):
        raise JobFilterError(
            "A params search reads param:key=value (a key of letters, digits, _ or -, "
            'dots for nested keys), e.g. param:region=eu or param:steps=2 or param:name="2".'
        )
    if len(names) > PARAMS_FILTER_MAX_DEPTH:
        raise JobFilterError(f"A params key has at most {PARAMS_FILTER_MAX_DEPTH} parts.")
    raw = raw.strip()
    try:
        value: Any = json.loads(raw, parse_constant=_no_constant)
    except ValueError:
        value = raw
    for name in reversed(names):
        value = {name: value}
    return params_filter_check(value)


def _no_constant(name: str) -> Any:
    raise ValueError(name)  # NaN and Infinity are no JSON a job's params can hold


@dataclass(frozen=True)
class JobFilter:
    """What a list of jobs is narrowed to: the portal's filters and the admin API's
    filter body. Every field is optional; all given ones must hold."""

    status: str | None = None
    type: str | None = None
    queue: str | None = None
    org_id: int | None = None
    owner: str | None = None  # a username
    error_code: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    params: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if v is not None}
        for name in ("created_after", "created_before"):
            if name in data:
                data[name] = data[name].isoformat()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobFilter:
        values = dict(data)
        for name in ("created_after", "created_before"):
            if values.get(name):
                values[name] = datetime.fromisoformat(values[name])
        return cls(**values)

    def describe(self) -> str:
        """The filter in words, for the confirmation page and the audit entry."""
        data = self.as_json()
        if "params" in data:
            data["params"] = json.dumps(data["params"], sort_keys=True)
        return ", ".join(f"{k}={v}" for k, v in data.items()) or "every job"


def jobs_filtered(*, jobs: QuerySet[Job], filters: JobFilter) -> QuerySet[Job]:
    """`jobs` narrowed by `filters`. Params by containment (`params @> ...`, served by
    the jobs_params_gin index), the error code by jobs_last_error_code_idx."""
    lookups: dict[str, Any] = {}
    for name in ("status", "type", "queue", "org_id"):
        if getattr(filters, name) is not None:
            lookups[name] = getattr(filters, name)
    if filters.owner is not None:
        lookups["owner__username"] = filters.owner
    if filters.error_code is not None:
        lookups["last_error_code"] = filters.error_code
    if filters.created_after is not None:
        lookups["created_at__gte"] = filters.created_after
    if filters.created_before is not None:
        lookups["created_at__lt"] = filters.created_before
    if filters.params is not None:
        lookups["params__contains"] = filters.params
    return jobs.filter(**lookups)


# The job list's query parameters that a cancel of "all matching" understands; anything
# else (a project, a dead-letter filter, an id search) is refused rather than ignored,
# so that the cancel never reaches wider than the list the operator looked at.
_LIST_IGNORED = frozenset({"o", "p", "_changelist_filters"})
_LIST_FIELDS = {
    "status__exact": "status",
    "type__exact": "type",
    "queue__exact": "queue",
    "owner": "owner",
    "error_code": "error_code",
}


def job_filter_from_list(query: Any) -> JobFilter:
    """The job list's filters (its query string, a QueryDict) as a JobFilter.

    Dates are whole UTC days as the list's date filter reads them (`to` inclusive);
    the search box counts only as a `param:key=value` term. Raises JobFilterError for a
    parameter it cannot carry over or a value out of bounds."""
    values: dict[str, Any] = {}
    for name in query:
        value = str(query.get(name, "")).strip()
        if name in _LIST_IGNORED or value == "":
            continue
        if name in _LIST_FIELDS:
            values[_LIST_FIELDS[name]] = value
        elif name == "org":
            if not value.isdigit() or len(value) > 18:
                raise JobFilterError("The organisation filter is an organisation's number.")
            values["org_id"] = int(value)
        elif name in ("created_at_from", "created_at_to"):
            day = _parse_day(value)
            if name.endswith("_to"):
                day += timedelta(days=1)
            values["created_after" if name.endswith("_from") else "created_before"] = day
        elif name == "q":
            if not value.lower().startswith(PARAM_TERM_PREFIX) or len(value) > SEARCH_MAX_CHARS:
                raise JobFilterError(
                    "Only a param:key=value search can be cancelled by filter; clear the "
                    "search box or search by params."
                )
            values["params"] = param_term_parse(value)
        else:
            raise JobFilterError(
                f"The filter {name!r} cannot be used to cancel by filter; remove it first."
            )
    return job_filter_check(JobFilter(**values))


def _parse_day(value: str) -> datetime:
    try:
        day = date.fromisoformat(value[:10]) if len(value) == 10 else None
    except ValueError:
        day = None
    if day is None:
        raise JobFilterError(f"{value!r} is no date (YYYY-MM-DD).")
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def job_filter_check(filters: JobFilter) -> JobFilter:
    """Refuse values that no job can have or that exceed a bound (JobFilterError)."""
    if filters.status is not None and filters.status not in Status.values:
        raise JobFilterError(f"Unknown status {filters.status!r}.")
    if filters.type is not None and filters.type not in settings.JOB_TYPES:
        raise JobFilterError(f"Unknown job type {filters.type!r}.")
    if filters.queue is not None and filters.queue not in primary_queue_names():
        raise JobFilterError(f"Unknown queue {filters.queue!r}.")
    if filters.owner is not None and len(filters.owner) > 150:
        raise JobFilterError("A username has at most 150 characters.")
    if filters.error_code is not None and len(filters.error_code) > 64:
        raise JobFilterError("An error code has at most 64 characters.")
    if (
        filters.created_after is not None
        and filters.created_before is not None
        and filters.created_after >= filters.created_before
    ):
        raise JobFilterError("The time range is empty: its start is not before its end.")
    if filters.params is not None:
        params_filter_check(filters.params)
    return filters


# --- queue state (docs/operator-controls.md#queue-state) -----------------------------------------


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
        # (jobs.backpressure.queue_depths_read_database), not messages beside them.
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
