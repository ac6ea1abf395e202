"""Reads for the dead-letter pages and the admin API (docs/operations/dead-letters.md)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import structlog
from django.db.models import Count, Max, Min, Q, QuerySet

from core.ids import id_fragment
from dlq.broker import DecodedMessage, dlq_depths
from dlq.errors import BulkOperationNotFoundError
from dlq.models import BulkOperation
from jobs.integrations.topology import dlq_has_broker_copy, dlq_names
from jobs.models import DeadLetter, DeadLetterState, Job
from jobs.selectors import SEARCH_MAX_CHARS, Search, id_fragment_q, too_long_note
from tenants.selectors import operator_org_ids

log = structlog.get_logger("dlq")


def dead_letters_list(
    *,
    queue: str | None = None,
    reason: str | None = None,
    state: str | None = DeadLetterState.OPEN,
    error_code: str | None = None,
    job_ids: Iterable[Any] | None = None,
) -> QuerySet[DeadLetter]:
    """Dead letters, newest first, with their job and resolver; `state=None` means all."""
    rows = DeadLetter.objects.select_related("job", "resolved_by")
    if queue:
        rows = rows.filter(queue=queue)
    if reason:
        rows = rows.filter(reason=reason)
    if state:
        rows = rows.filter(state=state)
    if error_code:
        rows = rows.filter(error_code=error_code)
    if job_ids is not None:
        rows = rows.filter(job_id__in=list(job_ids))
    return rows.order_by("-created_at", "-id")


def dead_letters_by_error_code(
    *,
    queue: str | None = None,
    reason: str | None = None,
    state: str | None = DeadLetterState.OPEN,
) -> list[dict[str, Any]]:
    """Counts grouped by (queue, error code, reason), largest first: the few causes
    behind hundreds of failures. Served by the partial index on open rows."""
    rows = dead_letters_list(queue=queue, reason=reason, state=state).order_by()
    groups = (
        rows.values("queue", "error_code", "reason")
        .annotate(count=Count("id"), first_at=Min("created_at"), last_at=Max("created_at"))
        .order_by("-count", "queue", "error_code")
    )
    return list(groups)


def dead_letters_search(*, rows: QuerySet[DeadLetter], term: str) -> Search[DeadLetter]:
    """The dead-letter list's search: `rows` of the job whose id is the term or begins
    or ends with it (as the job list's search, jobs.selectors.jobs_search), or whose
    broker message id is the term."""
    term = term.strip()
    if len(term) > SEARCH_MAX_CHARS:
        return Search(rows.none(), too_long_note(term))
    try:
        return Search(rows.filter(job_id=uuid.UUID(term)))
    except ValueError:
        pass
    fragment = id_fragment(term)
    if fragment is None:
        return Search(rows.filter(message_id=term))
    by_job, note = id_fragment_q(rows, field="job_id", fragment=fragment)
    return Search(rows.filter(Q(message_id=term) | by_job), note)


def dead_letters_in_orgs(
    rows: QuerySet[DeadLetter], *, org_ids: Iterable[int] | None
) -> QuerySet[DeadLetter]:
    """`rows` as a staff member limited to `org_ids` sees them (None: not limited): those
    whose job is in one of the organisations. A row without a job (a broker message
    that names none) belongs to no organisation: only unrestricted operators see it."""
    if org_ids is None:
        return rows
    return rows.filter(job__org_id__in=list(org_ids))


def open_counts_by_queue(*, org_ids: Iterable[int] | None = None) -> dict[str, int]:
    counts = (
        dead_letters_in_orgs(DeadLetter.objects.filter(state=DeadLetterState.OPEN), org_ids=org_ids)
        .order_by()
        .values("queue")
        .annotate(count=Count("id"))
    )
    return {row["queue"]: row["count"] for row in counts}


def dlq_overview(*, org_ids: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """Each DLQ with its broker depth (None when unknown: broker down or queue missing),
    its count of open dead letters and how many of those name a job (`replayable`: a
    replay can take only these). Depth and open rows can differ: `worker_lost` rows
    have no broker copy, and copies of resolved rows wait for the next ack-away pass.

    `org_ids` (a limited operator's organisations): counts of their rows only, and no
    broker depth (a queue's depth counts every tenant's messages)."""
    names = dlq_names()
    # A postgres queue has no broker DLQ (docs/postgres-executor.md): its rows are all.
    brokered = [name for name in names if dlq_has_broker_copy(name)]
    depths: dict[str, int | None] = dict.fromkeys(names)
    broker_error = None
    try:
        if org_ids is None and brokered:
            depths = dlq_depths(queues=brokered)
    except Exception as exc:  # the page must render with the broker down
        log.warning("dlq_depths_unavailable", error=repr(exc))
        depths, broker_error = dict.fromkeys(names), repr(exc)
    open_rows = DeadLetter.objects.filter(state=DeadLetterState.OPEN)
    counts = {
        row["queue"]: row
        for row in dead_letters_in_orgs(open_rows, org_ids=org_ids)
        .order_by()
        .values("queue")
        .annotate(open=Count("id"), replayable=Count("id", filter=Q(job__isnull=False)))
    }
    extra = sorted(set(counts) - set(names))  # e.g. "unknown" for null-job rows
    return [
        {
            "queue": name,
            "depth": depths.get(name),
            "open": counts.get(name, {}).get("open", 0),
            "replayable": counts.get(name, {}).get("replayable", 0),
            "broker_error": broker_error if dlq_has_broker_copy(name) else None,
            "broker_dlq": dlq_has_broker_copy(name),
        }
        for name in [*names, *extra]
    ]


def messages_in_orgs(
    messages: list[DecodedMessage], *, org_ids: Iterable[int] | None
) -> list[DecodedMessage]:
    """The peeked messages a staff member limited to `org_ids` may see (None: not
    limited, all of them): those naming a job of one of the organisations (one query).
    A message that names no job, or a job elsewhere, is left out: its body is another
    tenant's, or no tenant's."""
    if org_ids is None:
        return messages
    job_ids = {_uuid(m.job_id) for m in messages} - {None}
    mine = {
        str(j)
        for j in Job.objects.filter(id__in=job_ids, org_id__in=list(org_ids)).values_list(
            "id", flat=True
        )
    }
    return [m for m in messages if m.job_id and str(_uuid(m.job_id)) in mine]


def dead_letters_for_messages(
    messages: list[DecodedMessage], *, org_ids: Iterable[int] | None = None
) -> dict[str, list[DeadLetter]]:
    """The rows matching peeked messages: by message id, else by the message's job
    (only rows of `org_ids`, when given: a limited operator's organisations).

    Returns {message_id: [rows]} for the peek page (two queries, whatever the count).
    """
    ids = [m.message_id for m in messages]
    job_ids = {_uuid(m.job_id) for m in messages} - {None}
    rows = list(
        dead_letters_in_orgs(
            DeadLetter.objects.filter(Q(message_id__in=ids) | Q(job_id__in=job_ids)),
            org_ids=org_ids,
        )
        .select_related("resolved_by")
        .order_by("-id")
    )
    matched: dict[str, list[DeadLetter]] = {}
    for m in messages:
        mine = [r for r in rows if r.message_id == m.message_id]
        if not mine and m.job_id:
            mine = [r for r in rows if str(r.job_id) == m.job_id]
        matched[m.message_id] = mine
    return matched


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


def death_summary(message: DecodedMessage) -> dict[str, Any]:
    """x-death in short for a person: the reason, the queue it died in, how often, and
    the first and last time any death was recorded (RabbitMQ keeps one entry per
    queue and reason, counting repeats)."""
    deaths = [d for d in message.x_death or [] if isinstance(d, dict)]
    mine = next((d for d in deaths if d.get("queue") == message.queue), deaths[0] if deaths else {})
    times = sorted(str(d["time"]) for d in deaths if d.get("time"))
    count = mine.get("count")
    return {
        "reason": mine.get("reason") or message.reason,
        "queue": mine.get("queue") or message.queue,
        "count": count if isinstance(count, int) else None,
        "first_time": times[0] if times else None,
        "last_time": times[-1] if times else None,
    }


def bulk_operation_visible(operation: BulkOperation, *, user: Any) -> bool:
    """Whether `user` may see (and stop) `operation`: a staff member limited to some
    organisations only their own, whose selection was limited to their organisations
    (an operation's rows may span several organisations, so it belongs to none)."""
    return operator_org_ids(user) is None or operation.requested_by_id == user.pk


def bulk_operation_get(*, operation_id: Any, user: Any = None) -> BulkOperation:
    """A background operation by id (a string that is no UUID is simply not found; nor
    is one that `user`, when given, may not see: `bulk_operation_visible`)."""
    parsed = _uuid(operation_id)
    operation = (
        BulkOperation.objects.select_related("requested_by", "stopped_by").filter(id=parsed).first()
        if parsed
        else None
    )
    if operation is None or (user is not None and not bulk_operation_visible(operation, user=user)):
        raise BulkOperationNotFoundError()
    return operation


def bulk_operations_recent(*, limit: int = 10) -> list[BulkOperation]:
    """The newest background operations, running ones first."""
    rows = BulkOperation.objects.select_related("requested_by").order_by("-created_at")
    return sorted(rows[:limit], key=lambda op: not op.active)


def dead_letter_groups(*, rows: QuerySet[DeadLetter], limit: int = 20) -> list[dict[str, Any]]:
    """`rows` (any filtered selection) by queue, error code and reason, largest first,
    with how many are still open, how many of those name a job (`replayable`: rows
    without one can only be discarded), and when the first and last arrived."""
    open_rows = Q(state=DeadLetterState.OPEN)
    groups = (
        rows.order_by()
        .values("queue", "error_code", "reason")
        .annotate(
            count=Count("id"),
            open=Count("id", filter=open_rows),
            replayable=Count("id", filter=open_rows & Q(job__isnull=False)),
            first_at=Min("created_at"),
            last_at=Max("created_at"),
        )
        .order_by("-count", "queue", "error_code")
    )
    return list(groups[:limit])
