"""The jobs API (docs/api.md). Thin views: parse, call a selector or service, render.

Writes go only through `jobs.services`; reads only through `jobs.selectors`.
"""

from __future__ import annotations

import uuid
from base64 import b64decode
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.http import (
    FileResponse,
    HttpResponseBase,
    HttpResponseNotModified,
    HttpResponseRedirect,
)
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.utils.http import parse_etags
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)
from rest_framework import serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.docs import REQUEST_ID, response_header
from core.api.parsers import BoundedJSONParser, json_body
from core.api.permissions import staff_powers
from core.api.serializers import (
    ClosedSerializer,
    QueryFilterSerializer,
    StrictCharField,
)
from core.request_id import correlation_id_of, request_id_of
from jobs.api.docs import RATE_LIMIT_HEADERS, error_responses
from jobs.api.serializers import JobOutputSerializer
from jobs.api.throttles import JobCreateThrottle
from jobs.artefact_storage import STORAGE_ERRORS, artefact_presigned_url
from jobs.domain.create_input import JobCreateInputSerializer
from jobs.domain.exceptions import (
    ArtefactStorageUnavailableError,
    BadRequestError,
    JobNotFoundError,
    PayloadTooLargeError,
)
from jobs.domain.states import Status
from jobs.models import Job
from jobs.selectors import (
    artefact_get_for_user,
    job_get_for_user,
    job_list_for_user,
    job_version_for_user,
)
from jobs.selectors.representation import job_representation
from jobs.services import job_cancel_for_user, job_retry_for_user, job_submit
from jobs.services.creation import DEFAULT_PRIORITY
from jobs.services.retry import MAX_REASON_CHARS
from tenants.models import Scope
from tenants.permissions import RequiredScope

ETAG_HEADER = response_header("ETag", 'Strong validator "<id>-<version>".', [200, 201])
# Clients must revalidate (If-None-Match) rather than reuse a stored body.
CACHE_CONTROL = "private, no-cache"


def job_body(job: Job, request: Request) -> dict[str, Any]:
    return job_representation(job, request)


def jobs_staff_powers(request: Request) -> bool:
    """Whether the caller may use staff powers on the jobs API (other users' jobs,
    staff-only params): staff with a verified second factor and a role that reads jobs
    (`jobs.view_job`: viewer, operator, superuser). Anyone else is their plain user.
    Asked only of staff: for everyone else it costs nothing."""
    return staff_powers(request) and request.user.has_perm("jobs.view_job")


def _etag_matches(request: Request, etag: str) -> bool:
    """If-None-Match uses the weak comparison (RFC 9110 13.1.2): W/ prefixes are ignored."""
    header = request.headers.get("If-None-Match")
    if not header:
        return False
    tags = parse_etags(header)
    return "*" in tags or any(tag.removeprefix("W/") == etag for tag in tags)


class RateLimitedApi(APIView):
    """A view whose POSTs the create throttle counts: every answer, refusals included,
    carries the caller's allowance (the RateLimit-* headers the throttle computed)."""

    def finalize_response(
        self, request: Request, response: HttpResponseBase, *args: Any, **kwargs: Any
    ) -> HttpResponseBase:
        for name, value in getattr(request, "rate_limit_headers", {}).items():
            response.setdefault(name, value)
        return super().finalize_response(request, response, *args, **kwargs)


class JobCreateApi(RateLimitedApi):
    """POST /api/v1/jobs: create a job, or return the one its idempotency key made."""

    required_scope: RequiredScope = Scope.JOBS_WRITE

    parser_classes = [BoundedJSONParser]
    throttle_classes = [JobCreateThrottle]

    # The body, read as each item of a batch is (jobs.domain.create_input).
    JobCreateInputSerializer = JobCreateInputSerializer

    @extend_schema(
        operation_id="jobs_create",
        summary="Create a job (idempotent with a key)",
        request=JobCreateInputSerializer,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="Same as the body's idempotency_key (send one, or both equal).",
            ),
            REQUEST_ID,
            ETAG_HEADER,
            response_header("Location", "The new job's URL.", [201]),
            *RATE_LIMIT_HEADERS,
        ],
        responses={
            201: OpenApiResponse(JobOutputSerializer, "Created: a new job."),
            200: OpenApiResponse(JobOutputSerializer, "The job this key already made."),
            **error_responses(400, 401, 403, 409, 413, 415, 422, 429),
        },
    )
    def post(self, request: Request) -> Response:
        """The throttle has counted the request; 1. size check before parsing; 2. parse
        and validate; 3. submit through the service."""
        refuse_large_body(request, limit=settings.JOBOPS_MAX_PAYLOAD_BYTES)
        serializer = self.JobCreateInputSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        job, created = job_submit(
            owner=request.user,
            job_type=data["type"],
            params=data["params"],
            idempotency_key=idempotency_key_of(request, data.get("idempotency_key")),
            request_id=request_id_of(request),
            correlation_id=correlation_id_of(request),
            staff=jobs_staff_powers(request),
            org=data.get("org"),
            project=data.get("project"),
            org_counted=getattr(request, "rate_limit_org", None),
            run_at=data.get("run_at"),
            priority=data.get("priority", DEFAULT_PRIORITY),
        )
        headers = {"ETag": job.etag}
        if created:
            headers["Location"] = request.build_absolute_uri(
                reverse("api:job-detail", kwargs={"job_id": job.id})
            )
        return Response(
            job_body(job, request),
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
            headers=headers,
        )


def refuse_large_body(request: Request, *, limit: int) -> None:
    """413 ERR-JOB-413 for a body over `limit` bytes."""
    # Content-Length is read before the body: a 10 MB upload is refused unparsed.
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > limit:
        raise PayloadTooLargeError(
            f"The request body is {length} bytes; at most {limit} are accepted. "
            "Pass large inputs by reference.",
            details={"limit": limit, "size": length},
        )


def header_idempotency_key(request: Request) -> str | None:
    """The Idempotency-Key header's value, unquoted (the IETF draft sends it as a quoted
    string); None without one."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    return key


def idempotency_key_of(request: Request, body_key: str | None) -> str | None:
    """The create's idempotency key: the body's, else the Idempotency-Key header's
    (400 when both are sent and differ)."""
    header_key = header_idempotency_key(request)
    if header_key is not None and body_key is not None and header_key != body_key:
        raise BadRequestError(
            "The Idempotency-Key header and the body's idempotency_key differ.",
            details={"idempotency_key": ["Differs from the Idempotency-Key header."]},
        )
    return body_key if body_key is not None else header_key


# A cursor our answers make is base64 of "o=N&r=1&p=<created_at>", under 100 characters.
MAX_CURSOR_CHARS = 200
# What DRF puts in a cursor: the offset, the direction and the position.
CURSOR_KEYS = frozenset({"o", "r", "p"})


class JobCursorPagination(CursorPagination):
    ordering = "-created_at"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def get_page_size(self, request: Request) -> int | None:
        # DRF answers a page_size that is not a number, or below 1, with the default
        # page; like any other bad query value (and as the schema says: an integer of at
        # least 1) it is a 400. Above max_page_size DRF's reading stays: the maximum.
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None:
            try:
                size = int(raw)
            except ValueError as exc:
                raise serializers.ValidationError({"page_size": ["A whole number."]}) from exc
            if size < 1:
                raise serializers.ValidationError(
                    {"page_size": [f"At least 1 (at most {self.max_page_size} are sent)."]}
                )
        return super().get_page_size(request)

    def decode_cursor(self, request: Request) -> Any:
        encoded = request.query_params.get(self.cursor_query_param)
        if encoded is not None:
            self._cursor_check(encoded)
        try:
            cursor = super().decode_cursor(request)
        except Exception as exc:  # DRF answers a bad cursor with 404; it is a bad request
            raise serializers.ValidationError({"cursor": ["Invalid cursor."]}) from exc
        # A well-formed cursor can still carry any position: it becomes a created_at
        # filter, so anything but a timestamp would fail in the query (a 500).
        if cursor is not None and cursor.position is not None:
            try:
                valid = parse_datetime(cursor.position) is not None
            except (TypeError, ValueError):
                valid = False
            if not valid or "\x00" in cursor.position:
                raise serializers.ValidationError({"cursor": ["Invalid cursor position."]})
        return cursor

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        # The schema states the bounds the checks above enforce.
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.cursor_query_param:
                parameter["schema"]["maxLength"] = MAX_CURSOR_CHARS
            elif parameter["name"] == self.page_size_query_param:
                parameter["schema"]["minimum"] = 1
        return parameters

    @staticmethod
    def _cursor_check(encoded: str) -> None:
        """Refuse what no answer of ours ever sent as a cursor before DRF reads it: DRF
        decodes any base64 (3,000 'A's are NUL bytes, read as "the first page")."""
        if len(encoded) > MAX_CURSOR_CHARS:
            raise serializers.ValidationError(
                {"cursor": [f"Invalid cursor: longer than {MAX_CURSOR_CHARS} characters."]}
            )
        try:
            decoded = b64decode(encoded.encode("ascii")).decode("ascii")
            tokens = parse_qs(decoded, keep_blank_values=True)
        except (TypeError, ValueError):
            return  # DRF's own decode refuses it below, with the same answer
        if not tokens or set(tokens) - CURSOR_KEYS or any(len(v) > 1 for v in tokens.values()):
            raise serializers.ValidationError({"cursor": ["Invalid cursor."]})


class JobListApi(APIView):
    """GET /api/v1/jobs: the caller's jobs (all with staff powers), newest first."""

    required_scope: RequiredScope = Scope.JOBS_READ

    pagination_class = JobCursorPagination

    class JobListFilterSerializer(QueryFilterSerializer):
        status = serializers.ChoiceField(choices=Status.choices, required=False)
        type = serializers.ChoiceField(choices=sorted(settings.JOB_TYPES), required=False)
        category = serializers.ChoiceField(
            choices=settings.JOB_CATEGORIES,
            required=False,
            error_messages={
                "invalid_choice": (
                    f'"{{input}}" is not a category; one of: {", ".join(settings.JOB_CATEGORIES)}.'
                )
            },
            help_text="Jobs of this category only (docs/configuration.md#job-categories).",
        )
        created_after = serializers.DateTimeField(required=False)

    @extend_schema(
        operation_id="jobs_list",
        summary="List jobs",
        parameters=[JobListFilterSerializer, REQUEST_ID],
        responses={200: JobOutputSerializer(many=True), **error_responses(400, 401, 403)},
    )
    def get(self, request: Request) -> Response:
        filters = self.JobListFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        jobs = job_list_for_user(
            user=request.user,
            staff=jobs_staff_powers(request),
            status=filters.validated_data.get("status"),
            job_type=filters.validated_data.get("type"),
            category=filters.validated_data.get("category"),
            created_after=filters.validated_data.get("created_after"),
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(jobs, request, view=self)
        data = [job_representation(job, request) for job in page]
        return paginator.get_paginated_response(data)


class JobCollectionApi(JobListApi, JobCreateApi):
    """One URL, two operations: GET is JobListApi, POST is JobCreateApi."""

    required_scope: RequiredScope = {"GET": Scope.JOBS_READ, "POST": Scope.JOBS_WRITE}


class JobDetailApi(APIView):
    """GET /api/v1/jobs/{id}, with a strong ETag and If-None-Match."""

    required_scope: RequiredScope = Scope.JOBS_READ

    @extend_schema(
        operation_id="jobs_retrieve",
        summary="Read a job",
        parameters=[
            OpenApiParameter(
                "If-None-Match",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="An ETag from an earlier answer: 304 while the job is unchanged.",
            ),
            REQUEST_ID,
            ETAG_HEADER,
        ],
        responses={
            200: JobOutputSerializer,
            304: OpenApiResponse(None, "Not modified: the job is as in the ETag you sent."),
            **error_responses(401, 403, 404),
        },
    )
    def get(self, request: Request, job_id: uuid.UUID) -> Response:
        """1. With If-None-Match, read only the version (one indexed row): 304 if the
        client has it, nothing serialized. 2. Else the job with its artefacts, in one
        query, and the body."""
        staff = jobs_staff_powers(request)
        if request.headers.get("If-None-Match"):
            version = job_version_for_user(job_id=job_id, user=request.user, staff=staff)
            if version is None:
                raise JobNotFoundError()
            etag = f'"{job_id}-{version}"'
            if _etag_matches(request, etag):
                # Django's response, not DRF's: a 304 has no body to negotiate or render.
                return HttpResponseNotModified(
                    headers={"ETag": etag, "Cache-Control": CACHE_CONTROL}
                )
        job = job_get_for_user(job_id=job_id, user=request.user, staff=staff)
        return Response(
            job_body(job, request), headers={"ETag": job.etag, "Cache-Control": CACHE_CONTROL}
        )


class JobCancelApi(APIView):
    """POST /api/v1/jobs/{id}/cancel: idempotent; 200 with the job."""

    required_scope: RequiredScope = Scope.JOBS_CANCEL

    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job (idempotent)",
        request=None,
        parameters=[REQUEST_ID, ETAG_HEADER],
        responses={200: JobOutputSerializer, **error_responses(401, 403, 404, 409)},
    )
    def post(self, request: Request, job_id: uuid.UUID) -> Response:
        job = job_cancel_for_user(
            job_id=job_id, user=request.user, staff=jobs_staff_powers(request)
        )
        return Response(job_body(job, request), headers={"ETag": job.etag})


class JobRetryApi(RateLimitedApi):
    """POST /api/v1/jobs/{id}/retry: the owner runs a failed job again
    (docs/api.md#retrying-a-failed-job).

    Counted by the create's rate limit (the same buckets: a retry is a run as a create
    is), refusals included."""

    required_scope: RequiredScope = Scope.JOBS_WRITE

    parser_classes = [BoundedJSONParser]
    throttle_classes = [JobCreateThrottle]

    class JobRetryInputSerializer(ClosedSerializer):
        reason = StrictCharField(
            required=False,
            allow_blank=True,
            max_length=MAX_REASON_CHARS,
            help_text=(
                "Why (kept on the dead letter; the audit entry holds its sha256). "
                'Default: "retried by owner".'
            ),
        )

    @extend_schema(
        operation_id="jobs_retry",
        summary="Retry a failed job (the same job, a fresh retry budget)",
        request=JobRetryInputSerializer,
        parameters=[REQUEST_ID, ETAG_HEADER, *RATE_LIMIT_HEADERS],
        responses={
            200: OpenApiResponse(JobOutputSerializer, "The job, pending again."),
            **error_responses(400, 401, 403, 404, 409, 415, 429),
        },
    )
    def post(self, request: Request, job_id: uuid.UUID) -> Response:
        serializer = self.JobRetryInputSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        job = job_retry_for_user(
            job_id=job_id,
            user=request.user,
            staff=jobs_staff_powers(request),
            reason=serializer.validated_data.get("reason"),
        )
        return Response(job_body(job, request), headers={"ETag": job.etag})


class JobArtefactApi(APIView):
    """GET /api/v1/jobs/{id}/artefacts/{aid}: the file, streamed, or (ARTEFACT_DOWNLOAD
    presigned, S3) a redirect to a short-lived URL of it; ownership is checked first."""

    required_scope: RequiredScope = Scope.JOBS_READ

    @extend_schema(
        operation_id="jobs_artefact_download",
        summary="Download an artefact",
        parameters=[REQUEST_ID],
        responses={
            (200, "*/*"): OpenApiResponse(OpenApiTypes.BINARY, "The file, as an attachment."),
            302: OpenApiResponse(
                None,
                "ARTEFACT_DOWNLOAD=presigned: Location is a URL of the file in object "
                "storage, valid for ARTEFACT_PRESIGNED_EXPIRY_SECONDS.",
            ),
            **error_responses(401, 403, 404, 503),
        },
    )
    def get(self, request: Request, job_id: uuid.UUID, artefact_id: uuid.UUID) -> HttpResponseBase:
        artefact = artefact_get_for_user(
            job_id=job_id,
            artefact_id=artefact_id,
            user=request.user,
            staff=jobs_staff_powers(request),
        )
        content_type = artefact.content_type or "application/octet-stream"
        url = artefact_presigned_url(
            key=artefact.file.name, filename=artefact.name, content_type=content_type
        )
        if url is not None:
            return HttpResponseRedirect(url, headers={"Cache-Control": "private, no-store"})
        try:
            # S3 asks for the object's head here, so a store that is down answers
            # now, in the envelope, rather than in the middle of the stream.
            handle = artefact.file.open("rb")
        except FileNotFoundError as exc:
            raise JobNotFoundError("The artefact's file is missing from storage.") from exc
        except STORAGE_ERRORS as exc:
            raise ArtefactStorageUnavailableError() from exc
        response = FileResponse(
            handle,
            as_attachment=True,
            filename=artefact.name,
            content_type=content_type,
        )
        response["ETag"] = f'"{artefact.sha256}"'
        return response
