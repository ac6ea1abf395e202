"""Publishing jobs (docs/architecture.md#publishing): a broker confirm moves `pending` -> `queued`.

Only a broker confirm moves a job `pending` -> `queued` (or a due `retrying` ->
`queued`). A publish that fails (broker down, unroutable, nacked) leaves the job as
it was; the dispatcher publishes it later, so nothing accepted is lost. A message
can reach a worker before the confirm is recorded: the claim accepts `pending` and
`queued` alike, and a lost `-> queued` compare-and-set (zero rows) means the job
was already claimed, which is success. The message itself is `jobs.integrations.publisher`'s.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import structlog
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import Actor
from core.db import execute_prepared, model_from_row
from jobs.domain.states import Status
from jobs.domain.types import POSTGRES, get_type, postgres_queues, queue_executor
from jobs.integrations.publisher import MessageTooLarge, message_publish, messages_publish
from jobs.models import Job
from jobs.queries import QUERIES
from jobs.services.dead_letters import job_fail_with_dead_letter
from jobs.services.transitions import change, moved

log = structlog.get_logger("jobs.publishing")
PUBLISHER = Actor.system("publisher")


def job_publish(
    *,
    job_id: uuid.UUID | str,
    sources: tuple[str, ...] | None = None,
    timeout: float | None = None,
) -> bool:
    """Publish one `pending` (or due `retrying`) job now; on confirm move it to `queued`.

    For an operator's replay that asks for it, and for tools; the dispatcher publishes
    in batches (`publish_due_once`). Anything not publishable (already queued, running,
    ended, or a job of a postgres queue) is left alone and False returned. Raises when
    the broker refused or could not take the message (the job is unchanged).
    """
    sources = sources or (Status.PENDING, Status.RETRYING)
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(id=job_id, status__in=sources).first()
        # A postgres queue's job never goes through the broker: run_worker claims it.
        if job is None or queue_executor(job.queue) == POSTGRES:
            return False
        message_publish(job=job, timeout=timeout)
        _mark_queued([job])
    return True


def _mark_queued(jobs: list[Job]) -> None:
    """Compare-and-set each confirmed job `-> queued`, one statement per source status.
    A job that moved on meanwhile (a worker claimed it, a cancel) is left as it is: its
    publish still succeeded."""
    for status in {job.status for job in jobs}:
        rows = change(
            "jobs_mark_queued",
            job_ids=[job.id for job in jobs if job.status == status],
            actor=PUBLISHER,
            source=status,
        )
        moved("jobs_mark_queued", rows)


# --- the dispatcher's publish pass (docs/architecture.md) -----------------------------------------

# A job whose publish failed for a reason of its own (unroutable, refused) waits this
# long, doubling to the cap, while the rows behind it go on. Per process: a restarted
# dispatcher tries it again at once, which is only a retry sooner.
PUBLISH_BACKOFF_SECONDS = 1.0
PUBLISH_BACKOFF_CAP_SECONDS = 300.0
_backoff: dict[str, tuple[float, float]] = {}  # job id -> (retry after, current delay)
# How many jobs one confirmed batch carries (one claim, one confirm wait, one write).
PUBLISH_BATCH = 500


def _backing_off() -> list[str]:
    now = time.monotonic()
    for job_id in [j for j, (until, _) in _backoff.items() if until <= now]:
        del _backoff[job_id]
    return list(_backoff)


def _back_off(job_id: str) -> float:
    delay = min(
        PUBLISH_BACKOFF_CAP_SECONDS, _backoff.get(job_id, (0, PUBLISH_BACKOFF_SECONDS / 2))[1] * 2
    )
    _backoff[job_id] = (time.monotonic() + delay, delay)
    return delay


def publish_due_once(*, limit: int = 5000, pending_after: float | None = None) -> int:
    """Publish `pending` and due `retrying` jobs in confirmed batches; returns how many.

    Each batch is one transaction: claim up to PUBLISH_BATCH rows with `FOR UPDATE SKIP
    LOCKED` (a second dispatcher takes other rows), publish them all and wait once for
    the broker's confirms, then move the confirmed ones `-> queued` in one statement.
    The row locks are held across the publish, so no other dispatcher publishes them
    again; a worker that receives a message meanwhile waits on the lock for its claim.

    Failures are per row: a job whose type no longer exists fails with a dead letter
    (`TYPE_UNKNOWN`, replayable once the type is back), and so does one whose message
    is over JOBOPS_MAX_MESSAGE_BYTES (`MESSAGE_TOO_LARGE`: it never reaches the broker);
    one the broker refuses (e.g. unroutable) backs off while the rest of its batch is
    published. A broker that cannot be reached ends the pass (the rows stay as they
    were). The pending and the retrying pass run independently: one failing does not
    keep the other from running.
    `pending_after`: only pending jobs at least this old (default
    JOBOPS_DISPATCH_PENDING_AFTER_SECONDS).
    """
    published = 0
    errors: list[BaseException] = []
    for status in (Status.PENDING, Status.RETRYING):
        try:
            published += _publish_pass(status, limit=limit - published, pending_after=pending_after)
        except Exception as exc:
            log.error("dispatcher_publish_pass_failed", status=str(status), error=repr(exc))
            errors.append(exc)
    if errors and not published:
        raise errors[0]  # the loop reports the step as failed
    return published


def publish_overdue_once() -> int:
    """`publish_due_once` for a dispatcher beside a publisher (`run_dispatcher --role
    maintain`): the pending jobs the publisher has not taken within a second (it is
    down, or none runs), not the ones it is about to publish in its next batch."""
    return publish_due_once(
        pending_after=max(settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS, OVERDUE_SECONDS)
    )


# How long a pending job is the publisher's before a maintaining dispatcher takes it.
OVERDUE_SECONDS = 1.0


def publish_pending_once(*, limit: int = 5000) -> int:
    """The pending pass of `publish_due_once` alone: what a NOTIFY jobs_pending (a job
    created or replayed) asks the dispatcher to publish."""
    return _publish_pass(Status.PENDING, limit=limit)


def _due(status: str, *, limit: int, pending_after: float | None = None) -> list[Job]:
    """Claim due rows of `status`, skipping locked and backing-off rows and paused
    queues (due_pending_jobs, due_retrying_jobs; prepared: the dispatcher runs them
    after every NOTIFY). Pending rows per queue only as many as its broker window
    (JOBOPS_BROKER_WINDOW) has room for, highest priority first, then oldest; due
    retries oldest first."""
    before = timezone.now()
    if status == Status.PENDING:
        if pending_after is None:
            pending_after = settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS
        before -= timedelta(seconds=pending_after)
    statement = QUERIES[f"due_{status}_jobs"]
    # The postgres executor's queues are never published (run_worker claims their jobs).
    params = {
        "before": before,
        "skip": _backing_off(),
        "limit": limit,
        "skip_queues": postgres_queues(),
    }
    if status == Status.PENDING:
        params["window"] = settings.JOBOPS_BROKER_WINDOW
    rows = execute_prepared(statement, params)
    return [model_from_row(Job, row, rows.columns) for row in rows]


def _publish_pass(status: str, *, limit: int, pending_after: float | None = None) -> int:
    published = 0
    while published < limit:
        with transaction.atomic():
            jobs = _due(
                status, limit=min(PUBLISH_BATCH, limit - published), pending_after=pending_after
            )
            if not jobs:
                return published
            known = [job for job in jobs if get_type(job.type) is not None]
            for job in jobs:
                if get_type(job.type) is None:
                    _fail_unpublishable(
                        str(job.id),
                        status,
                        code="TYPE_UNKNOWN",
                        why=f"job type {job.type!r} is not configured (JOB_TYPES)",
                    )
                    log.error(
                        "job_type_unknown_dead_lettered", job_id=str(job.id), job_type=job.type
                    )
            confirmed: list[Job] = []
            if known:
                refused = messages_publish(jobs=known)
                for job_id, why in refused.items():
                    if isinstance(why, MessageTooLarge):
                        _fail_unpublishable(job_id, status, code="MESSAGE_TOO_LARGE", why=why)
                        log.error("job_message_too_large_dead_lettered", job_id=job_id, error=why)
                        continue
                    delay = _back_off(job_id)
                    log.error("job_publish_failed", job_id=job_id, error=why, retry_in=delay)
                confirmed = [job for job in known if str(job.id) not in refused]
                if confirmed:
                    _mark_queued(confirmed)
        for job in confirmed:
            _backoff.pop(str(job.id), None)
        published += len(confirmed)
        if len(jobs) < PUBLISH_BATCH:
            return published
    return published


def _fail_unpublishable(job_id: str, status: str, *, code: str, why: str) -> None:
    """A job no publish can send: its type is gone from this deployment
    (`TYPE_UNKNOWN`), or its message is over JOBOPS_MAX_MESSAGE_BYTES
    (`MESSAGE_TOO_LARGE`). It fails with a dead letter, visible and replayable once
    the cause is fixed, rather than waiting pending forever."""
    job_fail_with_dead_letter(
        job_id=job_id,
        reason="nonretryable",
        actor=Actor.system("dispatcher"),
        error_code=code,
        error_message=why[:500],
        sources=[status],
    )


# --- after a restore: the messages of the queued jobs again (docs/operations/backups.md) ---


def republish_queued(*, batch: int = PUBLISH_BATCH) -> int:
    """Publish the message of every `queued` job again, oldest first; returns how many
    the broker confirmed.

    A `queued` job lives on its message in RabbitMQ, and no pass of the dispatcher
    publishes it again: after a database restore, or a broker that lost its messages,
    nothing else would run it. `run_dispatcher --republish-queued` calls this once, at
    start. The job stays `queued` (no transition, no audit entry): should the broker
    still hold a copy, the first claim takes the job and the other copy matches no
    claim and is dropped. A job of a type this deployment lacks, or one the broker
    refuses, is logged and left `queued` for the next run.
    """
    published = 0
    after: Q = Q()
    while True:
        rows = list(
            Job.objects.filter(after, status=Status.QUEUED)
            .exclude(queue__in=postgres_queues())
            .order_by("created_at", "id")[:batch]
        )
        if not rows:
            log.info("queued_jobs_republished", count=published)
            return published
        known = [job for job in rows if get_type(job.type) is not None]
        for job in rows:
            if get_type(job.type) is None:
                log.error("job_type_unknown_not_republished", job_id=str(job.id), job_type=job.type)
        refused = messages_publish(jobs=known) if known else {}
        for job_id, why in refused.items():
            log.error("job_republish_failed", job_id=job_id, error=why)
        published += len(known) - len(refused)
        last = rows[-1]
        after = Q(created_at__gt=last.created_at) | Q(created_at=last.created_at, id__gt=last.id)
