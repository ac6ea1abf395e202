"""Replays and discards too large for one request run in the background.

Why the dispatcher and not a Celery task: the dispatcher already runs everywhere
jobops runs, and its steps claim rows with `FOR UPDATE SKIP LOCKED` so that several
dispatchers share work safely (docs/operations/scaling.md). A Celery task would sit in a job queue
behind the very backlog an operator is trying to clear, and would need its own
exclusivity anyway. So a `BulkOperation` row is the work item: `bulk_operations_run_once`
(a step of the dispatcher loop) leases one operation, handles one chunk of its dead
letters with the same per-row transactions as a replay from the portal, records the
progress, and lets go; the next loop (on any dispatcher) takes the next chunk.

Stopping is a flag the step reads before each chunk: at most one chunk (JOBOPS_DLQ_BULK_CHUNK
rows) is handled after an operator presses Stop, and what was done stays done.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import timedelta
from typing import Any, Unpack

import structlog
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import F, Max
from django.utils import timezone

from dlq.errors import BulkOperationNotFoundError, DeadLetterPermissionError
from dlq.models import ACTIVE_STATES, BulkAction, BulkOperation, BulkState
from dlq.queries import QUERIES
from dlq.selectors import bulk_operation_visible
from dlq.services.cancel import CancelResult, jobs_cancel_rows, jobs_cancellable
from dlq.services.replay import (
    ResolveResult,
    broker_copies_ack_resolved,
    dead_letters_discard,
    dead_letters_replay,
    dead_letters_resolve_rows,
)
from dlq.services.selection import (
    PERMISSIONS,
    Selection,
    dead_letters_checked_selection,
    dead_letters_selected,
)
from jobs.integrations.topology import dlq_names
from jobs.models import DeadLetter
from jobs.selectors import JobFilter
from tenants.selectors import operator_may, operator_org_ids

log = structlog.get_logger("dlq.bulk")


def _jsonable_filters(filters: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in filters.items()}


def bulk_operation_start(
    *,
    action: str,
    actor_user: Any,
    justification: str,
    **selection: Unpack[Selection],
) -> BulkOperation:
    """Accept a replay or discard for the background; the dispatcher does the work.

    The request is checked like a direct one (permission, justification, selection);
    `total` is its dry-run count now and `up_to_id` the newest dead letter now.
    """
    given_jobs, given_rows = selection.get("job_ids"), selection.get("dead_letter_ids")
    job_ids = [str(j) for j in given_jobs] if given_jobs is not None else None
    dead_letter_ids = [int(i) for i in given_rows] if given_rows is not None else None
    queue, limit = selection.get("queue"), selection.get("limit")
    justification, filters, rows = dead_letters_checked_selection(
        action=action,
        actor_user=actor_user,
        justification=justification,
        queue=queue,
        job_ids=job_ids,
        dead_letter_ids=dead_letter_ids,
        filters=selection.get("filters"),
        limit=limit,
    )
    total = (rows[:limit] if limit is not None else rows).count()
    up_to_id = DeadLetter.objects.aggregate(newest=Max("id"))["newest"] or 0
    operation = BulkOperation.objects.create(
        action=action,
        queue=queue,
        selection={
            "job_ids": job_ids,
            "dead_letter_ids": dead_letter_ids,
            "filters": _jsonable_filters(filters),
        },
        limit=limit,
        up_to_id=up_to_id,
        justification=justification,
        requested_by=actor_user,
        total=total,
    )
    log.info("dlq_bulk_started", operation_id=str(operation.id), action=action, total=total)
    return operation


def dead_letters_act(
    *,
    action: str,
    actor_user: Any,
    justification: str,
    dry_run: bool = False,
    background_above: int | None = None,
    **selection: Unpack[Selection],
) -> ResolveResult | BulkOperation:
    """A replay or discard as the portal and the admin API ask for it.

    A dry run, or a selection of at most `background_above` dead letters (default
    JOBOPS_DLQ_BACKGROUND_THRESHOLD), runs now and returns its ResolveResult; a larger
    one becomes a BulkOperation for the dispatcher, returned at once.
    """
    # Iterables given are read more than once (dry run, then the work).
    if selection.get("job_ids") is not None:
        selection["job_ids"] = list(selection["job_ids"] or [])
    if selection.get("dead_letter_ids") is not None:
        selection["dead_letter_ids"] = list(selection["dead_letter_ids"] or [])
    service = dead_letters_replay if action == "replay" else dead_letters_discard

    def run(*, dry_run: bool) -> ResolveResult:
        return service(
            actor_user=actor_user, justification=justification, dry_run=dry_run, **selection
        )

    if dry_run:
        return run(dry_run=True)
    threshold = (
        settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD if background_above is None else background_above
    )
    if run(dry_run=True).matched > threshold:
        return bulk_operation_start(
            action=action, actor_user=actor_user, justification=justification, **selection
        )
    return run(dry_run=False)


def bulk_operation_stop(*, operation_id: uuid.UUID | str, actor_user: Any) -> BulkOperation:
    """Stop a background operation; idempotent. Needs the permission of its action.

    A queued one stops at once (compare-and-set on its state); a running one is
    flagged and stops before its next chunk; one that has ended is left as it is.
    """
    operation = BulkOperation.objects.filter(id=operation_id).first()
    if operation is None or not bulk_operation_visible(operation, user=actor_user):
        raise BulkOperationNotFoundError()
    if not operator_may(actor_user, PERMISSIONS[operation.action]):
        raise DeadLetterPermissionError()
    now = timezone.now()
    changed = BulkOperation.objects.filter(id=operation.id, state=BulkState.QUEUED).update(
        state=BulkState.STOPPED, stop_requested=True, stopped_by=actor_user, finished_at=now
    )
    changed += BulkOperation.objects.filter(
        id=operation.id, state=BulkState.RUNNING, stop_requested=False
    ).update(stop_requested=True, stopped_by=actor_user)
    if changed:  # a stop of an operation that had ended changes nothing and says nothing
        log.info("dlq_bulk_stop_requested", operation_id=str(operation.id), user_id=actor_user.pk)
    operation.refresh_from_db()
    return operation


# --- the dispatcher step --------------------------------------------------------------


def _lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def bulk_operations_run_once(*, chunk: int | None = None) -> dict[str, Any]:
    """One chunk of the oldest background operation no other dispatcher holds.

    1. Lease it (SKIP LOCKED: concurrent dispatchers take different operations, or
       none; an expired lease is taken over).
    2. Stop requested, or the requester no longer allowed: finish it as stopped/failed.
    3. Handle the next `chunk` open rows of its selection past its cursor, each in its
       own transaction (`dead_letters_resolve_rows`), and record the progress.
    4. Nothing left: ack the broker copies of what it resolved away and finish it.
    Returns what it did, for the dispatcher's report.
    """
    owner = _lease_owner()
    with transaction.atomic(), connection.cursor() as cursor:
        lease = float(settings.JOBOPS_DLQ_BULK_LEASE_SECONDS)
        cursor.execute(QUERIES["claim_bulk_operation"], [owner, lease])
        row = cursor.fetchone()
    if row is None:
        return {}
    operation = BulkOperation.objects.select_related("requested_by").get(id=row[0])
    user = operation.requested_by
    if operation.stop_requested:
        return _finish(operation, owner, state=BulkState.STOPPED)
    if not operator_may(user, PERMISSIONS[operation.action]):
        lost = "the requester is no longer active staff with the permission"
        return _finish(operation, owner, state=BulkState.FAILED, error=lost)
    size = chunk or settings.JOBOPS_DLQ_BULK_CHUNK
    if operation.action == BulkAction.CANCEL:
        return _cancel_chunk(operation, owner, size)
    if operation.limit is not None:
        size = min(size, operation.limit - operation.processed)
    try:
        rows = _next_rows(operation, size) if size > 0 else []
        if not rows:
            return _finish(operation, owner, state=BulkState.DONE)
        result = ResolveResult(action=operation.action, dry_run=False)
        dead_letters_resolve_rows(
            action=operation.action,
            rows=rows,
            actor_user=user,
            justification=operation.justification,
            result=result,
            audit_extra={"bulk_operation_id": str(operation.id)},
        )
    except (OperationalError, InterfaceError):
        raise  # the database is away: the lease runs out and a later loop goes on
    except Exception as exc:  # a bug or a selection gone bad: tell the operator
        log.exception("dlq_bulk_chunk_failed", operation_id=str(operation.id))
        return _finish(operation, owner, state=BulkState.FAILED, error=repr(exc)[:1000])
    _record_progress(operation, owner, rows=rows, result=result)
    return {"operation": str(operation.id), "resolved": len(result.resolved)}


def _cancel_chunk(operation: BulkOperation, owner: str, size: int) -> dict[str, Any]:
    """One chunk of a cancel by filter: the next `size` jobs the filter still reaches
    (jobs_cancellable: each cancel takes its job out of that set), each cancelled
    through job_cancel as the requester, an operator."""
    filters = JobFilter.from_json((operation.selection or {}).get("jobs_filter") or {})
    try:
        # The requester's organisations as they are now, as for a replay.
        rows = jobs_cancellable(filters=filters, org_ids=operator_org_ids(operation.requested_by))
        job_ids = list(rows.order_by("created_at").values_list("id", flat=True)[:size])
        if not job_ids:
            return _finish(operation, owner, state=BulkState.DONE)
        result = CancelResult(dry_run=False, matched=len(job_ids))
        jobs_cancel_rows(job_ids=job_ids, actor_user=operation.requested_by, result=result)
    except (OperationalError, InterfaceError):
        raise  # the database is away: the lease runs out and a later loop goes on
    except Exception as exc:  # a bug or a filter gone bad: tell the operator
        log.exception("dlq_bulk_chunk_failed", operation_id=str(operation.id))
        return _finish(operation, owner, state=BulkState.FAILED, error=repr(exc)[:1000])
    BulkOperation.objects.filter(id=operation.id).update(
        processed=F("processed") + len(job_ids),
        resolved=F("resolved") + result.cancelled + result.cancel_requested,
        skipped=F("skipped") + result.already_ended,
        updated_at=timezone.now(),
    )
    BulkOperation.objects.filter(id=operation.id, lease_owner=owner).update(
        lease_owner=None, lease_until=None
    )
    return {"operation": str(operation.id), "cancelled": result.cancelled}


def _next_rows(operation: BulkOperation, size: int) -> list[tuple[int, Any, str]]:
    selection = operation.selection or {}
    rows = dead_letters_selected(
        action=operation.action,
        queue=operation.queue,
        job_ids=selection.get("job_ids"),
        dead_letter_ids=selection.get("dead_letter_ids"),
        filters=selection.get("filters"),
        after_id=operation.after_id,
        up_to_id=operation.up_to_id,
        # The requester's organisations as they are now: a scope narrowed since the
        # start narrows what the rest of the operation takes.
        org_ids=operator_org_ids(operation.requested_by),
    )
    return list(rows.values_list("id", "job_id", "queue")[:size])


def _record_progress(
    operation: BulkOperation, owner: str, *, rows: list[tuple[int, Any, str]], result: ResolveResult
) -> None:
    # Counters by F(): right even if a stale dispatcher's chunk overlapped this one.
    BulkOperation.objects.filter(id=operation.id).update(
        processed=F("processed") + len(rows),
        resolved=F("resolved") + len(result.resolved),
        skipped=F("skipped") + len(result.skipped),
        after_id=max(operation.after_id, max(r[0] for r in rows)),
        updated_at=timezone.now(),
    )
    # Let go, so that the next loop of any dispatcher takes the next chunk.
    BulkOperation.objects.filter(id=operation.id, lease_owner=owner).update(
        lease_owner=None, lease_until=None
    )


def _finish(
    operation: BulkOperation, owner: str, *, state: str, error: str | None = None
) -> dict[str, Any]:
    """End the operation: ack away the broker copies of the rows it resolved (one
    pass per DLQ, outside any transaction), then record the final state."""
    operation.refresh_from_db(fields=["resolved"])
    result = ResolveResult(action=operation.action, dry_run=False)
    if operation.resolved and operation.action != BulkAction.CANCEL:  # no broker copies
        queues = [operation.queue] if operation.queue else dlq_names()
        broker_copies_ack_resolved(result=result, queues=queues)
    BulkOperation.objects.filter(id=operation.id, lease_owner=owner).update(
        state=state,
        finished_at=timezone.now(),
        broker_acked=F("broker_acked") + result.broker_acked,
        last_error=error or result.broker_error,
        lease_owner=None,
        lease_until=None,
    )
    log.info("dlq_bulk_finished", operation_id=str(operation.id), state=state, error=error)
    return {"operation": str(operation.id), "state": state}


def bulk_operations_purge(*, older_than: timedelta | None = None, dry_run: bool = False) -> int:
    """Delete the finished operations (done, stopped, failed) that finished more than
    JOBOPS_DLQ_BULK_RETENTION ago (`older_than` overrides it); with `dry_run`, only
    count them. One of JOBOPS_PURGE_EXTRAS (jobs/services/purge.py). Returns the count."""
    keep = older_than if older_than is not None else settings.JOBOPS_DLQ_BULK_RETENTION
    finished = BulkOperation.objects.exclude(state__in=ACTIVE_STATES).filter(
        finished_at__lt=timezone.now() - keep
    )
    if dry_run:
        return finished.count()
    deleted, _ = finished.delete()
    return deleted
