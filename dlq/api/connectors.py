"""The admin API's breaker controls (docs/connectors.md#opening-and-closing-by-hand):
`POST /api/v1/admin/connectors/{name}/open|close`. Thin views over
jobs.services.connectors, through the shared control view (dlq.api.controls: who may,
and the refusals).

The permission is the operator's `jobs.control_connector`. A breaker holds every
tenant's jobs of its connector at once, so staff limited to some organisations are
refused (403 ERR-DLQ-403).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from dlq.api.controls import OperatorControlApi, control_schema, reason_field
from jobs.controls import CONNECTOR_CONTROL
from jobs.domain.types import all_connectors
from jobs.selectors import connectors_state

CONNECTOR = OpenApiParameter(
    "name",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="A connector a job type calls, e.g. `erp`.",
    enum=list(all_connectors()) or None,
)


class ConnectorControlInputSerializer(serializers.Serializer):
    reason = reason_field(CONNECTOR_CONTROL.reason_max)


class ConnectorControlOutputSerializer(serializers.Serializer):
    name = serializers.CharField()
    state = serializers.CharField(help_text="closed, half_open or open.")
    changed = serializers.BooleanField(
        help_text="False when the breaker was already in that state (nothing was written)."
    )
    failures = serializers.IntegerField()
    next_probe_at = serializers.DateTimeField(allow_null=True)
    changed_at = serializers.DateTimeField(allow_null=True)
    changed_by = serializers.CharField(allow_null=True)
    reason = serializers.CharField(help_text="The operator's justification ('' if none).")


class _ConnectorControlApi(OperatorControlApi):
    control = CONNECTOR_CONTROL
    required_permissions = (CONNECTOR_CONTROL.permission,)
    whole_tenants_refusal = (
        "You are limited to some organisations: opening or closing a connector's breaker "
        "acts on every organisation's jobs and needs an unrestricted operator."
    )
    input_serializer = ConnectorControlInputSerializer
    output_serializer = ConnectorControlOutputSerializer

    def answer(self, name: str, *, changed: bool) -> dict[str, Any]:
        state = next(s for s in connectors_state() if s.name == name)
        return {
            "name": name,
            "state": state.state,
            "changed": changed,
            "failures": state.failures,
            "next_probe_at": state.next_probe_at,
            "changed_at": state.changed_at,
            "changed_by": state.changed_by,
            "reason": state.reason,
        }


@control_schema(
    operation_id="admin_connector_open",
    summary="Open a connector's breaker (audited connector_opened)",
    thing=CONNECTOR,
    request=ConnectorControlInputSerializer,
    response=ConnectorControlOutputSerializer,
    answer="Opened (or already open: `changed` false). Its jobs wait `retrying` for "
    "the probe after the connector's cool-down, no attempt spent; creation "
    "still answers 201 (409 for a type that opted in).",
)
class ConnectorOpenApi(_ConnectorControlApi):
    """POST /api/v1/admin/connectors/{name}/open: its jobs stop starting."""

    verb = "open"


@control_schema(
    operation_id="admin_connector_close",
    summary="Close a connector's breaker (audited connector_closed)",
    thing=CONNECTOR,
    request=ConnectorControlInputSerializer,
    response=ConnectorControlOutputSerializer,
    answer="Closed (or was closed: `changed` false); the jobs it held come due "
    "within the connector's jitter.",
)
class ConnectorCloseApi(_ConnectorControlApi):
    """POST /api/v1/admin/connectors/{name}/close: its jobs start again."""

    verb = "close"
