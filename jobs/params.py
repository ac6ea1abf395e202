"""Params schemas, one DRF serializer per job type (registered in settings.JOB_TYPES)."""

from __future__ import annotations

from rest_framework import serializers


class StrictParams(serializers.Serializer):
    """Refuses unknown keys so that a typo is an error, not a silently ignored field."""

    def to_internal_value(self, data):  # type: ignore[no-untyped-def]
        unknown = sorted(set(data) - set(self.fields)) if isinstance(data, dict) else []
        errors: dict[str, list[str]] = {key: ["Unknown field."] for key in unknown}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            # Report unknown and invalid fields together, in one answer.
            if not isinstance(exc.detail, dict):
                raise
            errors = {**exc.detail, **errors}
        if errors:
            raise serializers.ValidationError(errors)
        return value


class SimParams(StrictParams):
    steps = serializers.IntegerField(min_value=1, max_value=10_000, default=20)
    step_seconds = serializers.FloatField(min_value=0, max_value=60, default=0.5)
    seed = serializers.IntegerField(required=False, default=0)


class ReportParams(StrictParams):
    status = serializers.CharField(required=False, max_length=16)
    type = serializers.CharField(required=False, max_length=32)
    limit = serializers.IntegerField(min_value=1, max_value=100_000, default=1000)


class ErpParams(StrictParams):
    event = serializers.CharField(max_length=64)
    data = serializers.DictField(required=False, default=dict)


class AiParams(StrictParams):
    text = serializers.CharField(max_length=100_000, allow_blank=False)


class ModelParams(StrictParams):
    points = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2),
        min_length=2,
        max_length=100_000,
    )


class CamParams(StrictParams):
    width = serializers.FloatField(min_value=0.001, max_value=10_000)
    height = serializers.FloatField(min_value=0.001, max_value=10_000)
    tool_diameter = serializers.FloatField(min_value=0.001, max_value=100, default=6.0)
    stepover = serializers.FloatField(min_value=0.05, max_value=1.0, default=0.5)
