"""Serializers every API area shares: strict fields, closed bodies, query filters, the
error envelope.

DRF's fields are lenient the way HTML forms need: "true", 1 and "yes" are booleans,
"5.0" and 5.0 are the integer 5, an integer is a UUID. For a JSON API whose schema
says `boolean`, `integer` or a UUID string, accepting other types means the schema
lies (schemathesis' negative checks catch exactly that), so the API uses these.
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import Any

from django.core.validators import RegexValidator
from rest_framework import serializers

# Request components (as drf-spectacular names them) whose serializer refuses unknown
# fields; core.api.schema.close_request_bodies marks them additionalProperties: false.
CLOSED_REQUEST_COMPONENTS: set[str] = set()


# What Python's str.strip() (and so a CharField's trim) takes away: a text of only these
# is blank. As a validator its pattern lands in the OpenAPI schema, so that a client (and
# the contract test) knows that "\u0085" is no justification, which minLength cannot say.
WHITESPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK = RegexValidator(f"[^{WHITESPACE}]", "This field may not be blank.")


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers instead of quietly turning 12 into "12"."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """JSON true or false only."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer, or (in a query string) only digits; no floats, no booleans."""

    _DIGITS = re.compile(r"^-?[0-9]{1,18}$")

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int | str):
            self.fail("invalid")
        if isinstance(data, str) and not self._DIGITS.match(data):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictUUIDField(serializers.UUIDField):
    """A UUID in its canonical hyphenated text form only."""

    _CANONICAL = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")

    def to_internal_value(self, data: Any) -> uuid.UUID:
        if not isinstance(data, str) or not self._CANONICAL.match(data):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


def _fresh_field(field: serializers.Field) -> serializers.Field:
    """A new copy of a declared field for one serializer instance. A field that holds
    other fields (a nested serializer, a list's child) is deep-copied as DRF does; a
    flat one only copied: DRF re-runs its __init__ from the declared arguments, which
    cost a create more Python than its insert, and a flat field's state (its
    arguments, validators, messages) is read, never written, while it validates."""
    if isinstance(field, serializers.BaseSerializer) or hasattr(field, "child"):
        return copy.deepcopy(field)
    return copy.copy(field)


class FlatFieldsSerializer(serializers.Serializer):
    """A Serializer whose instances copy their declared fields cheaply (_fresh_field)."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {name: _fresh_field(field) for name, field in self._declared_fields.items()}


class ClosedSerializer(FlatFieldsSerializer):
    """A request body that refuses fields it does not define (mass assignment, typos).

    Subclasses are recorded so that the OpenAPI schema says so too.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        CLOSED_REQUEST_COMPONENTS.add(cls.__name__.removesuffix("Serializer") + "Request")

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: ["Unknown field; it cannot be set here."] for name in unknown}
                )
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
