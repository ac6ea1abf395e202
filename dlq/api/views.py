"""The admin DLQ API (docs/api.md). Thin views: check, call a selector or service, render.

Every call needs active staff with a verified OTP (an OTP-verified admin session, or a
token with a live grant from `POST /api/v1/admin/otp`); writes need the operator's
permission; 30 calls a minute per user. `{queue}` names the DLQ itself (`sim_dlq`).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.docs import REQUEST_ID
from core.api.parsers import json_body
from core.api.serializers import QueryFilterSerializer, StrictIntegerField
from core.api.views import AdminApiView
from dlq.api.docs import RETRY_AFTER, error_responses
from dlq.api.serializers import (
    BulkOperationOutputSerializer,
    DeadLetterBriefSerializer,
    DlqQueueOutputSerializer,
    DlqSelectionInputSerializer,
    JobsCancelInputSerializer,
    JobsCancelResultOutputSerializer,
    PeekMessageOutputSerializer,
    ResolveResultOutputSerializer,
)
from dlq.broker import BROKER_ERRORS, dlq_peek
from dlq.bulk import bulk_operation_stop, dead_letters_act
from dlq.errors import (
    BrokerUnavailableError,
    DeadLetterNotVerifiedError,
    DeadLetterPermissionError,
    DeadLetterRateLimitedError,
    JobsFilterInvalidError,
    NoBrokerDlqError,
    OrganisationNotFoundError,
    UnknownQueueError,
)
from dlq.models import BulkOperation
from dlq.selectors import (
    bulk_operation_get,
    dead_letters_for_messages,
    death_summary,
    dlq_overview,
    messages_in_orgs,
)
from dlq.services.cancel import jobs_cancel_by_filter
from jobs.integrations.topology import dlq_has_broker_copy, dlq_names
from jobs.selectors import JobFilter, JobFilterError, job_filter_check
from tenants.models import Scope
from tenants.permissions import HasRequiredScope
from tenants.selectors import operator_org_ids, organisation_get

TAGS = ["admin"]
QUEUE = OpenApiParameter(
    "queue",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="The dead-letter queue, e.g. `sim_dlq`.",
    enum=dlq_names(),
)
OPERATION = OpenApiParameter(
    "operation_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="A bulk operation."
)


class DlqApiView(AdminApiView):
    # After staff + OTP (401 first), a token needs admin:dlq (docs/tenancy.md#scopes).
    permission_classes = [*AdminApiView.permission_classes, HasRequiredScope]
    required_scope = Scope.ADMIN_DLQ
    error_prefix = "ERR-DLQ"
    not_verified_error = DeadLetterNotVerifiedError
    forbidden_error = DeadLetterPermissionError
    rate_limited_error = DeadLetterRateLimitedError


def _require_queue(queue: str) -> str:
    if queue not in dlq_names():
        raise UnknownQueueError(
            f"{queue!r} is not a dead-letter queue.",
            details={"queue": [f"One of: {', '.join(dlq_names())}."]},
        )
    return queue


class DlqListApi(DlqApiView):
    """GET /api/v1/admin/dlq: each DLQ with its broker depth and open dead letters."""

    class DlqListOutputSerializer(DlqQueueOutputSerializer):
        pass

    @extend_schema(
        operation_id="admin_dlq_list",
        summary="List the dead-letter queues",
        tags=TAGS,
        parameters=[REQUEST_ID, RETRY_AFTER],
        responses={
            200: OpenApiResponse(
                DlqListOutputSerializer(many=True),
                "Every DLQ; `depth` is null when RabbitMQ cannot be reached, and for staff "
                "limited to some organisations (a depth counts every tenant's messages), "
                "whose `open` and `replayable` count their organisations' rows only.",
            ),
            **error_responses(401, 403, 429),
        },
    )
    def get(self, request: Request) -> Response:
        overview = dlq_overview(org_ids=operator_org_ids(request.user))
        return Response(self.DlqListOutputSerializer(overview, many=True).data)


class DlqPeekApi(DlqApiView):
    """GET /api/v1/admin/dlq/{queue}/peek?limit=n: broker messages, nothing consumed."""

    class DlqPeekQuerySerializer(QueryFilterSerializer):
        limit = StrictIntegerField(
            required=False, default=20, min_value=1, max_value=100, help_text="1-100."
        )

    @extend_schema(
        operation_id="admin_dlq_peek",
        summary="Peek at a DLQ's messages without consuming them",
        tags=TAGS,
        parameters=[QUEUE, DlqPeekQuerySerializer, REQUEST_ID, RETRY_AFTER],
        responses={
            200: OpenApiResponse(
                PeekMessageOutputSerializer(many=True),
                "Up to `limit` messages from the head of the DLQ, each with the matching "
                "dead-letter rows; every message goes back (get without ack, then requeue). "
                "Staff limited to some organisations see only the messages of their "
                "organisations' jobs among them.",
            ),
            # 409: the queue runs on the postgres executor (no broker DLQ).
            **error_responses(400, 401, 403, 404, 409, 429, 503),
        },
    )
    def get(self, request: Request, queue: str) -> Response:
        _require_queue(queue)
        query = self.DlqPeekQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        if not dlq_has_broker_copy(queue):
            raise NoBrokerDlqError()
        try:
            messages = dlq_peek(queue=queue, limit=query.validated_data["limit"])
        except BROKER_ERRORS as exc:
            raise BrokerUnavailableError() from exc
        # A limited operator sees only the messages of their organisations' jobs.
        org_ids = operator_org_ids(request.user)
        messages = messages_in_orgs(messages, org_ids=org_ids)
        rows = dead_letters_for_messages(messages, org_ids=org_ids)
        body = [
            {
                **message.as_dict(),
                "death": death_summary(message),
                "dead_letters": DeadLetterBriefSerializer(rows[message.message_id], many=True).data,
            }
            for message in messages
        ]
        return Response(PeekMessageOutputSerializer(body, many=True).data)


def _resolve_responses(action: str) -> dict[Any, Any]:
    return {
        200: OpenApiResponse(
            ResolveResultOutputSerializer,
            f"Done now (or, with dry_run, what a {action} would select: count and sample).",
        ),
        202: OpenApiResponse(
            BulkOperationOutputSerializer,
            f"More dead letters than JOBOPS_DLQ_BACKGROUND_THRESHOLD (100): the {action} runs "
            "in the background; follow `Location` (GET) for its progress.",
        ),
        **error_responses(400, 401, 403, 404, 415, 422, 429),
    }


class _ResolveApi(DlqApiView):
    action = ""

    def post(self, request: Request, queue: str) -> Response:
        _require_queue(queue)
        body = self.input_serializer(data=json_body(request))
        body.is_valid(raise_exception=True)
        outcome = dead_letters_act(
            action=self.action, actor_user=request.user, queue=queue, **body.selection()
        )
        if isinstance(outcome, BulkOperation):
            data = BulkOperationOutputSerializer(outcome, context={"request": request}).data
            headers = {"Location": data["url"]}
            return Response(data, status=status.HTTP_202_ACCEPTED, headers=headers)
        return Response(ResolveResultOutputSerializer(outcome.as_dict()).data)


class DlqReplayApi(_ResolveApi):
    """POST /api/v1/admin/dlq/{queue}/replay: failed jobs run again."""

    action = "replay"
    required_permissions = ("jobs.replay_deadletter",)

    class DlqReplayInputSerializer(DlqSelectionInputSerializer):
        pass

    input_serializer = DlqReplayInputSerializer

    @extend_schema(
        operation_id="admin_dlq_replay",
        summary="Replay dead letters (audited dlq_replayed)",
        tags=TAGS,
        request=DlqReplayInputSerializer,
        parameters=[QUEUE, REQUEST_ID, RETRY_AFTER],
        responses=_resolve_responses("replay"),
    )
    def post(self, request: Request, queue: str) -> Response:
        return super().post(request, queue)


class DlqDiscardApi(_ResolveApi):
    """POST /api/v1/admin/dlq/{queue}/discard: rows closed, jobs stay failed."""

    action = "discard"
    required_permissions = ("jobs.discard_deadletter",)

    class DlqDiscardInputSerializer(DlqSelectionInputSerializer):
        pass

    input_serializer = DlqDiscardInputSerializer

    @extend_schema(
        operation_id="admin_dlq_discard",
        summary="Discard dead letters (audited dlq_discarded)",
        tags=TAGS,
        request=DlqDiscardInputSerializer,
        parameters=[QUEUE, REQUEST_ID, RETRY_AFTER],
        responses=_resolve_responses("discard"),
    )
    def post(self, request: Request, queue: str) -> Response:
        return super().post(request, queue)


class DlqOperationApi(DlqApiView):
    """GET /api/v1/admin/dlq/operations/{id}: a background replay or discard."""

    @extend_schema(
        operation_id="admin_dlq_operation",
        summary="Read a background replay or discard",
        tags=TAGS,
        parameters=[OPERATION, REQUEST_ID, RETRY_AFTER],
        responses={200: BulkOperationOutputSerializer, **error_responses(401, 403, 404, 429)},
    )
    def get(self, request: Request, operation_id: str) -> Response:
        operation = bulk_operation_get(operation_id=operation_id, user=request.user)
        return Response(BulkOperationOutputSerializer(operation, context={"request": request}).data)


class DlqOperationStopApi(DlqApiView):
    """POST /api/v1/admin/dlq/operations/{id}/stop: stop it before its next chunk."""

    @extend_schema(
        operation_id="admin_dlq_operation_stop",
        summary="Stop a background replay or discard (idempotent)",
        tags=TAGS,
        request=None,
        parameters=[OPERATION, REQUEST_ID, RETRY_AFTER],
        responses={200: BulkOperationOutputSerializer, **error_responses(401, 403, 404, 429)},
    )
    def post(self, request: Request, operation_id: str) -> Response:
        operation = bulk_operation_get(operation_id=operation_id, user=request.user)
        operation = bulk_operation_stop(operation_id=operation.id, actor_user=request.user)
        return Response(BulkOperationOutputSerializer(operation, context={"request": request}).data)


class JobsCancelApi(DlqApiView):
    """POST /api/v1/admin/jobs/cancel: cancel every unfinished job a filter matches."""

    required_permissions = ("jobs.cancel_job",)

    @extend_schema(
        operation_id="admin_jobs_cancel",
        summary="Cancel jobs by filter (dry run first; audited)",
        description="Each job is cancelled through the ordinary cancel as an operator (its "
        "own audited transition); the request is one `jobs_cancel_by_filter` entry on the "
        "ops chain. Staff limited to some organisations reach only theirs: a filter without "
        "`org` is narrowed to them, one naming another organisation is 404.",
        tags=TAGS,
        request=JobsCancelInputSerializer,
        parameters=[REQUEST_ID, RETRY_AFTER],
        responses={
            200: OpenApiResponse(
                JobsCancelResultOutputSerializer,
                "Done now (or, with dry_run, the count and a sample).",
            ),
            202: OpenApiResponse(
                BulkOperationOutputSerializer,
                "More jobs than JOBOPS_DLQ_BACKGROUND_THRESHOLD (100): the cancel runs in "
                "the background; follow `Location` (GET) for its progress.",
            ),
            **error_responses(400, 401, 403, 404, 415, 422, 429),
        },
    )
    def post(self, request: Request) -> Response:
        body = JobsCancelInputSerializer(data=json_body(request))
        body.is_valid(raise_exception=True)
        data = body.validated_data
        wanted = dict(data.get("filter") or {})
        slug = wanted.pop("org", None)
        if slug is not None:
            org = organisation_get(slug)
            limited = operator_org_ids(request.user)
            if org is None or (limited is not None and org.pk not in limited):
                raise OrganisationNotFoundError(details={"org": [f"No organisation {slug!r}."]})
            wanted["org_id"] = org.pk
        try:
            # What the schema cannot say (an empty time range, params too deep or not an
            # object) is a 422, not a 400: the body is well-formed.
            job_filter_check(JobFilter(**wanted))
        except JobFilterError as bad:
            raise JobsFilterInvalidError(str(bad), details={"filter": [str(bad)]}) from bad
        outcome = jobs_cancel_by_filter(
            actor_user=request.user,
            filters=JobFilter(**wanted),
            justification=data.get("justification", ""),
            dry_run=data["dry_run"],
        )
        if isinstance(outcome, BulkOperation):
            answer = BulkOperationOutputSerializer(outcome, context={"request": request}).data
            headers = {"Location": answer["url"]}
            return Response(answer, status=status.HTTP_202_ACCEPTED, headers=headers)
        return Response(JobsCancelResultOutputSerializer(outcome.as_dict()).data)
