"""Params schemas, one DRF serializer per job type (registered in settings.JOB_TYPES).

Each schema bounds the work its params imply, not only each field: a handler must be
able to finish within its type's soft time limit and in bounded memory, whatever a
client sends. The bounds are the class attributes below (documented in
docs/architecture.md#job-types-and-handlers); the serializer's `context["spec"]` is the
job's type (jobs.domain.types.JobType), for the bounds that depend on its time limit, and
`context["staff"]` whether the caller holds staff powers (staff with a verified second
factor). A schema that estimates its run time checks it against `spec.work_budget` (a
fraction of the soft time limit, leaving headroom). Only `sim` plans a duration (the
client chooses step_seconds); the others bound the size of their input instead (cam
passes, model points, ai text, report rows). Handlers receive the validated values.

No params hold a secret (`params_secret_check`, docs/security.md#no-secrets-in-params):
they travel in the broker message and rest on the job row. A schema that needs one
declares a `SecretReferenceField`: the name of a secret the worker resolves.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from rest_framework import serializers

from core.api.serializers import (
    NOT_BLANK,
    FlatFieldsSerializer,
    StrictCharField,
    StrictIntegerField,
    StrictUUIDField,
)
from jobs.domain.exceptions import JobParamsSecretError


class FiniteFloatField(serializers.FloatField):
    """A float that JSON can hold: no NaN or Infinity, and within +-max_magnitude so that
    squares and sums of a few hundred thousand of them stay finite."""

    def __init__(self, *, max_magnitude: float = 1e100, **kwargs: Any) -> None:
        self.max_magnitude = max_magnitude
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> float:
        value = super().to_internal_value(data)
        if not math.isfinite(value) or abs(value) > self.max_magnitude:
            raise serializers.ValidationError(
                f"Must be a finite number of magnitude at most {self.max_magnitude:g}."
            )
        return value


class StrictParams(FlatFieldsSerializer):
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
    step_seconds = FiniteFloatField(min_value=0, max_value=60, default=0.5)
    seed = serializers.IntegerField(required=False, default=0, min_value=0, max_value=2**63 - 1)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # The run must end well before the type's soft time limit (its work budget keeps
        # headroom), or every attempt times out near the end.
        spec = self.context.get("spec")
        if spec is not None:
            planned = attrs["steps"] * attrs["step_seconds"]
            if exceeds(planned, spec.work_budget):
                raise serializers.ValidationError(
                    {
                        "step_seconds": [
                            f"steps x step_seconds plans {planned:g} s of work; a sim job "
                            f"may plan at most {spec.work_budget:g} s "
                            f"({settings.JOBOPS_WORK_BUDGET_FRACTION:.0%} of its "
                            f"{spec.soft_time_limit} s soft time limit)."
                        ]
                    }
                )
        return attrs


class ReportParams(StrictParams):
    status = serializers.CharField(required=False, max_length=16)
    type = serializers.CharField(required=False, max_length=32)
    limit = serializers.IntegerField(min_value=1, max_value=100_000, default=1000)
    # Staff powers only: every owner's jobs. Anyone else's report lists their own jobs.
    all_owners = serializers.BooleanField(required=False, default=False)

    def validate_all_owners(self, value: bool) -> bool:
        if value and not self.context.get("staff"):
            raise serializers.ValidationError(
                "Only staff with a verified second factor (a session that passed OTP, or "
                "a token holding a grant from POST /api/v1/admin/otp) may report on "
                "every owner's jobs."
            )
        return value


class ErpParams(StrictParams):
    event = serializers.CharField(max_length=64)
    data = serializers.DictField(required=False, default=dict)


class AiParams(StrictParams):
    text = serializers.CharField(max_length=100_000, allow_blank=False)


class ModelParams(StrictParams):
    points = serializers.ListField(
        child=serializers.ListField(child=FiniteFloatField(), min_length=2, max_length=2),
        min_length=2,
        max_length=100_000,
    )


class CamParams(StrictParams):
    # A toolpath this dense is not a real job: refuse it before a worker computes it.
    MAX_PASSES = 100_000

    width = FiniteFloatField(min_value=0.001, max_value=10_000)
    height = FiniteFloatField(min_value=0.001, max_value=10_000)
    tool_diameter = FiniteFloatField(min_value=0.001, max_value=100, default=6.0)
    stepover = FiniteFloatField(min_value=0.05, max_value=1.0, default=0.5)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        passes = cam_passes(attrs["height"], attrs["tool_diameter"], attrs["stepover"])
        if passes > self.MAX_PASSES:
            raise serializers.ValidationError(
                {
                    "stepover": [
                        f"This pocket needs {passes} passes; at most {self.MAX_PASSES} are "
                        "accepted (raise the tool diameter or the stepover)."
                    ]
                }
            )
        return attrs


# A label is a short tag shown beside an annotated entry (one line: no control
# characters); a note is the annotation's text, bounded so that an entry stays small.
# Both are hashed into the annotating job's audit chain (docs/architecture.md#annotations):
# they say something about a job, never about a person (reference people, as every
# hashed payload does).
ANNOTATION_LABEL_MAX = 64
ANNOTATION_NOTE_MAX = 2000
NO_CONTROL_CHARACTERS = RegexValidator(
    r"^[^\x00-\x1f\x7f-\x9f]*$", "Control characters (line breaks, tabs...) are not allowed."
)
NO_CONTROL_BUT_LINE_BREAKS = RegexValidator(
    r"^[^\x00-\x09\x0b-\x1f\x7f-\x9f]*$",
    "Control characters other than line breaks are not allowed.",
)


class AnnotateParams(StrictParams):
    """`annotate` (category audit_enrichment): which entry of which job it annotates and
    what it says. The job named must be one its owner may see in the job's own
    organisation, and not purged (jobs.services.annotations checks it at creation; the
    handler again when it runs); its entry `target_seq` must exist."""

    target_job_id = StrictUUIDField()
    target_seq = StrictIntegerField(min_value=1, max_value=2**53 - 1)
    label = StrictCharField(
        max_length=ANNOTATION_LABEL_MAX, validators=[NOT_BLANK, NO_CONTROL_CHARACTERS]
    )
    note = StrictCharField(
        max_length=ANNOTATION_NOTE_MAX,
        required=False,
        default="",
        allow_blank=True,
        validators=[NO_CONTROL_BUT_LINE_BREAKS],
    )

    def validate_target_job_id(self, value: uuid.UUID) -> str:
        return str(value)  # stored params are JSON: the canonical text


def exceeds(planned: float, budget: float) -> bool:
    """Planned work over the budget; a plan equal to it up to float rounding (1,200
    steps of 0.56 s are 672.0000000000001 s against 672 s) is within it."""
    return planned > budget and not math.isclose(planned, budget)


def cam_passes(height: float, tool_diameter: float, stepover: float) -> int:
    """Raster passes of a pocket of `height` (one formula for the schema and handler)."""
    inner_h = height - tool_diameter
    if inner_h <= 0:
        return 1
    return max(1, math.ceil(inner_h / (stepover * tool_diameter)) + 1)


class SecretReferenceField(serializers.CharField):
    """The name of a secret the worker resolves (an environment variable, a vault path:
    `erp/api-key`), never the secret itself. A field of this class may bear a name of
    JOBOPS_SECRET_PARAM_NAMES (`api_key`); its value is still checked for the shapes of
    a secret (params_secret_check), and must look like a name."""

    NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]*$"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 200)
        super().__init__(**kwargs)
        self.validators.append(
            RegexValidator(
                self.NAME, "The name of a secret (letters, digits and _ . : / @ -), not a value."
            )
        )


# The shapes of a secret's value. A PEM private key or an AWS access key id anywhere in
# a text; a bearer token only as a whole value (an Authorization header's), with a token
# of at least 16 characters, so that prose ("bearer bonds") stays allowed.
_PEM_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_BEARER = re.compile(r"\s*bearer\s+[A-Za-z0-9._~+/-]{16,}=*\s*", re.IGNORECASE)
_AWS_ACCESS_KEY_ID = re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
_SHAPES = (
    (_PEM_PRIVATE_KEY.search, "Shaped like a PEM private key."),
    (_BEARER.fullmatch, "Shaped like a Bearer token (an Authorization header's value)."),
    (_AWS_ACCESS_KEY_ID.search, "Shaped like an AWS access key id."),
)
_NAMED = (
    "Named like a secret (JOBOPS_SECRET_PARAM_NAMES): pass a reference the worker "
    "resolves, not the value."
)
# Paths named in one refusal: enough to fix the request, bounded whatever it holds.
MAX_SECRET_PATHS = 20
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def secret_name_key(name: str) -> str:
    """A key as JOBOPS_SECRET_PARAM_NAMES compares it: lowercased, without - and _."""
    return name.lower().replace("-", "").replace("_", "")


def params_secrets(params: Any, *, schema: Any = None) -> list[tuple[str, str]]:
    """Each (JSON path, why) where `params` holds a secret, in path order: a key that
    is a name of JOBOPS_SECRET_PARAM_NAMES (exactly, after secret_name_key) at any depth
    of objects and lists, unless `schema` (the type's params serializer class) declares
    that field a SecretReferenceField; a string shaped like a private key, a bearer token
    or an AWS access key id. Never the values. A walk with its own stack: stored params
    read back (`manage.py check_secret_params`) have no depth bound."""
    names = {secret_name_key(name) for name in settings.JOBOPS_SECRET_PARAM_NAMES}
    found: list[tuple[str, str]] = []
    # A path is (parent path, key or index), rendered only for what is found: most
    # params hold nothing, and a 256 KB list of numbers holds 10,000s of children.
    stack: list[tuple[Any, _Path, Any]] = [(params, None, schema)]
    while stack:
        value, path, node = stack.pop()
        if isinstance(value, str):
            found.extend((_render(path), why) for match, why in _SHAPES if match(value))
        elif isinstance(value, dict):
            for key, child in value.items():
                key = str(key)
                field = _child_node(node, key)
                if secret_name_key(key) in names and not isinstance(field, SecretReferenceField):
                    found.append((_render((path, key)), _NAMED))
                elif isinstance(child, str | dict | list):
                    stack.append((child, (path, key), field))
        elif isinstance(value, list):
            item_node = _child_node(node, None)
            stack.extend(
                (item, (path, i), item_node)
                for i, item in enumerate(value)
                if isinstance(item, str | dict | list)
            )
    return sorted(found)


def params_secret_check(params: Any, *, schema: Any = None) -> None:
    """Refuse params that hold a secret (params_secrets) with JobParamsSecretError
    (422 ERR-JOB-PARAMS-SECRET): `details` maps each JSON path to why, at most
    MAX_SECRET_PATHS of them. Every path that takes params calls it (through
    jobs.services.validate_params): a create, a batch's item, a schedule, a fix-forward."""
    found = params_secrets(params, schema=schema)
    if not found:
        return
    details: dict[str, list[str]] = {}
    for path, why in found[:MAX_SECRET_PATHS]:
        details.setdefault(path, []).append(why)
    if len(found) > MAX_SECRET_PATHS:
        details["more"] = [f"{len(found) - MAX_SECRET_PATHS} more path(s) not listed."]
    raise JobParamsSecretError(details=details)


# A JSON path in params: None for params itself, else (its parent, a key or an index).
_Path = tuple[Any, str | int] | None


def _render(path: _Path) -> str:
    """`params.auth.password`, `params.items[2]`, `params["a.b"]`."""
    parts: list[str] = []
    while path is not None:
        path, part = path
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(f".{part}" if _PLAIN_KEY.match(part) else f"[{json.dumps(part)}]")
    return "params" + "".join(reversed(parts))


def _child_node(node: Any, key: str | None) -> Any:
    """What the schema declares for a child of the value `node` describes (`key`: a
    dict's key; None: a list's items): a field, a nested serializer, or None."""
    if isinstance(node, type) and issubclass(node, serializers.Serializer):
        return getattr(node, "_declared_fields", {}).get(key) if key is not None else None
    if isinstance(node, serializers.ListSerializer | serializers.ListField):
        return node.child if key is None else None
    if isinstance(node, serializers.DictField):
        return node.child if key is not None else None
    if isinstance(node, serializers.Serializer):
        return _child_node(type(node), key)
    return None
