"""The API's bounds on the portal's forms (docs/operations/portal.md#what-the-forms-accept).

A form field of JSON (a schedule's params, a fix-forward's edited params) is read like
an API body (core/api/parsers.py): at most JOBOPS_MAX_PAYLOAD_BYTES, no deeper than
JOBOPS_MAX_JSON_DEPTH, nothing PostgreSQL's jsonb refuses, no integer longer than Python
reads. Python's json module recurses, so 5,000 levels raised RecursionError (a 500)
before any depth check could run; here every refusal is a sentence for the form.

`error_lines` turns an error's details (a serializer's nested errors, or a service's
`{field: [message]}`) into "field path: message" lines, never a Python repr.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.forms.fields import InvalidJSONInput, JSONString

from core.json import JSONRefusedError, json_read


class FormJSONError(ValueError):
    """JSON text from a form that the API would refuse; its message says why."""


def json_from_form(text: str, *, what: str = "The JSON") -> Any:
    """The value of JSON `text` from a form field, within the API's bounds; otherwise
    FormJSONError with a message that begins with `what`."""
    size_limit = settings.JOBOPS_MAX_PAYLOAD_BYTES
    depth_limit = settings.JOBOPS_MAX_JSON_DEPTH
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > size_limit:
        raise FormJSONError(f"{what} is {size} bytes; at most {size_limit} are accepted.")
    try:
        return json_read(text, what=what, max_depth=depth_limit)
    except JSONRefusedError as exc:
        raise FormJSONError(str(exc)) from exc


class BoundedJSONField(forms.JSONField):
    """Django's JSONField (a model's JSON column in an admin form), read through
    `json_from_form`: in `to_python` (validation) and in `bound_data` (the form shown
    again with its errors), where Django's own json.loads would recurse too."""

    def to_python(self, value: Any) -> Any:
        if self.disabled or value in self.empty_values or not isinstance(value, str):
            return super().to_python(value)
        try:
            parsed = json_from_form(value, what="The value")
        except FormJSONError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from exc
        return JSONString(parsed) if isinstance(parsed, str) else parsed

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return json_from_form(data, what="The value")
        except FormJSONError:
            return InvalidJSONInput(data)


def error_lines(details: Any, path: str = "") -> list[str]:
    """Each problem in `details` as "path: message" (path joined with "." and list
    indexes: `params.items.0: ...`); a bare message has no path."""
    if isinstance(details, dict):
        lines = []
        for key, value in details.items():
            name = str(key) if key not in ("non_field_errors", "__all__") else ""
            lines.extend(error_lines(value, f"{path}.{name}" if path and name else path or name))
        return lines
    if isinstance(details, list | tuple):
        if all(isinstance(item, str) for item in details):
            return [f"{path}: {item}" if path else str(item) for item in details]
        lines = []
        for index, item in enumerate(details):
            if isinstance(item, str):
                lines.append(f"{path}: {item}" if path else item)
            elif item:  # a list serializer's errors: one entry per item, empty when valid
                lines.extend(error_lines(item, f"{path}.{index}" if path else str(index)))
        return lines
    return [f"{path}: {details}" if path else str(details)]
