"""POST /api/v1/jobs/batch (docs/api.md#creating-jobs-in-a-batch): a thin view over
jobs.services.batch_creation. It reads the envelope and each item with the single
create's input serializer; every rule of a job's creation is the service's."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.docs import REQUEST_ID
from core.api.exceptions import error_body
from core.api.parsers import BoundedJSONParser, json_body
from core.api.serializers import ErrorSerializer
from core.errors import ApplicationError
from core.request_id import correlation_id_of, request_id_of
from jobs.api.docs import RATE_LIMIT_HEADERS, error_responses
from jobs.api.schema import MAX_BATCH_REQUEST_KEY
from jobs.api.throttles import JobCreateThrottle
from jobs.api.views import (
    RateLimitedApi,
    header_idempotency_key,
    jobs_staff_powers,
    refuse_large_body,
)
from jobs.domain.create_input import JobCreateInputSerializer
from jobs.domain.exceptions import BadRequestError, PayloadTooLargeError
from jobs.services.batch_creation import batch_items_read, job_batch_submit
from jobs.services.creation import validate_idempotency_key
from tenants.models import Scope
from tenants.permissions import RequiredScope

# What became of an item (BatchOutcome.status).
BATCH_STATUSES = ["created", "existing", "error"]


class BatchCreateInputSerializer(serializers.Serializer):
    """Documents the body; the view reads it item by item (a bad item is that item's
    error, not the request's)."""

    jobs = serializers.ListField(
        child=JobCreateInputSerializer(),
        min_length=1,
        help_text=(
            "1 to JOBOPS_BATCH_CREATE_MAX (1,000) jobs, each the body of a single create "
            "(POST /api/v1/jobs). More: 413 ERR-JOB-413."
        ),
    )


class BatchResultSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="The item's position in `jobs`, from 0.")
    status = serializers.ChoiceField(
        choices=BATCH_STATUSES,
        help_text="created: a new job; existing: the job its key already made; error.",
    )
    id = serializers.UUIDField(required=False, help_text="The job (created or existing).")
    error = ErrorSerializer(
        required=False, help_text="The error envelope's `error` a single create would answer."
    )


class BatchCreateOutputSerializer(serializers.Serializer):
    results = BatchResultSerializer(many=True, help_text="One per item, in the batch's order.")


class JobBatchCreateApi(RateLimitedApi):
    """POST /api/v1/jobs/batch: create many jobs, each answered on its own."""

    required_scope: RequiredScope = Scope.JOBS_WRITE
    parser_classes = [BoundedJSONParser]
    # The rate limit takes one token per item, in the service, once the body is read; a
    # body refused whole counts as one create (the single create's throttle, below).
    throttle_classes: list[Any] = []

    @extend_schema(
        operation_id="jobs_batch_create",
        summary="Create many jobs in one request",
        description=(
            "Up to JOBOPS_BATCH_CREATE_MAX (1,000) jobs in a body of at most "
            "JOBOPS_BATCH_MAX_BYTES (4 MB), each the body of a single create. Each item is "
            "answered on its own, in order: `created` or `existing` with its job's id, or "
            "`error` with the error envelope's `error` a single create would have answered "
            "(a wait in details.retry_after). The rate limit counts every item, all at "
            "once: a batch larger than the allowance is refused whole (429, "
            "details.allowance). A database error creates nothing (503)."
        ),
        request=BatchCreateInputSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description=(
                    f"1-{MAX_BATCH_REQUEST_KEY} printable ASCII characters. An item without its "
                    "own idempotency_key gets `<key>:<index>`: a retried batch makes "
                    "nothing twice."
                ),
            ),
            REQUEST_ID,
            *RATE_LIMIT_HEADERS,
        ],
        responses={
            200: OpenApiResponse(
                BatchCreateOutputSerializer,
                "Each item's outcome, in order: created, existing, or its error.",
            ),
            **error_responses(400, 401, 403, 409, 413, 415, 429, 503),
        },
    )
    def post(self, request: Request) -> Response:
        """1. The body whole (size, JSON, `jobs` a list within the bound; else one error,
        counted as one create); 2. each item through the single create's input
        serializer; 3. the service; 4. each outcome in order."""
        try:
            refuse_large_body(request, limit=settings.JOBOPS_BATCH_MAX_BYTES)
            raw_items = _batch_items(json_body(request))
            request_key = _request_key(request)
        except (ApplicationError, APIException):
            JobCreateThrottle().allow_request(request, self)  # every POST counts
            raise
        outcomes, decision = job_batch_submit(
            owner=request.user,
            items=batch_items_read(raw_items),
            request_key=request_key,
            staff=jobs_staff_powers(request),
            request_id=request_id_of(request),
            correlation_id=correlation_id_of(request),
        )
        request.rate_limit_headers = decision.headers() if decision else {}  # type: ignore[attr-defined]
        results = []
        for outcome in outcomes:
            result: dict[str, Any] = {"index": outcome.index, "status": outcome.status}
            if outcome.error is not None:
                result["error"] = _envelope(outcome.error)
            else:
                result["id"] = str(outcome.job_id)
            results.append(result)
        return Response({"results": results})


def _batch_items(body: Any) -> list[Any]:
    """The body's `jobs`: a list of 1 to JOBOPS_BATCH_CREATE_MAX items (400 for a wrong
    shape, 413 for too many: the same remedy as a body too large, split it)."""
    if not isinstance(body, dict):
        raise BadRequestError(
            "The request is invalid.",
            details={"non_field_errors": ['A JSON object: {"jobs": [...]}.']},
        )
    unknown = sorted(set(body) - {"jobs"})
    if unknown:
        raise BadRequestError(
            "The request is invalid.", details={name: ["Unknown field."] for name in unknown}
        )
    items = body.get("jobs")
    if not isinstance(items, list) or not items:
        raise BadRequestError(
            "The request is invalid.",
            details={"jobs": ["A list of 1 or more jobs, each an object."]},
        )
    limit = settings.JOBOPS_BATCH_CREATE_MAX
    if len(items) > limit:
        raise PayloadTooLargeError(
            f"The batch holds {len(items)} jobs; at most {limit} are accepted. Split it.",
            details={"limit": limit, "jobs": len(items)},
        )
    return items


def _request_key(request: Request) -> str | None:
    """The batch's Idempotency-Key: a key of validate_idempotency_key short enough to
    leave room for `:<index>` (400 else); None without one."""
    key = header_idempotency_key(request)
    if key is None:
        return None
    try:
        validate_idempotency_key(key)
        valid = len(key) <= MAX_BATCH_REQUEST_KEY
    except ApplicationError:
        valid = False
    if not valid:
        raise BadRequestError(
            f"The Idempotency-Key header is 1 to {MAX_BATCH_REQUEST_KEY} printable ASCII "
            "characters.",
            details={
                "idempotency_key": [f"1 to {MAX_BATCH_REQUEST_KEY} printable ASCII characters."]
            },
        )
    return key


def _envelope(error: ApplicationError) -> dict[str, Any]:
    """The error envelope's `error` of a single create refused with `error`; a wait
    (backpressure, an open connector) goes in details.retry_after, as no header can
    carry one item's."""
    body = error_body(error.code, error.message, error.details)["error"]
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None and isinstance(body["details"], dict):
        body["details"] = {**body["details"], "retry_after": int(retry_after)}
    return body
