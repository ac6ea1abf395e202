"""GET /api/v1/queues and GET /api/v1/connectors (docs/api.md): the state of the
queues and of the connectors' breakers, as any authenticated caller may see it (no job
contents, addresses or credentials). Thin views over jobs.selectors.queue_state."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.docs import REQUEST_ID
from jobs.api.docs import error_responses
from jobs.selectors.queue_state import connectors_state, queues_for_consumers
from tenants.models import Scope
from tenants.permissions import RequiredScope


class QueueStateOutputSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The queue, e.g. `sim`.")
    depth = serializers.IntegerField(
        help_text=(
            "Jobs waiting to start: its pending jobs plus the messages RabbitMQ holds for "
            "it (the broker depth the dispatcher caches, or its queued jobs when unknown)."
        )
    )
    paused = serializers.BooleanField(help_text="Paused by an operator: nothing of it runs.")
    oldest_pending_age_seconds = serializers.FloatField(
        allow_null=True, help_text="Age of its oldest pending job; null when none waits."
    )
    retry_after_seconds = serializers.IntegerField(
        help_text=(
            "A suggested wait before submitting more: 0 now; the backpressure TTL while "
            "it is over its depth limit (a create would be 429); 60 while paused."
        )
    )


class QueueListApi(APIView):
    """GET /api/v1/queues: each queue's depth, pause and oldest pending age, for any
    authenticated caller (no job contents); memoised a few seconds per process."""

    required_scope: RequiredScope = Scope.JOBS_READ

    @extend_schema(
        operation_id="queues_list",
        summary="Queue state for consumers",
        parameters=[REQUEST_ID],
        responses={
            200: OpenApiResponse(
                QueueStateOutputSerializer(many=True),
                "Every queue, in the job types table's order; up to 2 seconds old "
                "(docs/operator-controls.md#queue-state).",
            ),
            **error_responses(401, 403),
        },
    )
    def get(self, request: Request) -> Response:
        return Response(QueueStateOutputSerializer(queues_for_consumers(), many=True).data)


@extend_schema(exclude=True)
class QueueDepthAliasApi(QueueListApi):
    """GET /api/v1/jobs/queues/depth: GET /api/v1/queues under the async spec's name."""


class ConnectorStateOutputSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The connector, e.g. `erp`.")
    state = serializers.ChoiceField(
        choices=["closed", "half_open", "open"],
        help_text=(
            "closed: its jobs run; open: they wait `retrying` for the probe (no attempt "
            "spent); half_open: one job probes it now."
        ),
    )
    failures = serializers.IntegerField(help_text="Connector failures in a row.")
    failure_threshold = serializers.IntegerField(help_text="Failures in a row that open it.")
    cooldown_seconds = serializers.FloatField(help_text="How long it stays open before a probe.")
    last_error_code = serializers.CharField(
        allow_null=True, help_text="The error code of its last connector failure."
    )
    opened_at = serializers.DateTimeField(allow_null=True, help_text="When it opened (open).")
    next_probe_at = serializers.DateTimeField(
        allow_null=True, help_text="When a job may probe it (open); null when closed."
    )
    probe_started_at = serializers.DateTimeField(
        allow_null=True, help_text="When the running probe started (half_open)."
    )
    manual = serializers.BooleanField(help_text="An operator opened or closed it last.")
    job_types = serializers.ListField(
        child=serializers.CharField(), help_text="The job types that call it."
    )


class ConnectorListApi(APIView):
    """GET /api/v1/connectors: each connector's breaker, for any authenticated caller
    (no addresses, credentials or job contents)."""

    required_scope: RequiredScope = Scope.JOBS_READ

    @extend_schema(
        operation_id="connectors_list",
        summary="Connector breakers",
        parameters=[REQUEST_ID],
        responses={
            200: OpenApiResponse(
                ConnectorStateOutputSerializer(many=True),
                "Every connector a job type calls, in name order (docs/connectors.md).",
            ),
            **error_responses(401, 403),
        },
    )
    def get(self, request: Request) -> Response:
        return Response(ConnectorStateOutputSerializer(connectors_state(), many=True).data)
