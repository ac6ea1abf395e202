"""Creating jobs in a batch (docs/api.md#creating-jobs-in-a-batch): many creates of
`job_submit`'s rules in one request, one rate-limit take and one statement.

Each item is answered on its own (created, existing, or its error), in the batch's
order; the batch as a whole fails only when the rate limit refuses it (429, nothing
taken) or the database fails (nothing created: one transaction).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from audit.services import Actor
from core.errors import ApplicationError
from jobs.domain.create_input import JobCreateInputSerializer
from jobs.domain.exceptions import (
    BadRequestError,
    ConnectorOpenError,
    IdempotencyMismatchError,
    JobConflictError,
)
from jobs.domain.types import get_type
from jobs.integrations import metrics
from jobs.integrations.backpressure import BackpressureError, backpressure_check
from jobs.integrations.ratelimit import RateDecision, job_batch_rate_limit
from jobs.models import Job
from jobs.queries import QUERIES
from jobs.selectors import job_key_exists
from jobs.services.connectors import connector_create_check
from jobs.services.creation import DEFAULT_PRIORITY, idempotency_mismatch, job_candidate
from jobs.services.keys import job_release_idempotency_keys
from jobs.services.transitions import jobs_insert
from tenants.selectors import Placement, actor_for, memberships_of, placement_for

log = structlog.get_logger("jobs.services")

# How many digits a derived key's index takes at most (`<key>:<index>`): the request's
# key leaves room for them within a key's 255 characters.
MAX_INDEX_DIGITS = 6


@dataclass(frozen=True)
class BatchItem:
    """One job of a batch, as the API's (or the command line's) input read it: the
    fields of a single create (JobRequest), `org` and `project` the slugs it names."""

    job_type: str
    params: Any
    idempotency_key: str | None = None
    run_at: datetime | None = None
    priority: int = DEFAULT_PRIORITY
    org: str | None = None
    project: str | None = None


@dataclass
class BatchOutcome:
    """What became of item `index`: its job (`created` or an existing one) or its error."""

    index: int
    job_id: uuid.UUID | None = None
    created: bool = False
    error: ApplicationError | None = None

    @property
    def status(self) -> str:
        if self.error is not None:
            return "error"
        return "created" if self.created else "existing"


def batch_items_read(raws: Sequence[Any]) -> list[BatchItem | ApplicationError]:
    """Each job of a batch read as the body of a single create (its input serializer,
    jobs.domain.create_input): a BatchItem, or the 400 that body would have had (not an
    object, an unknown or mistyped field). The API and `submit_job --file` read alike.
    One serializer reads them all, as DRF's ListSerializer does: a new one per job
    deep-copies its fields each time (0.4 ms a job)."""
    reader = JobCreateInputSerializer()
    items: list[BatchItem | ApplicationError] = []
    for raw in raws:
        try:
            data = reader.run_validation(raw)
        except ValidationError as exc:
            # A null job fails before the serializer keys its error (as is_valid() does).
            detail = (
                exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
            )
            items.append(BadRequestError("The job is invalid.", details=dict(detail)))
            continue
        items.append(
            BatchItem(
                job_type=data["type"],
                params=data["params"],
                idempotency_key=data.get("idempotency_key"),
                run_at=data.get("run_at"),
                priority=data.get("priority", DEFAULT_PRIORITY),
                org=data.get("org"),
                project=data.get("project"),
            )
        )
    return items


def batch_item_key(item_key: str | None, request_key: str | None, index: int) -> str | None:
    """An item's idempotency key: its own, else the request's with its index
    (`<key>:<index>`), so that a retried batch makes nothing twice; None without either."""
    if item_key is not None:
        return item_key
    return f"{request_key}:{index}" if request_key is not None else None


def job_batch_submit(
    *,
    owner: Any,
    items: Sequence[BatchItem | ApplicationError],
    request_key: str | None = None,
    staff: bool = False,
    request_id: str | None = None,
    correlation_id: str | None = None,
    actor: Actor | None = None,
    limits: bool = True,
) -> tuple[list[BatchOutcome], RateDecision | None]:
    """Create the jobs of a batch (`items`: an item, or the error its input already
    had), each as `job_submit` would. Returns an outcome per item in order, and the
    rate-limit decision (None: the store did not answer, or `limits` is off).

    `limits` False (the command line, whose caller holds the host): no rate limit and
    no backpressure or connector refusal, as its single create (`job_create`).

    1. Each item's organisation and project (tenants.selectors.placement_for: a
       suspended organisation, another's project: that item's error).
    2. The rate limit takes every item at once: the caller's and the global bucket
       len(items) tokens, each organisation's bucket its items (docs/tenancy.md#limits),
       or nothing, and the batch is refused whole (RateLimitExceededError, 429).
    3. Each item validated as a single create (jobs.services.creation.job_candidate),
       then backpressure and connector checks by queue and type, a repeat of an existing
       key answered anyway (as job_submit).
    4. Items repeating a key of an earlier item (same organisation) answer as that item
       when their params and project are the same, else with the mismatch error (422).
    5. One transaction: one INSERT of every new job with its entries, events and one
       NOTIFY (jobs_insert_batch), then one read of the jobs whose keys were taken
       (jobs_repeat_by_keys). A key past its TTL is released and its item inserted
       again. A database error fails the whole request, nothing created.
    """
    outcomes = [BatchOutcome(index=index) for index in range(len(items))]
    placed = _placed(owner, items, outcomes)
    memberships = memberships_of(owner)
    # A caller in one organisation: every item counts there, whatever it named.
    org_counts = (
        {memberships[0].org_id: len(items)}
        if len(memberships) == 1
        else dict(Counter(placement.org_id for _, _, placement in placed))
    )
    decision = (
        job_batch_rate_limit(user_id=owner.pk, count=len(items), org_counts=org_counts)
        if limits
        else None
    )
    now = timezone.now()
    readers: dict[str, Any] = {}  # one params serializer per type, for every job
    candidates: list[tuple[int, Job]] = []
    for index, item, placement in placed:
        try:
            job = job_candidate(
                placement=placement,
                now=now,
                readers=readers,
                owner=owner,
                job_type=item.job_type,
                params=item.params,
                idempotency_key=batch_item_key(item.idempotency_key, request_key, index),
                run_at=item.run_at,
                priority=item.priority,
                staff=staff,
                request_id=request_id,
                correlation_id=correlation_id,
            )
        except ApplicationError as exc:
            _count(item.job_type, placement.org_id, "rejected")
            outcomes[index].error = exc
            continue
        candidates.append((index, job))
    if limits:
        candidates = _admitted(owner, candidates, outcomes)
    primaries, repeats = _first_of_each_key(candidates)
    try:
        with transaction.atomic():
            _insert(primaries, outcomes, actor=actor or actor_for(owner), now=now)
    except IntegrityError as exc:  # e.g. a key released and taken again concurrently
        raise JobConflictError() from exc
    _answer_repeats(repeats, primaries, outcomes)
    created = [job for index, job in primaries if outcomes[index].created]
    for job in created:
        transaction.on_commit(metrics.JOB_CREATE.labels(**_labels(job, "created")).inc)
        transaction.on_commit(metrics.JOBS_ENQUEUED.labels(**metrics.jobs_labels(job.type)).inc)
    log.info("jobs_batch_created", items=len(items), created=len(created))
    return outcomes, decision


def _placed(
    owner: Any, items: Sequence[BatchItem | ApplicationError], outcomes: list[BatchOutcome]
) -> list[tuple[int, BatchItem, Placement]]:
    """Each valid item with its placement; an item that has none gets its error. One
    lookup per distinct (org, project): a batch names a handful."""
    resolved: dict[tuple[str | None, str | None], Placement | ApplicationError] = {}
    placed = []
    for index, item in enumerate(items):
        if isinstance(item, ApplicationError):
            outcomes[index].error = item
            continue
        where = (item.org, item.project)
        if where not in resolved:
            try:
                resolved[where] = placement_for(owner, org=item.org, project=item.project)
            except ApplicationError as exc:
                resolved[where] = exc
        placement = resolved[where]
        if isinstance(placement, ApplicationError):
            outcomes[index].error = placement
        else:
            placed.append((index, item, placement))
    return placed


def _admitted(
    owner: Any, candidates: list[tuple[int, Job]], outcomes: list[BatchOutcome]
) -> list[tuple[int, Job]]:
    """The candidates backpressure and the connectors let through (job_submit's step 1,
    checked once per type): a refused one gets the refusal, unless its key already made
    a job (a repeat makes no new work)."""
    refusals: dict[str, ApplicationError | None] = {}
    admitted = []
    for index, job in candidates:
        if job.type not in refusals:
            spec = get_type(job.type)
            assert spec is not None
            try:
                backpressure_check(queue=spec.queue)
                connector_create_check(spec=spec)
                refusals[job.type] = None
            except (BackpressureError, ConnectorOpenError) as exc:
                refusals[job.type] = exc
        refusal = refusals[job.type]
        if refusal is not None and (
            job.idempotency_key is None
            or not job_key_exists(owner=owner, org_id=job.org_id, key=job.idempotency_key)
        ):
            outcomes[index].error = refusal
            continue
        admitted.append((index, job))
    return admitted


def _first_of_each_key(
    candidates: list[tuple[int, Job]],
) -> tuple[list[tuple[int, Job]], list[tuple[int, Job, int]]]:
    """The candidates to insert (the first of each key in its organisation, and every
    one without a key), and the later ones repeating a key: (index, job, the first's
    index)."""
    first: dict[tuple[int, str], int] = {}
    primaries, repeats = [], []
    for index, job in candidates:
        if job.idempotency_key is None:
            primaries.append((index, job))
            continue
        where = (job.org_id, job.idempotency_key)
        if where in first:
            repeats.append((index, job, first[where]))
        else:
            first[where] = index
            primaries.append((index, job))
    return primaries, repeats


def _insert(
    pending: list[tuple[int, Job]], outcomes: list[BatchOutcome], *, actor: Actor, now: datetime
) -> None:
    """Insert `pending` (in the caller's transaction) and answer each: created, the
    existing job of its key, or the mismatch. A key found past its TTL, or released
    meanwhile, is free: its items are inserted once more (as job_create does)."""
    for _ in range(2):
        if not pending:
            return
        inserted = jobs_insert([job for _, job in pending], actor=actor)
        taken = [(index, job) for index, job in pending if job.id not in inserted]
        for index, job in pending:
            if job.id in inserted:
                outcomes[index].job_id, outcomes[index].created = job.id, True
        pending = []
        found = _repeats_by_key(taken, now=now)
        expired = []
        for index, job in taken:
            row = found.get((job.org_id, job.idempotency_key))  # type: ignore[arg-type]
            if job.idempotency_key is None:
                outcomes[index].error = JobConflictError()  # only an id collision
            elif row is None:
                pending.append((index, job))  # released since the insert: free again
            elif row["idempotency_expires_at"] and row["idempotency_expires_at"] <= now:
                expired.append(row["id"])
                pending.append((index, job))
            elif mismatch := idempotency_mismatch(
                row, params_hash=job.params_hash, project_id=job.project_id
            ):
                _count(job.type, job.org_id, "mismatch")
                outcomes[index].error = mismatch
            else:
                _count(job.type, job.org_id, "existing")
                outcomes[index].job_id = row["id"]
        if expired:
            job_release_idempotency_keys(job_ids=expired)
    for index, _ in pending:
        outcomes[index].error = JobConflictError()  # released keys taken again meanwhile


def _repeats_by_key(taken: list[tuple[int, Job]], *, now: datetime) -> dict[tuple[int, str], Any]:
    """The existing jobs of the keys in `taken`, in one statement (jobs_repeat_by_keys),
    by (organisation, key): their id, params_hash, project and expiry."""
    keyed = [job for _, job in taken if job.idempotency_key is not None]
    if not keyed:
        return {}
    owner_id = keyed[0].owner_id
    params: dict[str, Any] = {
        "owner": owner_id,
        "orgs": [job.org_id for job in keyed],
        "keys": [job.idempotency_key for job in keyed],
        "hashes": [job.params_hash for job in keyed],
        "projects": [job.project_id for job in keyed],
        "now": now,
    }
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["jobs_repeat_by_keys"], params)
        names = [column.name for column in cursor.description]
        return {
            (row["org_id"], row["idempotency_key"]): row
            for row in (dict(zip(names, values, strict=True)) for values in cursor.fetchall())
        }


def _answer_repeats(
    repeats: list[tuple[int, Job, int]],
    primaries: list[tuple[int, Job]],
    outcomes: list[BatchOutcome],
) -> None:
    """A later item with an earlier item's key answers as a repeat of it: the same job
    (`existing`: the item made nothing) with the same params and project, else the
    mismatch (422)."""
    fingerprints = {index: (job.params_hash, job.project_id) for index, job in primaries}
    for index, job, first in repeats:
        answer, outcome = outcomes[first], outcomes[index]
        if fingerprints[first] != (job.params_hash, job.project_id):
            _count(job.type, job.org_id, "mismatch")
            details: dict[str, Any] = {"index": first}
            if answer.job_id is not None:
                details["job_id"] = str(answer.job_id)
            outcome.error = IdempotencyMismatchError(
                "This idempotency key was used by an earlier item of the batch with a "
                "different type, params or project.",
                details=details,
            )
        elif answer.error is not None:
            outcome.error = answer.error
        else:
            _count(job.type, job.org_id, "existing")
            outcome.job_id = answer.job_id


def _labels(job: Job, status: str) -> dict[str, str]:
    return {"type": job.type, "status": status, **metrics.org_label(job.org_id)}


def _count(job_type: Any, org_id: int | None, status: str) -> None:
    spec = get_type(job_type) if isinstance(job_type, str) else None
    metrics.JOB_CREATE.labels(
        type=spec.name if spec else "unknown", status=status, **metrics.org_label(org_id)
    ).inc()
