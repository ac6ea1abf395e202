"""The admin API's queue controls (docs/operator-controls.md#pausing-a-queue):
`POST /api/v1/admin/queues/{queue}/pause|resume`. Thin views over jobs.services.queues,
through the shared control view (dlq.api.controls: who may, and the refusals).

The permission is the operator's `jobs.pause_queue`. A pause acts on every tenant's
jobs of the queue at once, so staff limited to some organisations are refused
(403 ERR-DLQ-403).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from dlq.api.controls import OperatorControlApi, control_schema, reason_field
from jobs.controls import QUEUE_CONTROL
from jobs.domain.types import primary_queue_names
from jobs.selectors import queues_state

QUEUE = OpenApiParameter(
    "queue",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="A primary queue, e.g. `sim`.",
    enum=primary_queue_names(),
)


class QueueControlInputSerializer(serializers.Serializer):
    reason = reason_field(QUEUE_CONTROL.reason_max)


class QueueControlOutputSerializer(serializers.Serializer):
    name = serializers.CharField()
    paused = serializers.BooleanField()
    changed = serializers.BooleanField(
        help_text="False when the queue was already in that state (nothing was written)."
    )
    paused_at = serializers.DateTimeField(allow_null=True)
    paused_by = serializers.CharField(allow_null=True)
    reason = serializers.CharField(allow_null=True, help_text="The pause's justification.")


class _QueueControlApi(OperatorControlApi):
    control = QUEUE_CONTROL
    required_permissions = (QUEUE_CONTROL.permission,)
    whole_tenants_refusal = (
        "You are limited to some organisations: pausing or resuming a queue acts on "
        "every organisation's jobs and needs an unrestricted operator."
    )
    input_serializer = QueueControlInputSerializer
    output_serializer = QueueControlOutputSerializer

    def answer(self, name: str, *, changed: bool) -> dict[str, Any]:
        state = next(s for s in queues_state() if s.name == name)
        return {
            "name": name,
            "paused": state.paused,
            "changed": changed,
            "paused_at": state.paused_at,
            "paused_by": state.paused_by,
            "reason": state.reason,
        }


@control_schema(
    operation_id="admin_queue_pause",
    summary="Pause a queue (audited queue_paused)",
    thing=QUEUE,
    request=QueueControlInputSerializer,
    response=QueueControlOutputSerializer,
    answer="Paused (or already paused: `changed` false). Its jobs wait `pending`; "
    "creation still answers 201; running jobs finish.",
)
class QueuePauseApi(_QueueControlApi):
    """POST /api/v1/admin/queues/{queue}/pause: the dispatcher stops publishing it."""

    verb = "pause"


@control_schema(
    operation_id="admin_queue_resume",
    summary="Resume a queue (audited queue_resumed)",
    thing=QUEUE,
    request=QueueControlInputSerializer,
    response=QueueControlOutputSerializer,
    answer="Resumed (or was not paused: `changed` false); the backlog is published "
    "through the broker window, highest priority first.",
)
class QueueResumeApi(_QueueControlApi):
    """POST /api/v1/admin/queues/{queue}/resume: its backlog is published again."""

    verb = "resume"
