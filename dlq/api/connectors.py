"""The admin API's breaker controls (docs/connectors.md#opening-and-closing-by-hand):
`POST /api/v1/admin/connectors/{name}/open|close`. Thin views over
jobs.services.connectors.

As the queue controls: active staff with a verified OTP (401 ERR-DLQ-401), a token's
`admin:dlq` scope, the operator's `jobs.control_connector` (403 ERR-DLQ-403 for a
viewer), 30 calls a minute. A breaker holds every tenant's jobs of its connector at
once, so staff limited to some organisations are refused too (403 ERR-DLQ-403).
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from audit.services import Actor
from core.api.docs import REQUEST_ID
from core.api.parsers import json_body
from dlq.api.docs import RETRY_AFTER, error_responses
from dlq.api.views import TAGS, DlqApiView
from dlq.errors import DeadLetterPermissionError
from jobs.selectors import connectors_state
from jobs.services.connectors import REASON_MAX_CHARS, connector_close, connector_open
from jobs.types import all_connectors
from tenants.selectors import operator_org_ids

CONNECTOR = OpenApiParameter(
    "name",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="A connector a job type calls, e.g. `erp`.",
    enum=list(all_connectors()) or None,
)


class ConnectorWholeTenantsError(DeadLetterPermissionError):
    """A staff member limited to some organisations asked to open or close a breaker:
    that acts on every tenant's jobs at once, which stays with unrestricted operators."""

    default_message = (
        "You are limited to some organisations: opening or closing a connector's breaker "
        "acts on every organisation's jobs and needs an unrestricted operator."
    )


class ConnectorControlInputSerializer(serializers.Serializer):
    reason = serializers.CharField(
        max_length=REASON_MAX_CHARS,
        help_text="The justification, kept in the ops audit chain (required, at most 500).",
    )


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


class _ConnectorControlApi(DlqApiView):
    required_permissions = ("jobs.control_connector",)
    opens = True

    def post(self, request: Request, name: str) -> Response:
        if operator_org_ids(request.user) is not None:
            raise ConnectorWholeTenantsError()
        body = ConnectorControlInputSerializer(data=json_body(request))
        body.is_valid(raise_exception=True)
        reason, actor = body.validated_data["reason"], Actor.operator(request.user)
        control = connector_open if self.opens else connector_close
        changed = control(name=name, reason=reason, actor=actor, user=request.user)
        state = next(s for s in connectors_state() if s.name == name)
        data = {
            "name": name,
            "state": state.state,
            "changed": changed,
            "failures": state.failures,
            "next_probe_at": state.next_probe_at,
            "changed_at": state.changed_at,
            "changed_by": state.changed_by,
            "reason": state.reason,
        }
        return Response(ConnectorControlOutputSerializer(data).data)


_RESPONSES = {**error_responses(400, 401, 403, 404, 415, 422, 429)}


class ConnectorOpenApi(_ConnectorControlApi):
    """POST /api/v1/admin/connectors/{name}/open: its jobs stop starting."""

    @extend_schema(
        operation_id="admin_connector_open",
        summary="Open a connector's breaker (audited connector_opened)",
        tags=TAGS,
        request=ConnectorControlInputSerializer,
        parameters=[CONNECTOR, REQUEST_ID, RETRY_AFTER],
        responses={
            200: OpenApiResponse(
                ConnectorControlOutputSerializer,
                "Opened (or already open: `changed` false). Its jobs wait `retrying` for "
                "the probe after the connector's cool-down, no attempt spent; creation "
                "still answers 201 (409 for a type that opted in).",
            ),
            **_RESPONSES,
        },
    )
    def post(self, request: Request, name: str) -> Response:
        return super().post(request, name)


class ConnectorCloseApi(_ConnectorControlApi):
    """POST /api/v1/admin/connectors/{name}/close: its jobs start again."""

    opens = False

    @extend_schema(
        operation_id="admin_connector_close",
        summary="Close a connector's breaker (audited connector_closed)",
        tags=TAGS,
        request=ConnectorControlInputSerializer,
        parameters=[CONNECTOR, REQUEST_ID, RETRY_AFTER],
        responses={
            200: OpenApiResponse(
                ConnectorControlOutputSerializer,
                "Closed (or was closed: `changed` false); the jobs it held come due "
                "within the connector's jitter.",
            ),
            **_RESPONSES,
        },
    )
    def post(self, request: Request, name: str) -> Response:
        return super().post(request, name)
