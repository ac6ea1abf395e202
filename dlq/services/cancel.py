"""Cancel every job a filter matches (docs/operator-controls.md#bulk-cancel).

The portal's "cancel all matching" and `POST /api/v1/admin/jobs/cancel` both come here.
Each job goes through `jobs.services.job_cancel` as the operator (its own audited
transition, exactly as a cancel of one job); the request itself, with its filter, count
and justification, is one entry on the ops chain. A selection larger than
JOBOPS_DLQ_BACKGROUND_THRESHOLD becomes a BulkOperation that the dispatcher works
through in chunks (dlq/bulk.py), like a large replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit.services import OPS_CHAIN, Actor, audit_append
from core.json import text_problem
from dlq.errors import DeadLetterInputError, DeadLetterPermissionError, JustificationRequiredError
from dlq.models import BulkAction, BulkOperation
from dlq.services.selection import MAX_JUSTIFICATION_CHARS
from jobs.domain.exceptions import JobNotFoundError
from jobs.domain.states import TERMINAL, Status
from jobs.models import Job
from jobs.selectors import JobFilter, jobs_filtered
from jobs.services import job_cancel
from tenants.selectors import operator_may, operator_org_ids

CANCEL_PERMISSION = "jobs.cancel_job"
SAMPLE_SIZE = 10


class CancelPermissionError(DeadLetterPermissionError):
    default_message = (
        "Cancelling jobs by filter needs an active staff user with the cancel_job "
        "permission (the operator role)."
    )


class CancelJustificationRequiredError(JustificationRequiredError):
    default_message = "A justification is required to cancel jobs by filter."


@dataclass
class CancelResult:
    """What a cancel by filter matched and, unless a dry run, did."""

    dry_run: bool
    matched: int
    sample: list[str] = field(default_factory=list)
    cancelled: int = 0  # moved to `cancelled` now
    cancel_requested: int = 0  # running: flagged, they stop at their next check
    already_ended: int = 0  # ended between the count and the cancel

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def jobs_cancellable(*, filters: JobFilter, org_ids: tuple[int, ...] | None) -> QuerySet[Job]:
    """The jobs a cancel by `filters` still has to reach: not ended, flag not raised,
    within `org_ids` (None: every organisation). Each cancel takes its job out of this
    set (it ends, or its flag goes up), so a background run needs no cursor."""
    rows = jobs_filtered(jobs=Job.objects.all(), filters=filters)
    if org_ids is not None:
        # A limited operator's cancel never reaches past their organisations, whatever
        # the filter names (an org outside them is refused before it gets here).
        rows = rows.filter(org_id__in=org_ids)
    return rows.exclude(status__in=TERMINAL).filter(cancel_requested=False)


def _check(actor_user: Any, justification: str, *, dry_run: bool) -> str:
    if not operator_may(actor_user, CANCEL_PERMISSION):
        raise CancelPermissionError()
    cleaned = (justification or "").strip()
    if not cleaned and not dry_run:
        raise CancelJustificationRequiredError(
            details={"justification": ["This field is required."]}
        )
    if len(cleaned) > MAX_JUSTIFICATION_CHARS:
        raise DeadLetterInputError(
            details={"justification": [f"At most {MAX_JUSTIFICATION_CHARS} characters."]}
        )
    if text_problem(cleaned):
        raise DeadLetterInputError(details={"justification": [f"It {text_problem(cleaned)}."]})
    return cleaned


def jobs_cancel_rows(*, job_ids: list[Any], actor_user: Any, result: CancelResult) -> None:
    """Cancel each job through job_cancel as the operator, counting outcomes in `result`."""
    actor = Actor.operator(actor_user)
    for job_id in job_ids:
        try:
            job = job_cancel(job_id=job_id, actor=actor)
        except JobNotFoundError:  # purged meanwhile
            result.already_ended += 1
            continue
        if job.status == Status.CANCELLED:
            result.cancelled += 1
        elif job.status in TERMINAL:
            result.already_ended += 1
        else:
            result.cancel_requested += 1


def jobs_cancel_by_filter(
    *,
    actor_user: Any,
    filters: JobFilter,
    justification: str = "",
    dry_run: bool = False,
    background_above: int | None = None,
) -> CancelResult | BulkOperation:
    """Cancel the unfinished jobs `filters` match, as `actor_user` (an operator).

    1. Refuse a user without the cancel permission (403) or, unless a dry run, without
       a justification (422).
    2. Count them, within the operator's organisations when limited; a dry run stops
       here with the count and a sample of ids.
    3. At most `background_above` (JOBOPS_DLQ_BACKGROUND_THRESHOLD): cancel each now.
       More: record a BulkOperation for the dispatcher and return it at once; it only
       takes jobs created up to now, so new work is not chased.
    The request is one `jobs_cancel_by_filter` entry on the ops chain.
    """
    cleaned = _check(actor_user, justification, dry_run=dry_run)
    org_ids = operator_org_ids(actor_user)
    rows = jobs_cancellable(filters=filters, org_ids=org_ids)
    matched = rows.count()
    if dry_run:
        sample = [
            str(i) for i in rows.order_by("created_at").values_list("id", flat=True)[:SAMPLE_SIZE]
        ]
        return CancelResult(dry_run=True, matched=matched, sample=sample)
    threshold = (
        settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD if background_above is None else background_above
    )
    actor = Actor.operator(actor_user)
    if matched > threshold:
        now = timezone.now()
        until = min(filters.created_before or now, now)
        bounded = JobFilter(**{**filters.__dict__, "created_before": until})
        with transaction.atomic():
            operation = BulkOperation.objects.create(
                action=BulkAction.CANCEL,
                queue=filters.queue,
                selection={"jobs_filter": bounded.as_json()},
                up_to_id=0,
                justification=cleaned,
                requested_by=actor_user,
                total=matched,
            )
            _audit(actor, filters, matched, cleaned, operation_id=str(operation.id))
        return operation
    result = CancelResult(dry_run=False, matched=matched)
    job_ids = list(rows.order_by("created_at").values_list("id", flat=True)[:threshold])
    with transaction.atomic():
        _audit(actor, filters, matched, cleaned, operation_id=None)
    jobs_cancel_rows(job_ids=job_ids, actor_user=actor_user, result=result)
    return result


def _audit(
    actor: Actor, filters: JobFilter, matched: int, justification: str, *, operation_id: str | None
) -> None:
    audit_append(
        chain=OPS_CHAIN,
        event_type="jobs_cancel_by_filter",
        actor=actor,
        data={
            "filter": filters.as_json(),
            "matched": matched,
            "justification": justification,
            "bulk_operation_id": operation_id,
        },
    )
