"""Serializers shared by the jobs API views: the job body.

Each view keeps its own nested InputSerializer; the job body is shared because
create, read, list and cancel all answer with it (docs/api.md#the-job-body).
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.models import Artefact, Job
from jobs.states import Status


class ProgressSerializer(serializers.Serializer):
    percent = serializers.IntegerField(
        min_value=0,
        max_value=100,
        help_text="Of the attempt below: never goes back within it; each attempt starts at 0.",
    )
    step = serializers.CharField(allow_null=True)
    message = serializers.CharField(allow_null=True)
    updated_at = serializers.DateTimeField(allow_null=True)
    attempt = serializers.IntegerField(
        allow_null=True,
        min_value=1,
        help_text="The attempt this progress belongs to (out of the job's max_attempts); "
        "null before the first attempt.",
    )


class LastErrorSerializer(serializers.Serializer):
    code = serializers.CharField(allow_null=True)
    message = serializers.CharField(allow_null=True)


class ArtefactOutputSerializer(serializers.Serializer):
    # Declared, not a ModelSerializer: that one rebuilds its fields from the model on
    # every request, which cost more than the rest of the job body.
    id = serializers.UUIDField(read_only=True)
    kind = serializers.CharField(max_length=64)
    name = serializers.CharField(max_length=255)
    content_type = serializers.CharField(max_length=128, required=False)
    s3_key = serializers.CharField(
        source="file.name",
        max_length=500,
        help_text="The file's key in the artefact storage (its path on the file system).",
    )
    sha256 = serializers.CharField(max_length=64)
    size = serializers.IntegerField(min_value=-(2**63), max_value=2**63 - 1)  # bigint
    url = serializers.SerializerMethodField()

    def get_url(self, artefact: Artefact) -> str:
        return artefact_url(artefact, self.context.get("request"))


class JobOutputSerializer(serializers.Serializer):
    """The job body of docs/api.md. Read-only by construction: no view writes through it."""

    id = serializers.UUIDField()
    type = serializers.CharField()
    queue = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    progress = serializers.SerializerMethodField()
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    cancel_requested = serializers.BooleanField()
    dead_letter_queue = serializers.CharField(allow_null=True)
    idempotency_key = serializers.CharField(allow_null=True)
    request_id = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    artefacts = serializers.SerializerMethodField()
    last_error = serializers.SerializerMethodField()
    result = serializers.JSONField(allow_null=True)

    @extend_schema_field(ProgressSerializer)
    def get_progress(self, job: Job) -> dict[str, Any]:
        return _progress(job)

    @extend_schema_field(ArtefactOutputSerializer(many=True))
    def get_artefacts(self, job: Job) -> list[dict[str, Any]]:
        return ArtefactOutputSerializer(_artefacts(job), many=True, context=self.context).data

    @extend_schema_field(LastErrorSerializer(allow_null=True))
    def get_last_error(self, job: Job) -> dict[str, Any] | None:
        return _last_error(job)


_DATETIME = serializers.DateTimeField()


def _datetime(value: Any) -> str | None:
    return None if value is None else _DATETIME.to_representation(value)


def _progress(job: Job) -> dict[str, Any]:
    return {
        "percent": job.progress_percent,
        "step": job.progress_step,
        "message": job.progress_message,
        "updated_at": _datetime(job.progress_updated_at),
        "attempt": job.progress_attempt,
    }


def _last_error(job: Job) -> dict[str, Any] | None:
    if not job.last_error_code and not job.last_error_message:
        return None
    return {"code": job.last_error_code, "message": job.last_error_message}


def _artefacts(job: Job) -> Any:
    # The selectors read them with the job (`artefact_list`); else the relation.
    artefacts = getattr(job, "artefact_list", None)
    return job.artefacts.all() if artefacts is None else artefacts


def artefact_url(artefact: Artefact, request: Any = None) -> str:
    path = reverse(
        "api:job-artefact", kwargs={"job_id": artefact.job_id, "artefact_id": artefact.id}
    )
    return request.build_absolute_uri(path) if request else path


def job_representation(job: Job, request: Any = None) -> dict[str, Any]:
    """What `JobOutputSerializer(job).data` answers, built directly.

    The create, read and cancel answers use this: instantiating the serializers (a deep
    copy of every declared field, per request) cost as much as the read itself. The
    serializer stays the schema; a test holds the two equal for a job in every state.
    """
    return {
        "id": str(job.id),
        "type": job.type,
        "queue": job.queue,
        "status": job.status,
        "progress": _progress(job),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "cancel_requested": job.cancel_requested,
        "dead_letter_queue": job.dead_letter_queue,
        "idempotency_key": job.idempotency_key,
        "request_id": job.request_id,
        "created_at": _datetime(job.created_at),
        "updated_at": _datetime(job.updated_at),
        "artefacts": [
            {
                "id": str(a.id),
                "kind": a.kind,
                "name": a.name,
                "content_type": a.content_type,
                "s3_key": a.file.name,
                "sha256": a.sha256,
                "size": a.size,
                "url": artefact_url(a, request),
            }
            for a in _artefacts(job)
        ],
        "last_error": _last_error(job),
        "result": job.result,
    }
