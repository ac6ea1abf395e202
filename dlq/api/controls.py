"""What the admin API's queue and connector controls share (jobs.controls): the views
of `POST /api/v1/admin/queues/{queue}/pause|resume` (dlq.api.queues) and
`POST /api/v1/admin/connectors/{name}/open|close` (dlq.api.connectors).

As the DLQ admin calls: active staff with a verified OTP (401 ERR-DLQ-401), a token's
`admin:dlq` scope, the control's permission (403 ERR-DLQ-403 for a viewer), 30 calls a
minute. Either action acts on every tenant's jobs at once, so staff limited to some
organisations are refused too (403 ERR-DLQ-403, the control's own message).
"""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from audit.services import Actor
from core.api.docs import REQUEST_ID
from core.api.parsers import json_body
from core.api.serializers import NOT_BLANK
from dlq.api.docs import RETRY_AFTER, error_responses
from dlq.api.views import TAGS, DlqApiView
from dlq.errors import DeadLetterPermissionError
from jobs.controls import OperatorControl
from tenants.selectors import operator_org_ids


def reason_field(max_chars: int) -> serializers.CharField:
    """The body's one field, the same for every control."""
    return serializers.CharField(
        max_length=max_chars,
        validators=[NOT_BLANK],
        help_text=(
            f"The justification, kept in the ops audit chain (required, at most {max_chars})."
        ),
    )


class OperatorControlApi(DlqApiView):
    """One action of a control; a subclass names the control, the verb, the refusal for
    limited staff, its serializers and its answer."""

    control: ClassVar[OperatorControl]
    verb: ClassVar[str]
    whole_tenants_refusal: ClassVar[str]  # the 403's message for staff limited to some orgs
    input_serializer: ClassVar[type[serializers.Serializer]]
    output_serializer: ClassVar[type[serializers.Serializer]]

    def post(self, request: Request, **kwargs: str) -> Response:
        # The URL's one argument names the thing (`queue` or `name`, as each URL had it).
        (name,) = kwargs.values()
        if operator_org_ids(request.user) is not None:
            raise DeadLetterPermissionError(self.whole_tenants_refusal)
        body = self.input_serializer(data=json_body(request))
        body.is_valid(raise_exception=True)
        changed = self.control.action(self.verb).run(
            name=name,
            reason=body.validated_data["reason"],
            actor=Actor.operator(request.user),
            user=request.user,
        )
        return Response(self.output_serializer(self.answer(name, changed=changed)).data)

    def answer(self, name: str, *, changed: bool) -> dict[str, Any]:
        """The body: the thing's state after the action, and whether it changed."""
        raise NotImplementedError


def control_schema(
    *,
    operation_id: str,
    summary: str,
    thing: OpenApiParameter,
    request: type[serializers.Serializer],
    response: type[serializers.Serializer],
    answer: str,
) -> Any:
    """The OpenAPI entry of one control view's POST (decorates its class)."""
    entry = extend_schema(
        operation_id=operation_id,
        summary=summary,
        tags=TAGS,
        request=request,
        parameters=[thing, REQUEST_ID, RETRY_AFTER],
        responses={
            200: OpenApiResponse(response, answer),
            **error_responses(400, 401, 403, 404, 415, 422, 429),
        },
    )
    return extend_schema_view(post=entry)
