"""The admin API's queue controls (docs/operator-controls.md#pausing-a-queue):
`POST /api/v1/admin/queues/{queue}/pause|resume`. Thin views over jobs.services.queues.

As the DLQ admin calls: active staff with a verified OTP (401 ERR-DLQ-401), a token's
`admin:dlq` scope, the operator's `jobs.pause_queue` (403 ERR-DLQ-403 for a viewer), 30
calls a minute. A pause acts on every tenant's jobs of the queue at once, so staff
limited to some organisations are refused too (403 ERR-DLQ-403).
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
from jobs.selectors import queues_state
from jobs.services.queues import REASON_MAX_CHARS, queue_pause, queue_resume
from jobs.types import primary_queue_names
from tenants.selectors import operator_org_ids

QUEUE = OpenApiParameter(
    "queue",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="A primary queue, e.g. `sim`.",
    enum=primary_queue_names(),
)


class QueueWholeTenantsError(DeadLetterPermissionError):
    """A staff member limited to some organisations asked to pause or resume a queue:
    that acts on every tenant's jobs at once, which stays with unrestricted operators."""

    default_message = (
        "You are limited to some organisations: pausing or resuming a queue acts on "
        "every organisation's jobs and needs an unrestricted operator."
    )


class QueueControlInputSerializer(serializers.Serializer):
    reason = serializers.CharField(
        max_length=REASON_MAX_CHARS,
        help_text="The justification, kept in the ops audit chain (required, at most 500).",
    )


class QueueControlOutputSerializer(serializers.Serializer):
    name = serializers.CharField()
    paused = serializers.BooleanField()
    changed = serializers.BooleanField(
        help_text="False when the queue was already in that state (nothing was written)."
    )
    paused_at = serializers.DateTimeField(allow_null=True)
    paused_by = serializers.CharField(allow_null=True)
    reason = serializers.CharField(allow_null=True, help_text="The pause's justification.")


class _QueueControlApi(DlqApiView):
    required_permissions = ("jobs.pause_queue",)
    pause = True

    def post(self, request: Request, queue: str) -> Response:
        if operator_org_ids(request.user) is not None:
            raise QueueWholeTenantsError()
        body = QueueControlInputSerializer(data=json_body(request))
        body.is_valid(raise_exception=True)
        reason, actor = body.validated_data["reason"], Actor.operator(request.user)
        if self.pause:
            changed = queue_pause(queue=queue, reason=reason, actor=actor, user=request.user)
        else:
            changed = queue_resume(queue=queue, reason=reason, actor=actor)
        state = next(s for s in queues_state() if s.name == queue)
        data = {
            "name": queue,
            "paused": state.paused,
            "changed": changed,
            "paused_at": state.paused_at,
            "paused_by": state.paused_by,
            "reason": state.reason,
        }
        return Response(QueueControlOutputSerializer(data).data)


_RESPONSES = {**error_responses(400, 401, 403, 404, 415, 422, 429)}


class QueuePauseApi(_QueueControlApi):
    """POST /api/v1/admin/queues/{queue}/pause: the dispatcher stops publishing it."""

    @extend_schema(
        operation_id="admin_queue_pause",
        summary="Pause a queue (audited queue_paused)",
        tags=TAGS,
        request=QueueControlInputSerializer,
        parameters=[QUEUE, REQUEST_ID, RETRY_AFTER],
        responses={
            200: OpenApiResponse(
                QueueControlOutputSerializer,
                "Paused (or already paused: `changed` false). Its jobs wait `pending`; "
                "creation still answers 201; running jobs finish.",
            ),
            **_RESPONSES,
        },
    )
    def post(self, request: Request, queue: str) -> Response:
        return super().post(request, queue)


class QueueResumeApi(_QueueControlApi):
    """POST /api/v1/admin/queues/{queue}/resume: its backlog is published again."""

    pause = False

    @extend_schema(
        operation_id="admin_queue_resume",
        summary="Resume a queue (audited queue_resumed)",
        tags=TAGS,
        request=QueueControlInputSerializer,
        parameters=[QUEUE, REQUEST_ID, RETRY_AFTER],
        responses={
            200: OpenApiResponse(
                QueueControlOutputSerializer,
                "Resumed (or was not paused: `changed` false); the backlog is published "
                "through the broker window, highest priority first.",
            ),
            **_RESPONSES,
        },
    )
    def post(self, request: Request, queue: str) -> Response:
        return super().post(request, queue)
