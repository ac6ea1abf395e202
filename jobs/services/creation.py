"""Creating jobs (docs/architecture.md): validation, idempotency keys, and the API's submit.

`job_create` is the one way a job comes to be (API, command line, tests); `job_submit`
adds what the API's create answers with on top: backpressure, and a conflict turned
into a 409 the client can retry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Required, TypedDict, Unpack

import structlog
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from audit.canonical import canonical_bytes
from audit.services import Actor
from core.errors import ApplicationError
from core.json import json_problem
from core.logging import bind_request_context
from core.tracing import current_traceparent
from jobs.domain.exceptions import (
    ConnectorOpenError,
    IdempotencyKeyInvalidError,
    IdempotencyMismatchError,
    JobConflictError,
    JobParamsInvalidError,
    JobPriorityInvalidError,
    JobRunAtInvalidError,
    JobTypeUnknownError,
    PayloadTooLargeError,
)
from jobs.domain.params import params_secret_check
from jobs.domain.states import Status
from jobs.domain.types import get_type
from jobs.integrations import metrics
from jobs.integrations.backpressure import BackpressureError, backpressure_check
from jobs.integrations.ratelimit import job_create_org_rate_limit
from jobs.models import Job
from jobs.selectors import job_key_exists
from jobs.services.annotations import AUDIT_ENRICHMENT, annotation_target_check
from jobs.services.connectors import connector_create_check
from jobs.services.keys import job_key_repeat, job_release_idempotency_keys
from jobs.services.transitions import job_insert
from tenants.selectors import Placement, actor_for, placement_for

log = structlog.get_logger("jobs.services")
_PRINTABLE_ASCII = frozenset(chr(c) for c in range(0x20, 0x7F))
# A run_at this far in the past still runs now: the client's clock may run behind ours
# (DESIGN 15.2); further back is a mistake the client should hear about.
RUN_AT_DRIFT = timedelta(seconds=60)


def params_hash(job_type: str, params: Any) -> str:
    return hashlib.sha256(canonical_bytes({"type": job_type, "params": params})).hexdigest()


def validate_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or not set(key) <= _PRINTABLE_ASCII:
        raise IdempotencyKeyInvalidError(
            "Idempotency keys are 1 to 255 printable ASCII characters.",
            details={"idempotency_key": ["1 to 255 printable ASCII characters."]},
        )
    return key


def idempotency_mismatch(
    stored: Mapping[str, Any], *, params_hash: str, project_id: int | None
) -> IdempotencyMismatchError | None:
    """The error a repeat of a key answers when the job it made (`stored`: its id,
    params_hash and project_id) was asked with other `params_hash` or in another
    `project_id`; None for a true repeat. The project is part of the key's fingerprint,
    compared on the stored job rather than folded into params_hash: every hash stored
    before keeps matching, and the unique index (organisation, owner, key) stays."""
    job_id = str(stored["id"])
    if stored["params_hash"] != params_hash:
        return IdempotencyMismatchError(details={"job_id": job_id})
    if stored["project_id"] != project_id:
        return IdempotencyMismatchError(
            "This idempotency key was already used in another project.",
            details={"job_id": job_id, "project_id": stored["project_id"]},
        )
    return None


def validate_run_at(run_at: datetime | None, *, now: datetime) -> datetime | None:
    """Check a job's `run_at` against `now` (docs/operator-controls.md#scheduled-jobs):
    an aware datetime at most JOBOPS_MAX_SCHEDULE_AHEAD days ahead and at most
    RUN_AT_DRIFT in the past. Returns it unchanged (None: run at once)."""
    if run_at is None:
        return None
    if not isinstance(run_at, datetime) or run_at.utcoffset() is None:
        raise JobRunAtInvalidError(
            details={"run_at": ["An RFC 3339 date-time with an offset (Z or +01:00)."]}
        )
    days = settings.JOBOPS_MAX_SCHEDULE_AHEAD
    if run_at > now + timedelta(days=days):
        raise JobRunAtInvalidError(
            f"run_at is more than {days} days ahead.",
            details={"run_at": [f"At most {days} days ahead (JOBOPS_MAX_SCHEDULE_AHEAD)."]},
        )
    if run_at < now - RUN_AT_DRIFT:
        raise JobRunAtInvalidError(
            "run_at is in the past.",
            details={"run_at": ["In the past by more than 60 seconds."]},
        )
    return run_at


def validate_params(
    job_type: str,
    params: Any,
    *,
    owner: Any = None,
    staff: bool = False,
    org_id: int | None = None,
    readers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Check type and params against the types table; return the params to store.

    What is stored (and what the handler receives) is the schema's validated value:
    `{"steps": "20.0"}` becomes `{"steps": 20}`, defaults are filled in. Params that
    hold a secret are refused first (params_secret_check).

    `org_id`: the organisation the job goes in (`context["org_id"]`: a schema that names
    what belongs to an organisation, such as an upload, checks it is this one's).

    `readers`: the params serializers already made for this owner and staff, by type
    and organisation, filled here; a batch passes one dict for all its jobs (DRF
    deep-copies a serializer's fields for each instance: half of what reading a job cost).
    """
    spec = get_type(job_type) if isinstance(job_type, str) else None
    if spec is None:
        raise JobTypeUnknownError(
            f"Unknown job type {job_type!r}.",
            details={"type": [f"One of: {', '.join(sorted(settings.JOB_TYPES))}."]},
        )
    if not isinstance(params, dict):
        raise JobParamsInvalidError(details={"params": ["Must be a JSON object."]})
    problem = json_problem(params, max_depth=settings.JOBOPS_MAX_JSON_DEPTH)
    if problem:
        raise JobParamsInvalidError(details={"params": [f"Not storable JSON: it {problem}."]})
    try:
        encoded = canonical_bytes(params)
    except Exception as exc:  # rfc8785 refuses NaN, huge ints, non-string keys
        raise JobParamsInvalidError(details={"params": [f"Not canonical JSON: {exc}"]}) from exc
    if len(encoded) > settings.JOBOPS_MAX_PAYLOAD_BYTES:
        raise PayloadTooLargeError(
            f"params exceed {settings.JOBOPS_MAX_PAYLOAD_BYTES} bytes; "
            "pass large inputs by reference"
        )
    # Before the schema: a secret is refused as a secret (ERR-JOB-PARAMS-SECRET), not
    # as the unknown field it also is in a strict schema.
    params_secret_check(params, schema=spec.load_params_serializer())
    context = {"spec": spec, "owner": owner, "staff": staff, "org_id": org_id}
    if readers is None:
        serializer = spec.load_params_serializer()(data=params, context=context)
        if not serializer.is_valid():
            raise JobParamsInvalidError(details=serializer.errors)
        return dict(serializer.validated_data)
    reader_key = f"{spec.name}:{org_id}"  # a batch may place its jobs in several
    reader = readers.get(reader_key)
    if reader is None:
        reader = readers[reader_key] = spec.load_params_serializer()(context=context)
    try:
        return dict(reader.run_validation(params))
    except ValidationError as exc:  # what is_valid() keeps as the errors
        raise JobParamsInvalidError(details=exc.detail) from exc


# docs/operator-controls.md#priority: 0-9, higher first; 8 and 9 are a small lane for
# staff (an operator's urgent rerun), so that no client makes all its work jump the line.
DEFAULT_PRIORITY = 5
MAX_PRIORITY = 9
MAX_UNPRIVILEGED_PRIORITY = 7


def validate_priority(priority: Any, *, staff: bool) -> int:
    """The job's priority, or JobPriorityInvalidError (422, per-field detail): an
    integer 0-9 (not a bool), above 7 only with staff powers."""
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not (0 <= priority <= MAX_PRIORITY)
    ):
        raise JobPriorityInvalidError(
            "The priority must be an integer from 0 to 9.",
            details={"priority": ["An integer from 0 to 9."]},
        )
    if priority > MAX_UNPRIVILEGED_PRIORITY and not staff:
        raise JobPriorityInvalidError(
            details={"priority": ["Above 7 only with staff powers (8 and 9 are staff's lane)."]}
        )
    return priority


class JobRequest(TypedDict, total=False):
    """What a new job is asked for, by whoever asks (`job_create`, the API's
    `job_submit`): its owner, type and params; an idempotency key; the request and
    correlation ids it answers to; the caller's staff powers (`staff`: the staff-only
    params and the staff priority lane); when it runs (`run_at`, None: now) and its
    priority (DEFAULT_PRIORITY when not given)."""

    owner: Required[Any]
    job_type: Required[str]
    params: Required[Any]
    idempotency_key: str | None
    request_id: str | None
    correlation_id: str | None
    staff: bool
    run_at: datetime | None
    priority: int


def job_candidate(
    *,
    placement: Placement,
    now: datetime,
    rerun_of: Job | None = None,
    readers: dict[str, Any] | None = None,
    **request: Unpack[JobRequest],
) -> Job:
    """The unsaved job `request` (JobRequest) asks for in `placement`, its input
    validated (type, params, priority, key, run_at; and an audit-enrichment job's target,
    jobs.services.annotations; nothing is written for bad input: the ApplicationError of
    the first bad field): what `job_create` inserts, and each
    item of a batch create (jobs.services.batch_creation), which passes `readers`
    (validate_params)."""
    owner, job_type, staff = request["owner"], request["job_type"], request.get("staff", False)
    params = validate_params(
        job_type,
        request["params"],
        owner=owner,
        staff=staff,
        org_id=placement.org_id,
        readers=readers,
    )
    spec = get_type(job_type)
    assert spec is not None  # validate_params refuses an unknown type
    if spec.category == AUDIT_ENRICHMENT:
        annotation_target_check(owner=owner, staff=staff, org_id=placement.org_id, params=params)
    priority = validate_priority(request.get("priority", DEFAULT_PRIORITY), staff=staff)
    idempotency_key = validate_idempotency_key(request.get("idempotency_key"))
    run_at = validate_run_at(request.get("run_at"), now=now)
    request_id = request.get("request_id")
    scheduled = run_at is not None and run_at > now
    return Job(
        type=job_type,
        category=spec.category,
        queue=spec.queue,
        params=params,
        params_hash=params_hash(job_type, params),
        status=Status.SCHEDULED if scheduled else Status.PENDING,
        run_at=run_at,
        owner=owner,
        org_id=placement.org_id,
        project_id=placement.project_id,
        idempotency_key=idempotency_key,
        # The key's TTL counts from the later of creation and run_at: a key must outlive
        # its job's run (a retried create of a job due in a month is still a repeat).
        idempotency_expires_at=(
            max(now, run_at or now) + spec.key_ttl if idempotency_key else None
        ),
        max_attempts=spec.max_attempts,
        priority=priority,
        request_id=request_id,
        correlation_id=request.get("correlation_id") or request_id,
        traceparent=current_traceparent(),
        rerun_of=rerun_of,
    )


def job_create(
    *,
    actor: Actor | None = None,
    placement: Placement | None = None,
    rerun_of: Job | None = None,
    **request: Unpack[JobRequest],
) -> tuple[Job, bool]:
    """Create a job, or return the one this idempotency key already made (`request`:
    JobRequest).

    `run_at` (validate_run_at): a future one creates the job `scheduled`, and the
    dispatcher's schedule step moves it to `pending` when due; one up to a minute past
    runs now. A repeat of the key returns the existing job whatever its run_at.

    `rerun_of`: the finished job an operator re-runs (jobs.services.rerun); the new
    job names it, and so does its `created` entry.

    `placement` is the job's organisation and project (tenants.selectors.placement_for:
    the API resolves it from the caller and the body); without one, the owner's only
    organisation.

    `priority` (0-9, docs/operator-controls.md#priority) orders the queue's pending
    jobs into the broker window; above 7 only with `staff`.

    `staff` grants the staff-only params (e.g. a report on every owner's jobs): the API
    passes its caller's staff powers (staff with a verified second factor), the command
    line the owner's own staff flag (its caller already holds the host).

    1. Validate type, params and key (nothing is written for bad input).
    2. One statement: INSERT ... ON CONFLICT DO NOTHING with the `created` entry, the
       event and NOTIFY jobs_pending (jobs.services.transitions.job_insert); the
       dispatcher publishes the job.
    3. Nothing inserted: read the row by (owner, key), with its artefacts. A different
       (type, params) or project under the same key is a mismatch error; a key past its retention
       (or released meanwhile) is free, and the insert runs again. A repeat within
       the TTL marks the key seen in that read (jobs.services.keys.job_key_repeat).
    Returns (job, created).
    """
    owner, job_type = request["owner"], request["job_type"]
    spec = get_type(job_type) if isinstance(job_type, str) else None
    # The organisation first: every outcome below counts under its `org` label (when
    # the deployment has one: jobs.integrations.metrics.org_label).
    placement = placement or placement_for(owner)
    # A client-chosen type string never becomes a label: unknown types count as one.
    counter = partial(
        metrics.JOB_CREATE.labels,
        type=spec.name if spec else "unknown",
        **metrics.org_label(placement.org_id),
    )
    now = timezone.now()
    try:
        candidate = job_candidate(placement=placement, now=now, rerun_of=rerun_of, **request)
    except ApplicationError:
        counter(status="rejected").inc()
        raise
    assert spec is not None
    digest, idempotency_key = candidate.params_hash, candidate.idempotency_key
    actor = actor or actor_for(owner)
    for _ in range(2):
        # One statement: the row, its `created` entry and event, and the NOTIFY that
        # wakes a dispatcher to publish it. The request never waits on the broker.
        if job_insert(candidate, actor=actor):
            transaction.on_commit(counter(status="created").inc)
            transaction.on_commit(
                metrics.JOBS_ENQUEUED.labels(**metrics.jobs_labels(spec.name)).inc
            )
            log.info("job_created", job_id=str(candidate.id), job_type=job_type, queue=spec.queue)
            return candidate, True
        if idempotency_key is None:
            raise JobConflictError()  # only a job id collision inserts nothing: retry
        # The key was taken: concurrent identical requests all read the one winner (with
        # its artefacts, which the answer lists).
        job = job_key_repeat(
            owner=owner,
            org_id=placement.org_id,
            key=idempotency_key,
            params_hash=digest,
            project_id=candidate.project_id,
            now=now,
        )
        if job is None:
            continue  # the key was released since the insert: it is free again
        if job.idempotency_expires_at and job.idempotency_expires_at <= now:
            job_release_idempotency_keys(job_ids=[job.id])
            continue
        stored = {"id": job.id, "params_hash": job.params_hash, "project_id": job.project_id}
        mismatch = idempotency_mismatch(stored, params_hash=digest, project_id=candidate.project_id)
        if mismatch is not None:
            counter(status="mismatch").inc()
            raise mismatch
        counter(status="existing").inc()
        return job, False
    raise JobConflictError()  # the released key was taken again meanwhile: retry


def job_submit(
    *,
    org: str | None = None,
    project: str | None = None,
    org_counted: int | None = None,
    **request: Unpack[JobRequest],
) -> tuple[Job, bool]:
    """The API's create (docs/api.md#creating-a-job): `job_create` of the same
    `request` (JobRequest) behind backpressure; `org` and `project` the slugs the
    caller named (docs/tenancy.md).

    0. The organisation and project: the caller's only one, or the one it names; a
       suspended organisation takes no new jobs (403), a project of another
       organisation is a 422. The request's log lines name them from here on, and the
       organisation's rate limit counts the create (429, details.limit `org`;
       docs/tenancy.md#limits) unless the throttle counted it already (`org_counted`:
       the organisation of a caller in only one).
    1. Backpressure: a queue known to be deeper than its limit refuses new work (429),
       and so does a type that opted in while its connector's breaker is open (409
       ERR-CONNECTOR-OPEN, docs/connectors.md); a repeat of an existing key makes no
       new work and is answered anyway.
    2. Create (or find) the job; a database conflict (e.g. a key released and reused
       concurrently) is a 409 the client can retry.
    3. A job created here has no artefacts yet: say so, so that rendering it costs no
       query.
    Returns (job, created).
    """
    owner, job_type = request["owner"], request["job_type"]
    idempotency_key = request.get("idempotency_key")
    placement = placement_for(owner, org=org, project=project)
    bind_request_context(org_id=placement.org_id, project_id=placement.project_id)
    if placement.org_id != org_counted:
        job_create_org_rate_limit(org_id=placement.org_id)
    spec = get_type(job_type) if isinstance(job_type, str) else None
    if spec is not None:
        try:
            backpressure_check(queue=spec.queue)
            connector_create_check(spec=spec)
        except (BackpressureError, ConnectorOpenError):
            if idempotency_key is None or not job_key_exists(
                owner=owner, org_id=placement.org_id, key=idempotency_key
            ):
                raise
    try:
        job, created = job_create(placement=placement, **request)
    except IntegrityError as exc:
        raise JobConflictError() from exc
    if created:
        job.artefact_list = []  # type: ignore[attr-defined]
    return job, created
