"""Dead-letter write paths (docs/operations/dead-letters.md). The database row is authoritative."""

from __future__ import annotations

import datetime
import hashlib
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, Unpack

import structlog
from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from audit.services import OPS_CHAIN, Actor, audit_append
from dlq.broker import DecodedMessage, DrainResult, dlq_drain
from dlq.errors import (
    DeadLetterInputError,
    DeadLetterPermissionError,
    JustificationRequiredError,
    UnknownQueueError,
)
from jobs import metrics
from jobs.models import DeadLetter, DeadLetterReason, DeadLetterState, Job
from jobs.services import (
    job_audit,
    job_fail_with_dead_letter,
    job_lock_is_stale,
    job_publish,
    jobs_audit,
    jobs_fail_with_dead_letters,
    transition_many,
)
from jobs.states import Status
from jobs.topology import dlq_name, dlq_names
from jobs.types import get_type

log = structlog.get_logger("dlq")


# --- the dead-letter watcher's reconciliation --------------------------

WATCHER = Actor.system("dlq-watcher")
LIVE_LOCK_NOTE = (
    "recorded by the dead-letter watcher: the job was running under a live lock, "
    "so its run decides the outcome; this broker copy needs no action"
)


class Outcome:
    """What the watcher did with one message (also its log field and metric label)."""

    FAILED = "failed"  # a broker-made dead letter: the job failed, a row opened
    BROKER_COPY = "broker_copy"  # a worker-made dead letter: its row now has the copy
    LIVE_LOCK = "live_lock"  # the job runs under a live lock: message recorded only
    NO_JOB = "no_job"  # undecodable, naming no job, or an unknown job: null-job row
    REPEAT = "repeat"  # this message was recorded already
    STALE = "stale"  # a copy of an earlier attempt, or of a resolved/ended job


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


def _broker_error(message: DecodedMessage) -> tuple[str, str]:
    reason = message.reason or DeadLetterReason.REJECTED
    count = next(
        (d.get("count") for d in message.x_death or [] if d.get("queue") == message.queue), None
    )
    text = f"dead-lettered by the broker ({reason}) in queue {message.queue}"
    if count is not None:
        text += f", x-death count {count}"
    return f"BROKER_{reason.upper()}", text


def dead_letter_reconcile(*, message: DecodedMessage) -> str:
    """Reconcile one `dlq.watch` message with the database; idempotent. Returns an Outcome.

    One transaction; the caller acks the message only after it commits.
    1. A message already recorded (same message id) changes nothing.
    2. No job (undecodable, no job id, unknown job): a null-job row with the raw body,
       audited `dead_lettered` on the ops chain.
    3. Lock the job row (the order every writer uses: job, then dead letter), then:
       - `failed` with an open row: mark `broker_copy` and audit `dead_lettered` once;
       - `pending`/`queued`/`retrying` whose attempt the message carries: `failed` + row
         (a broker-made dead letter: delivery limit, TTL, max length, a bare reject);
       - `running` with a stale lock: the same, conditioned on the stale lock;
       - `running` with a live lock: record the message in a row that is resolved at
         once (the job's own run decides its outcome; an open row would block it);
       - anything else (an earlier attempt's copy, a resolved or ended job): stale.
    """
    with transaction.atomic():
        if DeadLetter.objects.filter(message_id=message.message_id).exists():
            return Outcome.REPEAT
        job_id = _uuid_or_none(message.job_id)
        job = Job.objects.select_for_update().filter(id=job_id).first() if job_id else None
        if job is None:
            _record_without_job(message=message, job_id_text=message.job_id)
            return Outcome.NO_JOB
        attempt = message.attempt
        if job.status == Status.FAILED:
            if attempt is not None and attempt < job.attempts:
                return Outcome.STALE  # a copy of an attempt before a replay
            row = (
                DeadLetter.objects.select_for_update()
                .filter(job=job, state=DeadLetterState.OPEN)
                .first()
            )
            if row is None:
                return Outcome.STALE
            if row.broker_copy:
                return Outcome.REPEAT
            row.broker_copy = True
            row.x_death, row.headers = message.x_death, message.headers
            row.message_id = row.message_id or message.message_id
            row.save(update_fields=["broker_copy", "x_death", "headers", "message_id"])
            _audit_dead_lettered(row, message)
            return Outcome.BROKER_COPY
        if job.status in (Status.PENDING, Status.QUEUED, Status.RETRYING):
            if attempt is not None and attempt <= job.attempts:
                return Outcome.STALE  # a copy from before a replay or a retry
            _fail_from_broker(job=job, message=message, sources=[job.status])
            return Outcome.FAILED
        if job.status == Status.RUNNING:
            if attempt is not None and attempt < job.attempts:
                return Outcome.STALE
            if job_lock_is_stale(job_id=job.id):
                _fail_from_broker(
                    job=job,
                    message=message,
                    sources=[Status.RUNNING],
                    stale_after=float(settings.JOBOPS_LOCK_TIMEOUT),
                )
                return Outcome.FAILED
            row = DeadLetter.objects.create(
                job=job,
                queue=dlq_name(job.queue),
                reason=message.reason or DeadLetterReason.REJECTED,
                error_code=_broker_error(message)[0],
                error_message=_broker_error(message)[1],
                x_death=message.x_death,
                headers=message.headers,
                broker_copy=True,
                message_id=message.message_id,
                state=DeadLetterState.DISCARDED,
                resolved_at=timezone.now(),
                justification=LIVE_LOCK_NOTE,
            )
            _audit_dead_lettered(row, message, live_lock=True)
            return Outcome.LIVE_LOCK
        return Outcome.STALE  # succeeded or cancelled: nothing to decide


def dead_letters_reconcile(*, messages: Sequence[DecodedMessage]) -> list[str | None]:
    """Reconcile the common case of a burst in a few statements for the whole batch:
    broker-made dead letters of jobs waiting in their queue (a delivery limit, a TTL,
    a bare reject of many messages). Returns an Outcome per message, or None for a
    message left to `dead_letter_reconcile` (the caller's, in the same transaction).

    The decisions are `dead_letter_reconcile`'s: a recorded message id is a repeat; a
    `pending`/`queued`/`retrying` job whose attempt the message carries fails with an
    open row (broker copy recorded) and its `failed` and `dead_lettered` entries. Jobs
    are locked first, in id order, as every writer does. Everything else (another
    state, no job, a second message of the same job or id in the batch) is left.
    """
    outcomes: list[str | None] = [None] * len(messages)
    seen: set[Any] = set()
    job_ids: dict[int, uuid.UUID] = {}  # message index -> its job, for the chosen ones
    for index, message in enumerate(messages):
        job_id = _uuid_or_none(message.job_id)
        keys = {("job", job_id), ("message", message.message_id)}
        if job_id is not None and message.message_id and not keys & seen:
            job_ids[index] = job_id
        seen |= keys
    chosen = list(job_ids)
    if not chosen:
        return outcomes
    recorded = set(
        DeadLetter.objects.filter(
            message_id__in=[messages[i].message_id for i in chosen]
        ).values_list("message_id", flat=True)
    )
    jobs = {
        job.id: job
        for job in Job.objects.select_for_update()
        .filter(id__in=[job_ids[i] for i in chosen])
        .order_by("id")
        .only("id", "status", "attempts", "queue")
    }
    groups: dict[tuple[str, str, str, str, str], list[int]] = {}
    for index in chosen:
        message, job = messages[index], jobs.get(job_ids[index])
        if message.message_id in recorded:
            outcomes[index] = Outcome.REPEAT
        elif (
            job is not None
            and job.status in (Status.PENDING, Status.QUEUED, Status.RETRYING)
            and (message.attempt is None or message.attempt > job.attempts)
        ):
            code, text = _broker_error(message)
            reason = message.reason or DeadLetterReason.REJECTED
            key = (job.status, dlq_name(job.queue), reason, code, text)
            groups.setdefault(key, []).append(index)
    for (status, queue, reason, code, text), indexes in groups.items():
        rows = jobs_fail_with_dead_letters(
            job_ids=[job_ids[i] for i in indexes],
            source=status,
            queue=queue,
            reason=reason,
            actor=WATCHER,
            error_code=code,
            error_message=text,
            broker_copies={
                job_ids[i]: {
                    "x_death": messages[i].x_death,
                    "headers": messages[i].headers,
                    "message_id": messages[i].message_id,
                }
                for i in indexes
            },
        )
        jobs_audit(
            entries={row.job_id: _dead_lettered_entry(row, row.message_id) for row in rows},
            event_type="dead_lettered",
            actor=WATCHER,
        )
        failed = {row.job_id for row in rows}
        for i in indexes:
            if job_ids[i] in failed:
                outcomes[i] = Outcome.FAILED
    return outcomes


def _fail_from_broker(
    *,
    job: Job,
    message: DecodedMessage,
    sources: list[str],
    stale_after: float | None = None,
) -> DeadLetter:
    code, text = _broker_error(message)
    _, row = job_fail_with_dead_letter(
        job_id=job.id,
        reason=message.reason or DeadLetterReason.REJECTED,
        actor=WATCHER,
        error_code=code,
        error_message=text,
        sources=sources,
        stale_after=stale_after,
        broker_copy=True,
        x_death=message.x_death,
        headers=message.headers,
        message_id=message.message_id,
    )
    _audit_dead_lettered(row, message)
    return row


def _record_without_job(*, message: DecodedMessage, job_id_text: str | None) -> DeadLetter:
    if message.decode_error and not job_id_text:
        code, text = "UNDECODABLE", message.decode_error
    elif not job_id_text:
        code, text = "NO_JOB", "the message names no job"
    else:
        code, text = "JOB_NOT_FOUND", f"the message names job {job_id_text!r}, which is unknown"
    row = DeadLetter.objects.create(
        job=None,
        queue=message.dlq or "unknown",
        reason=message.reason or DeadLetterReason.REJECTED,
        error_code=code,
        error_message=text,
        x_death=message.x_death,
        headers=message.headers,
        body=message.body_text,
        broker_copy=True,
        message_id=message.message_id,
    )
    _audit_dead_lettered(row, message)
    return row


def _audit(
    *, job_id: uuid.UUID | None, event_type: str, actor: Actor, data: dict[str, Any]
) -> None:
    """On the job's chain, or on the ops chain for a dead letter that names no job."""
    if job_id is not None:
        job_audit(job_id=job_id, event_type=event_type, actor=actor, data=data)
    else:
        audit_append(chain=OPS_CHAIN, event_type=event_type, actor=actor, data=data)


def _audit_dead_lettered(row: DeadLetter, message: DecodedMessage, **extra: Any) -> None:
    _audit(
        job_id=row.job_id,
        event_type="dead_lettered",
        actor=WATCHER,
        data=_dead_lettered_entry(row, message.message_id, **extra),
    )


def _dead_lettered_entry(row: DeadLetter, message_id: str | None, **extra: Any) -> dict[str, Any]:
    """What a `dead_lettered` entry says: the row, why, and which broker message."""
    return {
        "dead_letter_id": row.id,
        "queue": row.queue,
        "reason": row.reason,
        "message_id": message_id,
        **extra,
    }


# --- replay and discard -----------------------------------------------


@dataclass
class ResolveResult:
    """The answer of a replay or discard (also a dry run's: `matched` and `sample`)."""

    action: str
    dry_run: bool
    matched: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)
    # Replay only: open rows of the selection that name no job, which it cannot take.
    without_job: int = 0
    notes: list[str] = field(default_factory=list)  # what an operator should know, in words
    resolved: list[int] = field(default_factory=list)  # dead_letters ids
    job_ids: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)  # broker copies of resolved rows
    skipped: list[dict[str, Any]] = field(default_factory=list)
    broker_acked: int = 0
    broker_error: str | None = None
    published: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # per phase, for operators

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


ReplayResult = ResolveResult
DiscardResult = ResolveResult
SAMPLE_SIZE = 10
MAX_JUSTIFICATION_CHARS = 2000
PERMISSIONS = {"replay": "jobs.replay_deadletter", "discard": "jobs.discard_deadletter"}
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
    permission = PERMISSIONS[action]
    if actor_user is None or not getattr(actor_user, "is_active", False):
        raise DeadLetterPermissionError()
    if not (getattr(actor_user, "is_staff", False) and actor_user.has_perm(permission)):
        raise DeadLetterPermissionError()
    cleaned = (justification or "").strip()
    if not cleaned and not dry_run:
        raise JustificationRequiredError(details={"justification": ["This field is required."]})
    if len(cleaned) > MAX_JUSTIFICATION_CHARS:
        raise DeadLetterInputError(
            details={"justification": [f"At most {MAX_JUSTIFICATION_CHARS} characters."]}
        )
    if queue is not None and queue not in dlq_names():
        raise UnknownQueueError(
            f"{queue!r} is not a dead-letter queue.",
            details={"queue": [f"One of: {', '.join(dlq_names())}."]},
        )
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise DeadLetterInputError(details={"limit": ["A positive integer."]})
    return cleaned, _clean_filters(filters)


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
) -> QuerySet[DeadLetter]:
    """Open dead letters an action applies to, oldest first (every given part must match).

    Replay takes only rows that name a job; discard also those without one. Job or row
    ids that name no dead letter at all (in `queue`, when given) are a bad selection
    (422); ids whose rows are resolved already simply match nothing, so a repeated
    request is harmless. `after_id`/`up_to_id` bound a bulk operation's window.
    """
    rows = DeadLetter.objects.filter(state=DeadLetterState.OPEN)
    known = DeadLetter.objects.filter(queue=queue) if queue is not None else DeadLetter.objects
    if queue is not None:
        rows = rows.filter(queue=queue)
    if job_ids is not None:
        parsed = _job_ids(job_ids)
        found = known.filter(job_id__in=parsed).values_list("job_id", flat=True)
        missing = set(parsed) - set(found)
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
    parsed = [_uuid_or_none(j) for j in given]
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


def _justification_digest(justification: str) -> str:
    # The text stays on the row (it may name people); the chain holds its digest, so
    # an edit of the stored justification is still detectable.
    return hashlib.sha256(justification.encode("utf-8")).hexdigest()


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
    rows = dead_letters_selected(
        action=action,
        queue=selection.get("queue"),
        job_ids=selection.get("job_ids"),
        dead_letter_ids=selection.get("dead_letter_ids"),
        filters=filters,
    )
    return justification, filters, rows


def dead_letters_replay(
    *,
    actor_user: Any,
    justification: str,
    dry_run: bool = False,
    publish: bool = False,
    **selection: Unpack[Selection],
) -> ReplayResult:
    """Replay open dead letters: their jobs run again with a fresh retry budget.

    Selection (`dead_letters_selected`): open rows that name a job, in `queue` (a DLQ
    name, e.g. `sim_dlq`), of `job_ids` or `dead_letter_ids`, matching `filters`
    (FILTER_FIELDS), oldest first, at most `limit`.
    1. Dry run: the count and a sample; nothing is written.
    2. In transactions of RESOLVE_CHUNK rows (jobs locked first, then their open rows):
       `failed` -> `pending` audited `dlq_replayed` (attempts keep counting,
       `max_attempts` grows by the type's max_retries + 1, the last error stays as
       history until a success clears it), the row -> `replayed` with the actor and
       justification. A row resolved meanwhile is skipped: replay is retry-safe.
    3. After the commits, one pass per DLQ acks away the broker copies whose rows are
       resolved (a failure only leaves stale copies for the next pass or replay).
    4. The dispatcher publishes the now-`pending` jobs (its next loop: their
       `created_at` is old). `publish=True` publishes them here as well, best effort
       (a failure stops the rest rather than wait on a dead broker; a double publish is
       harmless, the claim fences it); it costs one confirmed publish and one audited
       transition per job, so bulk replays leave it to the dispatcher.
    """
    return _resolve_selection(
        action="replay",
        actor_user=actor_user,
        justification=justification,
        dry_run=dry_run,
        publish=publish,
        **selection,
    )


def dead_letters_discard(
    *,
    actor_user: Any,
    justification: str,
    dry_run: bool = False,
    **selection: Unpack[Selection],
) -> DiscardResult:
    """Discard open dead letters: the rows close, the jobs stay `failed`.

    Same selection as replay, plus rows that name no job.
    1. Dry run: the count and a sample; nothing is written.
    2. In transactions of RESOLVE_CHUNK rows (jobs locked first, then their open rows):
       the rows -> `discarded` with actor and justification, audited `dlq_discarded` on
       each job's chain (the ops chain for a row without a job). Resolved rows are
       skipped.
    3. After the commits, the broker copies of resolved rows are acked away.
    """
    return _resolve_selection(
        action="discard",
        actor_user=actor_user,
        justification=justification,
        dry_run=dry_run,
        **selection,
    )


def _resolve_selection(
    *,
    action: str,
    actor_user: Any,
    justification: str,
    dry_run: bool,
    publish: bool = False,
    **selection: Unpack[Selection],
) -> ResolveResult:
    justification, filters, rows = dead_letters_checked_selection(
        action=action,
        actor_user=actor_user,
        justification=justification,
        dry_run=dry_run,
        **selection,
    )
    limit = selection.get("limit")
    result = ResolveResult(action=action, dry_run=dry_run)
    limited = rows[:limit] if limit is not None else rows
    result.matched = limited.count()
    # From the limited rows, so that the sample is what the run takes, in its order.
    result.sample = dead_letters_sample(limited)
    if action == "replay":
        result.without_job = _count_without_job(selection, filters=filters)
        if result.without_job:
            result.notes.append(without_job_note(result.without_job))
    if dry_run:
        return result
    clock = time.perf_counter()
    queues = dead_letters_resolve_rows(
        action=action,
        rows=list(limited.values_list("id", "job_id", "queue")),
        actor_user=actor_user,
        justification=justification,
        result=result,
    )
    clock = _lap(result, "transactions", clock)
    broker_copies_ack_resolved(result=result, queues=queues)
    clock = _lap(result, "ack_away", clock)
    if publish and action == "replay":
        result.published = _publish(result.job_ids)
        _lap(result, "publish", clock)
    return result


def _count_without_job(selection: Selection, *, filters: dict[str, Any]) -> int:
    """Open rows of a replay's selection that name no job: the replay leaves them out
    (`dead_letters_selected`), and the operator is told how many and why."""
    if selection.get("job_ids") is not None:
        return 0  # rows chosen by job name a job
    rows = dead_letters_selected(
        action="discard",
        queue=selection.get("queue"),
        dead_letter_ids=selection.get("dead_letter_ids"),
        filters=filters,
    )
    return rows.filter(job__isnull=True).count()


def without_job_note(count: int) -> str:
    """Why a replay leaves `count` rows out, in the operator's words."""
    if count == 1:
        return "1 dead letter names no job: it can only be discarded."
    return f"{count} dead letters name no job: they can only be discarded."


def dead_letters_resolve_rows(
    *,
    action: str,
    rows: Iterable[tuple[int, uuid.UUID | None, str]],
    actor_user: Any,
    justification: str,
    result: ResolveResult,
    audit_extra: dict[str, Any] | None = None,
) -> set[str]:
    """Replay or discard each (row id, job id, queue) into `result`, RESOLVE_CHUNK rows
    per transaction.

    The caller has checked actor and justification. Returns the DLQs touched (their
    broker copies are acked away afterwards, outside any transaction).
    """
    actor = Actor.user(actor_user)
    selected = list(rows)
    outcome: dict[int, dict[str, Any] | str] = {}
    resolve_chunk = _replay_chunk if action == "replay" else _discard_chunk
    for start in range(0, len(selected), RESOLVE_CHUNK):
        outcome |= resolve_chunk(
            chunk=selected[start : start + RESOLVE_CHUNK],
            actor=actor,
            actor_user=actor_user,
            justification=justification,
            audit_extra=audit_extra or {},
        )
    queues: set[str] = set()
    for row_id, job_id, queue_name in selected:
        what = outcome[row_id]
        if isinstance(what, dict):
            job_text = str(job_id) if job_id else None
            result.skipped.append({"dead_letter_id": row_id, "job_id": job_text, **what})
            continue
        result.resolved.append(row_id)
        if job_id is not None:
            result.job_ids.append(str(job_id))
        if what:
            result.message_ids.append(what)
        queues.add(queue_name)
    return queues


def _lap(result: ResolveResult, phase: str, since: float) -> float:
    now = time.perf_counter()
    result.seconds[phase] = round(now - since, 3)
    return now


def _count_replays(count: int) -> None:
    if count:
        metrics.DLQ_REPLAY.inc(count)


def _lock_open_rows(chunk: Sequence[tuple[int, uuid.UUID | None, str]]) -> list[DeadLetter]:
    """Lock the chunk's rows still open, in id order, with the columns a resolution reads
    (not the stored headers and x-death, which it never needs)."""
    return list(
        DeadLetter.objects.select_for_update()
        .filter(id__in=[row_id for row_id, _, _ in chunk], state=DeadLetterState.OPEN)
        .order_by("id")
        .only("id", "job_id", "reason", "queue", "message_id")
    )


def _audit_data(row: DeadLetter, digest: str, extra: dict[str, Any]) -> dict[str, Any]:
    """What a replay or discard audits about its row: which dead letter, why it died,
    which broker message it was, and the justification's digest (the text stays on the
    row: it may name people)."""
    return {
        "dead_letter_id": row.id,
        "reason": row.reason,
        "queue": row.queue,
        "message_id": row.message_id,
        "justification_sha256": digest,
        **extra,
    }


# Rows resolved per transaction: one lock statement, one audited transition per job
# type, one update of the rows. A large replay commits in chunks, so a failure half way
# leaves whole chunks done and the rest open, both consistent and retry-safe.
RESOLVE_CHUNK = 500


def _replay_chunk(
    *,
    chunk: list[tuple[int, uuid.UUID | None, str]],
    actor: Actor,
    actor_user: Any,
    justification: str,
    audit_extra: dict[str, Any],
) -> dict[int, dict[str, Any] | str]:
    """Replay one chunk in one transaction; returns, per dead letter id, why it was
    skipped (a dict) or, when its job was replayed, the row's message id ("" if none).

    1. Lock the jobs, then their rows still open (the order every writer uses).
    2. Per job type (its retry budget), one statement moves the failed jobs to
       `pending` with their `dlq_replayed` entries (and wakes the dispatcher); a job
       that is no longer `failed` is not moved and its row is skipped.
    3. One update marks the replayed rows with the actor and justification.
    """
    digest = _justification_digest(justification)
    outcome: dict[int, dict[str, Any] | str] = {}
    with transaction.atomic():
        jobs = {
            job.id: job
            for job in Job.objects.select_for_update()
            .filter(id__in=[job_id for _, job_id, _ in chunk if job_id is not None])
            .order_by("id")
            .only("id", "type", "status")
        }
        rows = {row.id: row for row in _lock_open_rows(chunk)}
        by_type: dict[str, list[DeadLetter]] = {}
        for row_id, job_id, _ in chunk:
            row = rows.get(row_id)
            if row is None or job_id not in jobs:
                outcome[row_id] = {"skipped": "already resolved"}
            elif jobs[job_id].status != Status.FAILED:
                outcome[row_id] = {"skipped": f"job is {jobs[job_id].status}, not failed"}
            else:
                by_type.setdefault(jobs[job_id].type, []).append(row)
        replayed: list[int] = []
        for job_type, type_rows in by_type.items():
            spec = get_type(job_type)
            moved = transition_many(
                job_ids=[row.job_id for row in type_rows if row.job_id is not None],
                target=Status.PENDING,
                sources=[Status.FAILED],
                actor=actor,
                event_type="dlq_replayed",
                extend_attempts=spec.max_attempts if spec is not None else 1,
                fields={
                    "dead_letter_queue": None,
                    "next_run_at": None,
                    "result": None,
                    "progress_percent": 0,
                    "progress_step": None,
                    "progress_message": None,
                },
                audit_data={
                    str(row.job_id): _audit_data(row, digest, audit_extra) for row in type_rows
                },
            )
            moved_ids = {job.id for job in moved}
            for row in type_rows:
                if row.job_id in moved_ids:
                    outcome[row.id] = row.message_id or ""
                    replayed.append(row.id)
                else:
                    outcome[row.id] = {"skipped": "job is no longer failed"}
        _resolve_rows(
            replayed,
            state=DeadLetterState.REPLAYED,
            actor_user=actor_user,
            justification=justification,
        )
    _count_replays(len(replayed))
    return outcome


def _discard_chunk(
    *,
    chunk: Sequence[tuple[int, uuid.UUID | None, str]],
    actor: Actor,
    actor_user: Any,
    justification: str,
    audit_extra: dict[str, Any],
) -> dict[int, dict[str, Any] | str]:
    """Discard one chunk in one transaction; returns, per dead letter id, why it was
    skipped (a dict) or, when it was discarded, its broker message id ("" if none).

    Jobs locked first, then their rows still open; one update closes the rows; each
    job's chain gets its `dlq_discarded` entry in one statement for the chunk (rows
    without a job: the ops chain, one entry each).
    """
    digest = _justification_digest(justification)
    with transaction.atomic():
        list(
            Job.objects.select_for_update()
            .filter(id__in=[job_id for _, job_id, _ in chunk if job_id is not None])
            .order_by("id")
            .values_list("id", flat=True)
        )
        rows = _lock_open_rows(chunk)
        _resolve_rows(
            [row.id for row in rows],
            state=DeadLetterState.DISCARDED,
            actor_user=actor_user,
            justification=justification,
        )
        entries = {row.id: _audit_data(row, digest, audit_extra) for row in rows}
        with_job = {row.job_id: entries[row.id] for row in rows if row.job_id is not None}
        if with_job:
            jobs_audit(entries=with_job, event_type="dlq_discarded", actor=actor)
        for row in rows:
            if row.job_id is None:
                audit_append(
                    chain=OPS_CHAIN, event_type="dlq_discarded", actor=actor, data=entries[row.id]
                )
    discarded = {row.id: row.message_id or "" for row in rows}
    return {
        row_id: discarded.get(row_id, {"skipped": "already resolved"}) for row_id, _, _ in chunk
    }


def _resolve_rows(ids: list[int], *, state: str, actor_user: Any, justification: str) -> None:
    if ids:
        DeadLetter.objects.filter(id__in=ids).update(
            state=state,
            resolved_by=actor_user,
            resolved_at=timezone.now(),
            justification=justification,
        )


def broker_copies_ack_resolved(*, result: ResolveResult, queues: Iterable[str]) -> None:
    """Ack away the broker copies of resolved rows in `queues` (one pass per DLQ), into
    `result`; a broker that cannot be reached leaves them for a later pass."""
    for name in sorted(q for q in queues if q in dlq_names()):
        try:
            result.broker_acked += broker_copies_ack_stale(queue=name).acked
        except Exception as exc:  # broker down: the copies stay for a later pass
            log.warning("dlq_ack_away_failed", queue=name, error=repr(exc))
            result.broker_error = f"{name}: {exc!r}"


def _publish(job_ids: list[str]) -> int:
    published = 0
    for job_id in job_ids:
        try:
            if job_publish(job_id=job_id, sources=(Status.PENDING,)):
                published += 1
        except Exception as exc:  # the dispatcher publishes whatever is left pending
            log.warning("dlq_replay_publish_deferred", job_id=job_id, error=repr(exc))
            break
    return published


# --- broker copies ----------------------------------------------------------------------


def stale_message_ids(messages: list[DecodedMessage]) -> set[str]:
    """Which broker copies in a DLQ no longer stand for an open dead letter.

    Three queries per batch, whatever its size. A copy is stale when its own row is
    resolved; or, before the watcher has recorded it, when its job has no open row and
    the copy belongs to an earlier attempt (or the job ended). A copy nothing in the
    database accounts for yet (the watcher is behind) is kept.
    """
    ids = [m.message_id for m in messages]
    by_message = dict(
        DeadLetter.objects.filter(message_id__in=ids).values_list("message_id", "state")
    )
    job_ids = {
        _uuid_or_none(m.job_id) for m in messages if m.message_id not in by_message and m.job_id
    } - {None}
    jobs = {
        str(j): (status, attempts)
        for j, status, attempts in Job.objects.filter(id__in=job_ids).values_list(
            "id", "status", "attempts"
        )
    }
    with_open = {
        str(j)
        for j in DeadLetter.objects.filter(
            job_id__in=job_ids, state=DeadLetterState.OPEN
        ).values_list("job_id", flat=True)
    }
    stale: set[str] = set()
    for m in messages:
        if m.message_id in by_message:
            if by_message[m.message_id] != DeadLetterState.OPEN:
                stale.add(m.message_id)
            continue
        job_key = str(_uuid_or_none(m.job_id)) if _uuid_or_none(m.job_id) else None
        if job_key is None or job_key not in jobs or job_key in with_open:
            continue
        status, attempts = jobs[job_key]
        if status in (Status.SUCCEEDED, Status.CANCELLED, Status.FAILED):
            stale.add(m.message_id)
        elif m.attempt is not None and (
            m.attempt < attempts or (m.attempt == attempts and status != Status.RUNNING)
        ):
            stale.add(m.message_id)
    return stale


def broker_copies_ack_stale(
    *, queue: str, max_messages: int = 100_000, connection: Any = None
) -> DrainResult:
    """One pass over a DLQ acking every copy whose dead letter is resolved (see above)."""
    return dlq_drain(
        queue=queue, decide=stale_message_ids, max_messages=max_messages, connection=connection
    )
