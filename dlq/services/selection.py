"""Which open dead letters an operator's replay or discard takes, and who may ask:
the checks of a request (permission, justification, queue, filters, limit) and the
selection they describe, as the portal, the admin API, `manage.py dlq` and background
operations all make it (docs/operations/dead-letters.md).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable
from typing import Any, TypedDict, Unpack

from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core.ids import uuid_or_none
from core.json import text_problem
from dlq.errors import (
    DeadLetterInputError,
    DeadLetterNotFoundError,
    DeadLetterPermissionError,
    DeadLetterWholeQueueError,
    JustificationRequiredError,
    UnknownQueueError,
)
from jobs.integrations.topology import dlq_names
from jobs.models import DeadLetter, DeadLetterReason, DeadLetterState
from tenants.selectors import operator_may, operator_org_ids

SAMPLE_SIZE = 10
MAX_JUSTIFICATION_CHARS = 2000
PERMISSIONS = {
    "replay": "jobs.replay_deadletter",
    "discard": "jobs.discard_deadletter",
    "cancel": "jobs.cancel_job",  # a background cancel by filter (dlq/services/cancel.py)
}
# Causes that a replay can cure without a code or data fix: a retryable error that ran
# out of attempts, a lost worker, a broker limit. Non-retryable and fatal errors need
# their cause fixed first; the portal's "only retryable" filter selects these reasons.
RETRYABLE_REASONS = (
    DeadLetterReason.EXHAUSTED,
    DeadLetterReason.WORKER_LOST,
    DeadLetterReason.DELIVERY_LIMIT,
    DeadLetterReason.EXPIRED,
    DeadLetterReason.MAXLEN,
)
# filter name -> ORM lookup on dead_letters; `retryable` (bool) is RETRYABLE_REASONS,
# `without_job` (bool) the rows that name no job (what a replay leaves to a discard).
FILTER_LOOKUPS = {
    "reason": "reason",
    "error_code": "error_code",
    "created_after": "created_at__gte",
    "created_before": "created_at__lt",
}
FILTER_FIELDS = (*FILTER_LOOKUPS, "retryable", "without_job")


def dead_letter_action_check(
    *,
    action: str,
    actor_user: Any,
    justification: str | None,
    queue: str | None = None,
    filters: dict[str, Any] | None = None,
    limit: int | None = None,
    dry_run: bool = False,
) -> tuple[str, dict[str, Any]]:
    """Refuse what no replay or discard may do; returns (justification, filters) cleaned.

    The actor must be active staff with the action's permission (403), the
    justification non-blank unless this is a dry run, which writes nothing (422), the
    queue a DLQ (404), the limit positive and the filters known (422).
    """
    if not operator_may(actor_user, PERMISSIONS[action]):
        raise DeadLetterPermissionError()
    cleaned = (justification or "").strip()
    if not cleaned and not dry_run:
        raise JustificationRequiredError(details={"justification": ["This field is required."]})
    if len(cleaned) > MAX_JUSTIFICATION_CHARS:
        raise DeadLetterInputError(
            details={"justification": [f"At most {MAX_JUSTIFICATION_CHARS} characters."]}
        )
    if text_problem(cleaned):
        raise DeadLetterInputError(details={"justification": [f"It {text_problem(cleaned)}."]})
    return cleaned, dead_letter_selection_check(queue=queue, filters=filters, limit=limit)


def dead_letter_selection_check(
    *, queue: str | None = None, filters: dict[str, Any] | None = None, limit: int | None = None
) -> dict[str, Any]:
    """Refuse a selection no replay or discard may take, whoever asks; returns the
    filters cleaned. The queue must be a DLQ (404), the limit positive and the filters
    known (422)."""
    if queue is not None and queue not in dlq_names():
        raise UnknownQueueError(
            f"{queue!r} is not a dead-letter queue.",
            details={"queue": [f"One of: {', '.join(dlq_names())}."]},
        )
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise DeadLetterInputError(
            "The limit must be a whole number of at least 1 (none: every matching row).",
            details={"limit": ["A positive integer."]},
        )
    return _clean_filters(filters)


def _clean_filters(filters: dict[str, Any] | None) -> dict[str, Any]:
    unknown = set(filters or {}) - set(FILTER_FIELDS)
    if unknown:
        raise DeadLetterInputError(
            details={"filters": [f"Unknown filter(s): {', '.join(sorted(unknown))}."]}
        )
    cleaned: dict[str, Any] = {}
    for name, value in (filters or {}).items():
        if value in (None, "", False):
            continue
        if isinstance(value, str) and text_problem(value):
            # PostgreSQL text holds no NUL: refused here, not by the query (a 500).
            raise DeadLetterInputError(details={name: [f"It {text_problem(value)}."]})
        if name.startswith("created_") and isinstance(value, str):
            parsed = _datetime_or_none(value)
            if parsed is None:
                raise DeadLetterInputError(details={name: ["An ISO 8601 date and time."]})
            value = parsed
        cleaned[name] = value
    return cleaned


def _datetime_or_none(value: str) -> Any:
    try:
        parsed = parse_datetime(value)
    except ValueError:
        return None
    if parsed is not None and timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, datetime.UTC)
    return parsed


def dead_letters_selected(
    *,
    action: str,
    queue: str | None = None,
    job_ids: Iterable[Any] | None = None,
    dead_letter_ids: Iterable[int] | None = None,
    filters: dict[str, Any] | None = None,
    after_id: int | None = None,
    up_to_id: int | None = None,
    org_ids: Iterable[int] | None = None,
) -> QuerySet[DeadLetter]:
    """Open dead letters an action applies to, oldest first (every given part must match).

    Replay takes only rows that name a job; discard also those without one. Job or row
    ids that name no dead letter at all (in `queue`, when given) are a bad selection
    (422); ids whose rows are resolved already simply match nothing, so a repeated
    request is harmless. `after_id`/`up_to_id` bound a bulk operation's window.
    `org_ids` (a limited operator's organisations): only rows whose job is in one of
    them; ids of any other row are answered 404, as if they did not exist (a row
    without a job belongs to no organisation, so it is never among them).
    """
    rows = DeadLetter.objects.filter(state=DeadLetterState.OPEN)
    known = DeadLetter.objects.filter(queue=queue) if queue is not None else DeadLetter.objects
    if org_ids is not None:
        orgs = list(org_ids)
        rows = rows.filter(job__org_id__in=orgs)
        known = known.filter(job__org_id__in=orgs)
    if queue is not None:
        rows = rows.filter(queue=queue)
    if job_ids is not None:
        parsed = _job_ids(job_ids)
        found = known.filter(job_id__in=parsed).values_list("job_id", flat=True)
        missing = set(parsed) - set(found)
        if missing and org_ids is not None:
            raise DeadLetterNotFoundError(
                details={"job_ids": [f"No dead letter: {', '.join(sorted(map(str, missing)))}."]}
            )
        if missing:
            raise DeadLetterInputError(
                f"No dead letter for {len(missing)} of the given job(s)"
                + (f" in {queue}." if queue else "."),
                details={"job_ids": [f"No dead letter: {', '.join(sorted(map(str, missing)))}."]},
            )
        rows = rows.filter(job_id__in=parsed)
    if dead_letter_ids is not None:
        wanted = {int(i) for i in dead_letter_ids}
        missing_rows = wanted - set(known.filter(id__in=wanted).values_list("id", flat=True))
        if missing_rows and org_ids is not None:
            raise DeadLetterNotFoundError(
                details={"dead_letter_ids": [f"Unknown: {sorted(missing_rows)}."]}
            )
        if missing_rows:
            raise DeadLetterInputError(
                details={"dead_letter_ids": [f"Unknown: {sorted(missing_rows)}."]}
            )
        rows = rows.filter(id__in=wanted)
    for name, value in _clean_filters(filters).items():
        if name == "retryable":
            rows = rows.filter(reason__in=RETRYABLE_REASONS)
        elif name == "without_job":
            rows = rows.filter(job__isnull=True)
        else:
            rows = rows.filter(**{FILTER_LOOKUPS[name]: value})
    if action == "replay":
        rows = rows.filter(job__isnull=False)
    if after_id is not None:
        rows = rows.filter(id__gt=after_id)
    if up_to_id is not None:
        rows = rows.filter(id__lte=up_to_id)
    return rows.order_by("id")


def _job_ids(job_ids: Iterable[Any]) -> list[uuid.UUID]:
    given = list(job_ids)
    parsed = [uuid_or_none(j) for j in given]
    bad = [str(j) for j, p in zip(given, parsed, strict=True) if p is None]
    if bad:
        raise DeadLetterInputError(details={"job_ids": [f"Not job ids: {', '.join(bad)}."]})
    return [p for p in parsed if p is not None]


def dead_letters_sample(rows: QuerySet[DeadLetter]) -> list[dict[str, Any]]:
    """The first SAMPLE_SIZE rows of a selection (already limited, in the order the
    action takes them), as the dry run shows them."""
    return [
        {
            "dead_letter_id": r.id,
            "job_id": str(r.job_id) if r.job_id else None,
            "queue": r.queue,
            "reason": r.reason,
            "error_code": r.error_code,
            "error_message": (r.error_message or "")[:200],
            "created_at": r.created_at.isoformat(),
        }
        for r in rows[:SAMPLE_SIZE]
    ]


class Selection(TypedDict, total=False):
    """Which open dead letters an operator's replay or discard takes: in `queue` (a DLQ
    name), of `job_ids` or `dead_letter_ids`, matching `filters` (FILTER_FIELDS), at
    most `limit`."""

    queue: str | None
    job_ids: Iterable[Any] | None
    dead_letter_ids: Iterable[int] | None
    filters: dict[str, Any] | None
    limit: int | None


def dead_letters_checked_selection(
    *,
    action: str,
    actor_user: Any,
    justification: str,
    dry_run: bool = False,
    **selection: Unpack[Selection],
) -> tuple[str, dict[str, Any], QuerySet[DeadLetter]]:
    """Check an operator's request (permission, justification, selection) and return
    the cleaned justification and filters and the selected rows, oldest first (not yet
    limited)."""
    justification, filters = dead_letter_action_check(
        action=action,
        actor_user=actor_user,
        justification=justification,
        queue=selection.get("queue"),
        filters=selection.get("filters"),
        limit=selection.get("limit"),
        dry_run=dry_run,
    )
    org_ids = operator_org_ids(actor_user)
    if org_ids is not None and not names_rows(selection):
        raise DeadLetterWholeQueueError()
    rows = dead_letters_of(action=action, selection=selection, filters=filters, org_ids=org_ids)
    return justification, filters, rows


def dead_letters_of(
    *,
    action: str,
    selection: Selection,
    filters: dict[str, Any],
    org_ids: Iterable[int] | None = None,
) -> QuerySet[DeadLetter]:
    """The open dead letters `selection` takes with its `filters` already cleaned, in
    `org_ids` (None: every organisation), oldest first (not yet limited)."""
    return dead_letters_selected(
        action=action,
        queue=selection.get("queue"),
        job_ids=selection.get("job_ids"),
        dead_letter_ids=selection.get("dead_letter_ids"),
        filters=filters,
        org_ids=org_ids,
    )


def names_rows(selection: Selection | dict[str, Any]) -> bool:
    """Whether a selection names its dead letters (row or job ids) rather than taking a
    whole queue or whatever a filter matches: only such a selection is open to staff
    limited to some organisations (docs/tenancy.md#operators-and-the-portal)."""
    return selection.get("job_ids") is not None or selection.get("dead_letter_ids") is not None
