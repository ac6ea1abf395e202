"""Serializers every API area shares: strict fields, query filters, the error envelope."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers instead of quietly turning 12 into "12"."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class QueryFilterSerializer(serializers.Serializer):
    """Filters from a query string. DRF reads `?status=` as "not given" (HTML form
    semantics); for an API that is a client's mistake, refused like any bad value."""

    def to_internal_value(self, data: Any) -> Any:
        blank = {name: ["May not be blank."] for name in self.fields if data.get(name) == ""}
        if blank:
            raise serializers.ValidationError(blank)
        return super().to_internal_value(data)


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable, e.g. ERR-JOB-422.")
    message = serializers.CharField()
    details = serializers.JSONField(
        help_text="Per-field messages for validation errors, else context such as job_id."
    )


class ErrorEnvelopeSerializer(serializers.Serializer):
    error = ErrorSerializer()
