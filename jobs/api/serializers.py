"""Serializers shared by the jobs API views: the job body.

Each view keeps its own nested InputSerializer; the job body is shared because
create, read, list and cancel all answer with it (docs/api.md#the-job-body).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.domain.states import Status
from jobs.models import Artefact, Job
from jobs.selectors.representation import artefact_url, job_artefacts, job_last_error, job_progress


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
    metrics = serializers.DictField(
        child=serializers.FloatField(),
        allow_null=True,
        help_text="The progress value's numbers, as its handler reported them (at most 20 "
        "names of at most 64 characters, each a finite number); null when it reported none.",
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


# The docstring below is the published schema's description of JobOutput, word for
# word (the OpenAPI document stays byte-identical across refactorings: make
# openapi-check); the module it names is jobs.selectors.representation now.
class JobOutputSerializer(serializers.Serializer):
    """The job body of docs/api.md, as a schema: its fields are jobs.representation's
    JOB_FIELDS, in that order (tests/jobs/test_representation.py). Read-only by
    construction: no view writes through it."""

    id = serializers.UUIDField()
    type = serializers.CharField()
    category = serializers.ChoiceField(
        choices=settings.JOB_CATEGORIES,
        help_text="The type's category when the job was created (docs/configuration.md).",
    )
    queue = serializers.CharField()
    org_id = serializers.IntegerField(help_text="The organisation the job runs in.")
    project_id = serializers.IntegerField(
        allow_null=True, help_text="Its project in that organisation, if any."
    )
    status = serializers.ChoiceField(choices=Status.choices)
    progress = serializers.SerializerMethodField()
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    priority = serializers.IntegerField(
        min_value=0,
        max_value=9,
        help_text="0-9, higher first (docs/operator-controls.md#priority).",
    )
    cancel_requested = serializers.BooleanField()
    dead_letter_queue = serializers.CharField(allow_null=True)
    idempotency_key = serializers.CharField(allow_null=True)
    request_id = serializers.CharField(allow_null=True)
    correlation_id = serializers.CharField(
        allow_null=True,
        help_text="The creating request's X-Correlation-ID (its request id by default).",
    )
    run_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When the job was asked to run (null: at once); a job waiting for it "
        "is `scheduled` (docs/operator-controls.md#scheduled-jobs).",
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    artefacts = serializers.SerializerMethodField()
    last_error = serializers.SerializerMethodField()
    result = serializers.JSONField(allow_null=True)
    rerun_of = serializers.UUIDField(
        source="rerun_of_id",
        allow_null=True,
        help_text="The job this one re-runs (an operator's re-run of a finished job); else null.",
    )

    @extend_schema_field(ProgressSerializer)
    def get_progress(self, job: Job) -> dict[str, Any]:
        return job_progress(job)

    @extend_schema_field(ArtefactOutputSerializer(many=True))
    def get_artefacts(self, job: Job) -> list[dict[str, Any]]:
        return ArtefactOutputSerializer(job_artefacts(job), many=True, context=self.context).data

    @extend_schema_field(LastErrorSerializer(allow_null=True))
    def get_last_error(self, job: Job) -> dict[str, Any] | None:
        return job_last_error(job)
