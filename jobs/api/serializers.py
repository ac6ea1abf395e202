"""Serializers shared by the jobs API views: the job body.

Each view keeps its own nested InputSerializer; the job body is shared because
create, read, list and cancel all answer with it (DESIGN.md 6).
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.models import Artefact, Job
from jobs.states import Status


class ProgressSerializer(serializers.Serializer):
    percent = serializers.IntegerField(min_value=0, max_value=100)
    step = serializers.CharField(allow_null=True)
    message = serializers.CharField(allow_null=True)
    updated_at = serializers.DateTimeField(allow_null=True)


class LastErrorSerializer(serializers.Serializer):
    code = serializers.CharField(allow_null=True)
    message = serializers.CharField(allow_null=True)


class ArtefactOutputSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()

    class Meta:
        model = Artefact
        fields = ["id", "kind", "name", "content_type", "sha256", "size", "url"]

    def get_url(self, artefact: Artefact) -> str:
        path = reverse(
            "api:job-artefact", kwargs={"job_id": artefact.job_id, "artefact_id": artefact.id}
        )
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path


class JobOutputSerializer(serializers.Serializer):
    """The job body of DESIGN.md 6. Read-only by construction: no view writes through it."""

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
        return {
            "percent": job.progress_percent,
            "step": job.progress_step,
            "message": job.progress_message,
            "updated_at": serializers.DateTimeField().to_representation(job.progress_updated_at)
            if job.progress_updated_at
            else None,
        }

    @extend_schema_field(ArtefactOutputSerializer(many=True))
    def get_artefacts(self, job: Job) -> list[dict[str, Any]]:
        # The selectors read them with the job (`artefact_list`); else the relation.
        artefacts = getattr(job, "artefact_list", None)
        if artefacts is None:
            artefacts = job.artefacts.all()
        return ArtefactOutputSerializer(artefacts, many=True, context=self.context).data

    @extend_schema_field(LastErrorSerializer(allow_null=True))
    def get_last_error(self, job: Job) -> dict[str, Any] | None:
        if not job.last_error_code and not job.last_error_message:
            return None
        return {"code": job.last_error_code, "message": job.last_error_message}
