"""What a create's body may hold (docs/api.md#creating-a-job): the input serializer of
`POST /api/v1/jobs`, and of each job of a batch create and of `submit_job --file`
(jobs.services.batch_creation.batch_items_read). The type's params schema and every rule
of a job's creation are the services'; this reads the shape."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.serializers import FlatFieldsSerializer, StrictCharField


@extend_schema_field({"type": "object", "additionalProperties": {}})
class ParamsField(serializers.JSONField):
    """Documented as the object it must be; anything else is refused by the service as
    422 ERR-JOB-422 with the other bad params (docs/api.md), not as a 400."""


class OffsetDateTimeField(serializers.DateTimeField):
    """An RFC 3339 date-time that names its offset: a time without one would be read in
    the server's zone, which the client cannot know (400 ERR-JOB-400, per field)."""

    default_error_messages = {
        "offset": "An RFC 3339 date-time with an offset (Z or +01:00), e.g. "
        "2026-12-01T09:00:00+01:00.",
    }

    def to_internal_value(self, value: Any) -> Any:
        if not isinstance(value, str) or len(value) > 64:
            self.fail("offset")
        try:
            parsed = parse_datetime(value)
        except ValueError:  # well formed, but no such date (2026-13-01)
            parsed = None
        if parsed is None or parsed.utcoffset() is None:
            self.fail("offset")
        return parsed


class JobCreateInputSerializer(FlatFieldsSerializer):
    type = serializers.ChoiceField(
        choices=sorted(settings.JOB_TYPES), help_text="The job's type (docs/architecture.md)."
    )
    params = ParamsField(
        help_text=(
            "A JSON object checked against the type's params schema; what it cannot "
            "express (e.g. the work a cam pocket implies) is answered 422. Never a secret: "
            "a key named like one or a value shaped like one is 422 ERR-JOB-PARAMS-SECRET "
            "(docs/security.md#no-secrets-in-params)."
        )
    )
    idempotency_key = StrictCharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        trim_whitespace=False,
        max_length=None,
        help_text="1-255 printable ASCII characters; or send the Idempotency-Key header.",
    )
    priority = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=9,
        help_text=(
            "0-9, default 5: a queue's pending jobs enter the broker highest priority "
            "first, then oldest (docs/operator-controls.md#priority). Above 7 only "
            "with staff powers, else 422 ERR-JOB-422 (details.priority)."
        ),
    )
    org = serializers.SlugField(
        required=False,
        max_length=50,
        help_text=(
            "The organisation's slug; needed only by a caller in several "
            "(docs/tenancy.md). Not one of the caller's: 422 ERR-TENANT-422."
        ),
    )
    project = serializers.SlugField(
        required=False,
        max_length=50,
        help_text="A project of that organisation (its slug); another's: 422.",
    )
    run_at = OffsetDateTimeField(
        required=False,
        allow_null=True,
        help_text=(
            "RFC 3339 with an offset (2026-12-01T09:00:00+01:00): the job waits "
            "`scheduled` until then. At most JOBOPS_MAX_SCHEDULE_AHEAD days (90) "
            "ahead; up to 60 s in the past runs now, further back is 422 ERR-JOB-422."
        ),
    )

    def to_internal_value(self, data: Any) -> Any:
        # Mass assignment: anything but these fields (status, owner, result...) is refused.
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: ["Unknown field; server fields cannot be set."] for name in unknown}
                )
        return super().to_internal_value(data)
