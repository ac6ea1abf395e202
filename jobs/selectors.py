"""Reads for jobs. Visibility lives here: a job is its owner's, and staff see all.

Anyone else is answered as if the job did not exist (404, never 403), so that ids
cannot be probed.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import OuterRef, QuerySet
from django.db.models.functions import JSONObject

from jobs.exceptions import JobNotFoundError
from jobs.models import Artefact, Job


def job_visible_queryset(*, user: Any) -> QuerySet[Job]:
    jobs = Job.objects.all()
    if not user.is_staff:
        jobs = jobs.filter(owner_id=user.pk)
    return jobs


def job_version_for_user(*, job_id: uuid.UUID, user: Any) -> int | None:
    """The job's version (its ETag) or None: one indexed row, no body, no artefacts.

    This is all a conditional GET needs to answer 304.
    """
    return (
        job_visible_queryset(user=user).filter(id=job_id).values_list("version", flat=True).first()
    )


# An artefact's fields as the job body shows them, aggregated into the job's own query.
_ARTEFACT_JSON = JSONObject(
    id="id", kind="kind", name="name", content_type="content_type", sha256="sha256", size="size"
)


def job_get_for_user(*, job_id: uuid.UUID, user: Any) -> Job:
    """The job with its artefacts (the body lists them), or JobNotFoundError.

    One query: the artefacts come as a JSON array of the same row and are kept as
    `job.artefact_list`, which the body serializer reads before `job.artefacts`.
    """
    artefacts = (
        Artefact.objects.filter(job_id=OuterRef("id"))
        .order_by("kind", "name")
        .values(json=_ARTEFACT_JSON)
    )
    job = (
        job_visible_queryset(user=user)
        .annotate(artefact_rows=ArraySubquery(artefacts))
        .filter(id=job_id)
        .first()
    )
    if job is None:
        raise JobNotFoundError()
    job.artefact_list = [  # type: ignore[attr-defined]
        Artefact(job_id=job.id, **row)
        for row in job.artefact_rows  # type: ignore[attr-defined]
    ]
    return job


def job_list_for_user(
    *,
    user: Any,
    status: str | None = None,
    job_type: str | None = None,
    created_after: datetime | None = None,
) -> QuerySet[Job]:
    """The caller's jobs (every job for staff), filtered; ordered by the paginator."""
    jobs = job_visible_queryset(user=user).prefetch_related("artefacts")
    if status:
        jobs = jobs.filter(status=status)
    if job_type:
        jobs = jobs.filter(type=job_type)
    if created_after:
        jobs = jobs.filter(created_at__gt=created_after)
    return jobs


def artefact_get_for_user(*, job_id: uuid.UUID, artefact_id: uuid.UUID, user: Any) -> Artefact:
    """An artefact of a job the caller may see; another job's artefact id is not found."""
    artefact = Artefact.objects.filter(
        id=artefact_id, job_id=job_id, job__in=job_visible_queryset(user=user)
    ).first()
    if artefact is None:
        raise JobNotFoundError("No such artefact.")
    return artefact


def job_key_exists(*, owner: Any, key: str) -> bool:
    """Whether `owner` already made a job under this idempotency key (a repeat)."""
    return Job.objects.filter(owner_id=owner.pk, idempotency_key=key).exists()


def job_get(*, job_id: uuid.UUID | str) -> Job:
    """Any job by id, with its artefacts: for operators' commands, which see every job."""
    job = Job.objects.prefetch_related("artefacts").filter(id=job_id).first()
    if job is None:
        raise JobNotFoundError(f"No job {job_id}.")
    return job
