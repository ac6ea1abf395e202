"""Reads for jobs. Visibility lives here: a job is its owner's within its organisation;
an organisation's admins (and, where it shares visibility, its members) see all of its
jobs; a caller with staff powers sees every organisation's, or those of the
organisations an operator scope limits it to (tenants.selectors.Viewer).

Staff powers are the caller's `staff` argument, not `user.is_staff`: the API grants
them only to staff with a verified second factor (core.api.permissions.staff_powers),
so a staff token without an OTP grant sees what its plain user would. Anyone else is
answered as if the job did not exist (404, never 403), so that ids cannot be probed.

The filter language (`filters.py`), a job's timeline and attempts (`timeline.py`) and the
queue and connector state with its per-process memo (`queue_state.py`) are modules of this
package of their own; what they define is re-exported here (`import name as name`), so that
`jobs.selectors.<name>` keeps working for every caller and documented path. The reads of
annotations (`annotations.py`) are new: their callers import them from there.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
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
from jobs.domain.errors import TIME_LIMIT
from jobs.domain.exceptions import JobNotFoundError
from jobs.domain.states import Status
from jobs.models import Artefact, Job, PurgeState, QueuePause
from jobs.queries import QUERIES
from jobs.selectors.filters import (
    PARAM_TERM_PREFIX,
    SEARCH_MAX_CHARS,
    JobFilter,
    JobFilterError,
    jobs_filtered,
    param_term_parse,
)
from jobs.selectors.filters import PARAMS_FILTER_MAX_CHARS as PARAMS_FILTER_MAX_CHARS
from jobs.selectors.filters import PARAMS_FILTER_MAX_DEPTH as PARAMS_FILTER_MAX_DEPTH
from jobs.selectors.filters import job_filter_check as job_filter_check
from jobs.selectors.filters import job_filter_from_list as job_filter_from_list
from jobs.selectors.filters import params_filter_check as params_filter_check
from jobs.selectors.queue_state import PAUSED_RETRY_AFTER_SECONDS as PAUSED_RETRY_AFTER_SECONDS
from jobs.selectors.queue_state import QUEUES_CACHE_SECONDS as QUEUES_CACHE_SECONDS
from jobs.selectors.queue_state import ConnectorState as ConnectorState
from jobs.selectors.queue_state import QueueState as QueueState
from jobs.selectors.queue_state import connectors_state as connectors_state
from jobs.selectors.queue_state import paused_queues_detail as paused_queues_detail
from jobs.selectors.queue_state import queue_pauses as queue_pauses
from jobs.selectors.queue_state import queues_for_consumers as queues_for_consumers
from jobs.selectors.queue_state import queues_for_consumers_forget as queues_for_consumers_forget
from jobs.selectors.queue_state import queues_state as queues_state
from jobs.selectors.timeline import ATTEMPT_LABELS as ATTEMPT_LABELS
from jobs.selectors.timeline import ATTEMPT_OUTCOMES as ATTEMPT_OUTCOMES
from jobs.selectors.timeline import ATTEMPTS_SHOWN as ATTEMPTS_SHOWN
from jobs.selectors.timeline import JUSTIFICATION_MISMATCH as JUSTIFICATION_MISMATCH
from jobs.selectors.timeline import LINKED_JOBS as LINKED_JOBS
from jobs.selectors.timeline import RESOLVING_EVENTS as RESOLVING_EVENTS
from jobs.selectors.timeline import Attempt as Attempt
from jobs.selectors.timeline import Attempts as Attempts
from jobs.selectors.timeline import entry_data
from jobs.selectors.timeline import job_attempts as job_attempts
from jobs.selectors.timeline import job_timeline as job_timeline
from tenants.selectors import Viewer, actor_for, administers, viewer_for

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
        elif entry_data(row).get("error_code") == TIME_LIMIT:
            count += 1
    return count
