"""Serializers shared by the admin DLQ API's views (docs/api.md): the bodies that several
calls answer with, and the selection both replay and discard take. Each view keeps its
own nested input serializer."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import reverse
from rest_framework import serializers

from core.api.serializers import (
    ClosedSerializer,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictUUIDField,
)
from dlq.models import BulkOperation
from dlq.services.selection import MAX_JUSTIFICATION_CHARS
from jobs.domain.states import Status
from jobs.domain.types import primary_queue_names
from jobs.models import DeadLetterReason, DeadLetterState


class DlqQueueOutputSerializer(serializers.Serializer):
    queue = serializers.CharField(help_text="The DLQ, e.g. `sim_dlq`.")
    depth = serializers.IntegerField(
        allow_null=True, help_text="Messages in the broker DLQ; null when unknown."
    )
    open = serializers.IntegerField(help_text="Open dead letters in the database.")
    broker_error = serializers.CharField(
        allow_null=True, help_text="Why the depth is unknown (RabbitMQ unreachable)."
    )
    broker_dlq = serializers.BooleanField(
        help_text="False for a queue the postgres executor runs: no broker DLQ, its dead "
        "letters are the database rows (no peek; replay and discard work the same)."
    )


class DeadLetterBriefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job_id = serializers.UUIDField(allow_null=True)
    queue = serializers.CharField()
    state = serializers.ChoiceField(choices=DeadLetterState.choices)
    reason = serializers.ChoiceField(choices=DeadLetterReason.choices)
    error_code = serializers.CharField(allow_null=True)
    error_message = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    resolved_at = serializers.DateTimeField(allow_null=True)


class DeathSummarySerializer(serializers.Serializer):
    reason = serializers.CharField(allow_null=True)
    queue = serializers.CharField(allow_null=True)
    count = serializers.IntegerField(allow_null=True)
    first_time = serializers.CharField(allow_null=True)
    last_time = serializers.CharField(allow_null=True)


class PeekMessageOutputSerializer(serializers.Serializer):
    message_id = serializers.CharField()
    job_id = serializers.CharField(
        allow_null=True, help_text="As the message says (not trusted: it may name no job)."
    )
    task = serializers.CharField(allow_null=True)
    attempt = serializers.IntegerField(allow_null=True)
    routing_key = serializers.CharField(allow_null=True, help_text="The original routing key.")
    queue = serializers.CharField(allow_null=True, help_text="The primary queue it died in.")
    reason = serializers.CharField(allow_null=True)
    death = DeathSummarySerializer(help_text="x-death in short: reason, count, first and last.")
    x_death = serializers.ListField(child=serializers.DictField(), allow_null=True)
    headers = serializers.DictField()
    payload = serializers.DictField(allow_null=True, help_text="The job payload.")
    body = serializers.CharField(allow_null=True, help_text="The raw body when undecodable.")
    decode_error = serializers.CharField(allow_null=True)
    redelivered = serializers.BooleanField()
    dead_letters = DeadLetterBriefSerializer(many=True, help_text="The matching rows.")


class SampleRowSerializer(serializers.Serializer):
    dead_letter_id = serializers.IntegerField()
    job_id = serializers.UUIDField(allow_null=True)
    queue = serializers.CharField()
    reason = serializers.CharField()
    error_code = serializers.CharField(allow_null=True)
    error_message = serializers.CharField()
    created_at = serializers.DateTimeField()


class SkippedRowSerializer(serializers.Serializer):
    dead_letter_id = serializers.IntegerField()
    job_id = serializers.UUIDField(allow_null=True)
    skipped = serializers.CharField(help_text="Why, e.g. `already resolved`.")


class ResolveResultOutputSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=["replay", "discard"])
    dry_run = serializers.BooleanField()
    matched = serializers.IntegerField(
        help_text="Open dead letters the selection matched (at most `limit`)."
    )
    sample = SampleRowSerializer(
        many=True, help_text="The first ten of them, in the order the action takes them."
    )
    without_job = serializers.IntegerField(
        help_text="Replay: open dead letters of the selection that name no job (undecodable "
        "messages, unknown jobs). A replay cannot take them; discard them. 0 for a discard."
    )
    notes = serializers.ListField(
        child=serializers.CharField(),
        help_text="What the operator should know, in words, e.g. "
        "`2 dead letters name no job: they can only be discarded.`",
    )
    resolved = serializers.ListField(child=serializers.IntegerField(), help_text="Row ids done.")
    job_ids = serializers.ListField(child=serializers.UUIDField())
    message_ids = serializers.ListField(child=serializers.CharField())
    skipped = SkippedRowSerializer(many=True)
    broker_acked = serializers.IntegerField(help_text="Broker copies acked away.")
    broker_error = serializers.CharField(allow_null=True)
    published = serializers.IntegerField()
    seconds = serializers.DictField(child=serializers.FloatField())


class BulkOperationOutputSerializer(serializers.ModelSerializer):
    requested_by = serializers.CharField(source="requested_by.get_username")
    percent = serializers.IntegerField()
    url = serializers.SerializerMethodField()

    class Meta:
        model = BulkOperation
        fields = [
            "id",
            "action",
            "queue",
            "state",
            "stop_requested",
            "total",
            "processed",
            "resolved",
            "skipped",
            "broker_acked",
            "percent",
            "last_error",
            "requested_by",
            "created_at",
            "started_at",
            "finished_at",
            "url",
        ]

    def get_url(self, operation: BulkOperation) -> str:
        path = reverse("dlq-api:operation", kwargs={"operation_id": operation.id})
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path


class DlqFilterInputSerializer(ClosedSerializer):
    reason = serializers.ChoiceField(choices=DeadLetterReason.choices, required=False)
    error_code = StrictCharField(required=False, max_length=64)
    retryable = StrictBooleanField(
        required=False,
        help_text="Only causes a replay can cure: retries exhausted, worker lost, broker "
        "limits (reasons exhausted, worker_lost, delivery_limit, expired, maxlen).",
    )
    without_job = StrictBooleanField(
        required=False,
        help_text="Only dead letters that name no job (undecodable messages, unknown jobs): "
        "what a replay leaves out, for a discard.",
    )
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)


class DlqSelectionInputSerializer(ClosedSerializer):
    """What replay and discard take (docs/api.md): a justification and a selection of
    the open dead letters in the queue (all of them when nothing narrows it)."""

    justification = StrictCharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=MAX_JUSTIFICATION_CHARS,
        help_text="Why (kept with each row; required unless dry_run; blank is refused 422).",
    )
    job_ids = serializers.ListField(
        child=StrictUUIDField(), required=False, max_length=1000, help_text="Only these jobs."
    )
    filter = DlqFilterInputSerializer(required=False)
    limit = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=1_000_000,
        help_text="At most this many, oldest first.",
    )
    dry_run = StrictBooleanField(
        required=False, default=False, help_text="Only count and sample; change nothing."
    )

    def selection(self) -> dict[str, Any]:
        data = self.validated_data
        return {
            "justification": data.get("justification", ""),
            "job_ids": data.get("job_ids"),
            "filters": dict(data.get("filter") or {}),
            "limit": data.get("limit"),
            "dry_run": data.get("dry_run", False),
        }


class JobsFilterInputSerializer(ClosedSerializer):
    """Which jobs a cancel by filter reaches (all given fields must hold)."""

    status = serializers.ChoiceField(choices=Status.choices, required=False)
    type = serializers.ChoiceField(
        choices=sorted(settings.JOB_TYPES), required=False, help_text="A job type."
    )
    queue = serializers.ChoiceField(
        choices=primary_queue_names(), required=False, help_text="A primary queue."
    )
    org = serializers.SlugField(
        required=False, max_length=50, help_text="An organisation's slug (one of yours)."
    )
    owner = StrictCharField(required=False, max_length=150, help_text="The owner's username.")
    error_code = StrictCharField(required=False, max_length=64, help_text="last_error.code")
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)
    params = serializers.JSONField(
        required=False,
        help_text="Jobs whose params contain this object (jsonb `@>`): at most 4 levels "
        "deep and 1000 characters.",
    )


class JobsCancelInputSerializer(ClosedSerializer):
    justification = StrictCharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=MAX_JUSTIFICATION_CHARS,
        help_text="Why (in the ops audit entry; required unless dry_run; blank is refused 422).",
    )
    filter = JobsFilterInputSerializer(
        required=False, help_text="Which jobs; without it, every unfinished job you may see."
    )
    dry_run = StrictBooleanField(
        required=False, default=False, help_text="Only count and sample; change nothing."
    )


class JobsCancelResultOutputSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    matched = serializers.IntegerField(help_text="Unfinished jobs matched, flag not yet raised.")
    sample = serializers.ListField(child=serializers.UUIDField(), help_text="Dry run: up to 10.")
    cancelled = serializers.IntegerField(help_text="Moved to `cancelled` now.")
    cancel_requested = serializers.IntegerField(
        help_text="Running: flagged; they stop at their next cancellation check."
    )
    already_ended = serializers.IntegerField(help_text="Ended between the count and the cancel.")
