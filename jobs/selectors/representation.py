"""One representation of a job: its public body, and the job fields of its events.

The API answers with the body (docs/api.md#the-job-body; JobOutputSerializer is its
schema), `manage.py job_status --json` prints it, and the admin's job page links the
same fields. `JOB_BODY` is the one list of its fields, in order, with how each is read
from the job; the job.status.changed event carries the fields of `EVENT_FIELDS`, built
from the job's row by the SQL function jobs_status_event (jobs/migrations/0014).
tests/jobs/test_representation.py pins both lists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.urls import reverse
from rest_framework import serializers

from jobs.models import Artefact, Job

_DATETIME = serializers.DateTimeField()


def _datetime(value: Any) -> str | None:
    return None if value is None else _DATETIME.to_representation(value)


def job_progress(job: Job) -> dict[str, Any]:
    return {
        "percent": job.progress_percent,
        "step": job.progress_step,
        "message": job.progress_message,
        "updated_at": _datetime(job.progress_updated_at),
        "attempt": job.progress_attempt,
        "metrics": job.progress_metrics,
    }


def job_last_error(job: Job) -> dict[str, Any] | None:
    if not job.last_error_code and not job.last_error_message:
        return None
    return {"code": job.last_error_code, "message": job.last_error_message}


def job_artefacts(job: Job) -> Any:
    # The selectors read them with the job (`artefact_list`); else the relation.
    artefacts = getattr(job, "artefact_list", None)
    return job.artefacts.all() if artefacts is None else artefacts


def artefact_url(artefact: Artefact, request: Any = None) -> str:
    path = reverse(
        "api:job-artefact", kwargs={"job_id": artefact.job_id, "artefact_id": artefact.id}
    )
    return request.build_absolute_uri(path) if request else path


# An artefact's body (an element of the job body's `artefacts`), in order, each with how
# it is read (artefact, request): the one place it is built. ArtefactOutputSerializer is
# its schema (tests/jobs/test_representation.py holds the two to the same fields); the
# stored fields it reads come with the job from jobs_artefacts_json (jobs/sql/artefacts.sql).
ARTEFACT_BODY: dict[str, Callable[[Artefact, Any], Any]] = {
    "id": lambda a, request: str(a.id),
    "kind": lambda a, request: a.kind,
    "name": lambda a, request: a.name,
    "content_type": lambda a, request: a.content_type,
    "s3_key": lambda a, request: a.file.name,
    "sha256": lambda a, request: a.sha256,
    "size": lambda a, request: a.size,
    "url": artefact_url,
}
ARTEFACT_FIELDS = tuple(ARTEFACT_BODY)


def artefact_body(artefact: Artefact, request: Any = None) -> dict[str, Any]:
    """One artefact as the job body lists it."""
    return {name: read(artefact, request) for name, read in ARTEFACT_BODY.items()}


def _artefact_bodies(job: Job, request: Any) -> list[dict[str, Any]]:
    return [artefact_body(a, request) for a in job_artefacts(job)]


# The job body's fields in their order, each with how it is read (job, request).
JOB_BODY: dict[str, Callable[[Job, Any], Any]] = {
    "id": lambda job, request: str(job.id),
    "type": lambda job, request: job.type,
    "category": lambda job, request: job.category,
    "queue": lambda job, request: job.queue,
    "org_id": lambda job, request: job.org_id,
    "project_id": lambda job, request: job.project_id,
    "status": lambda job, request: job.status,
    "progress": lambda job, request: job_progress(job),
    "attempts": lambda job, request: job.attempts,
    "max_attempts": lambda job, request: job.max_attempts,
    "priority": lambda job, request: job.priority,
    "cancel_requested": lambda job, request: job.cancel_requested,
    "dead_letter_queue": lambda job, request: job.dead_letter_queue,
    "idempotency_key": lambda job, request: job.idempotency_key,
    "request_id": lambda job, request: job.request_id,
    "correlation_id": lambda job, request: job.correlation_id,
    "run_at": lambda job, request: _datetime(job.run_at),
    "created_at": lambda job, request: _datetime(job.created_at),
    "updated_at": lambda job, request: _datetime(job.updated_at),
    "artefacts": _artefact_bodies,
    "last_error": lambda job, request: job_last_error(job),
    "result": lambda job, request: job.result,
    "rerun_of": lambda job, request: None if job.rerun_of_id is None else str(job.rerun_of_id),
}
JOB_FIELDS = tuple(JOB_BODY)

# The fields of a job.status.changed event (docs/architecture.md#progress-events-and-the-outbox),
# in the order jobs_status_event builds them.
EVENT_FIELDS = (
    "event_id",
    "type",
    "job_id",
    "job_type",
    "seq",
    "status",
    "previous_status",
    "progress",
    "attempt",
    "timestamp",
    "request_id",
    "correlation_id",
    "org_id",
    "project_id",
)


def job_representation(job: Job, request: Any = None) -> dict[str, Any]:
    """The job body: what `JobOutputSerializer(job).data` answers, built directly.

    The API's answers and `job_status --json` use this: instantiating the serializers
    (a deep copy of every declared field, per request) cost as much as the read itself.
    The serializer stays the schema; a test holds the two equal for a job in every state.
    """
    return {name: read(job, request) for name, read in JOB_BODY.items()}
