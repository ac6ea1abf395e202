"""Uploads (docs/api.md#uploading-an-input): POST /api/v1/uploads stores an input file
for the caller's organisation and answers its id and sha256; an `import` job names the
id. GET /api/v1/uploads/{id} reads it back (its organisation's members only)."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.urls import reverse
from drf_spectacular.utils import OpenApiRequest, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.docs import REQUEST_ID, response_header
from core.api.parsers import json_body
from core.api.serializers import ClosedSerializer, StrictCharField
from jobs.api.docs import RATE_LIMIT_HEADERS, error_responses
from jobs.api.throttles import JobCreateThrottle
from jobs.api.views import RateLimitedApi, refuse_large_body
from jobs.domain.uploads import FORMAT_MEDIA_TYPES, UPLOAD_FORMATS
from jobs.selectors.uploads import upload_get_for_user
from jobs.services.uploads import upload_create
from jobs.tables.uploads import Upload
from tenants.models import Scope
from tenants.permissions import RequiredScope
from tenants.selectors import actor_for, placement_for

# Room in a multipart body for what surrounds the file (the boundaries, each part's
# headers, the `org` field): a body longer than the largest upload plus this is refused
# from its Content-Length, unread.
MULTIPART_OVERHEAD = 16 * 1024


class UploadOutputSerializer(serializers.Serializer):  # type: ignore[type-arg]
    id = serializers.UUIDField()
    sha256 = serializers.CharField(help_text="Hex SHA-256 of the bytes as received.")
    size = serializers.IntegerField(help_text="Bytes.")
    name = serializers.CharField(help_text="The file name the client sent.")
    content_type = serializers.ChoiceField(choices=sorted(UPLOAD_FORMATS))
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(
        help_text="Until when a job may name it; unnamed by then, it is deleted "
        "(JOBOPS_UPLOAD_TTL after the upload)."
    )


def upload_body(upload: Upload) -> dict[str, Any]:
    return {
        "id": str(upload.id),
        "sha256": upload.sha256,
        "size": upload.size,
        "name": upload.name,
        "content_type": upload.content_type,
        "created_at": upload.created_at.isoformat(),
        "expires_at": upload.expires_at.isoformat(),
    }


# The multipart body as the OpenAPI schema states it (UploadInputSerializer reads it).
UPLOAD_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "file": {
            "type": "string",
            "format": "binary",
            "description": f"The input, labelled as one of: {', '.join(UPLOAD_FORMATS)} "
            "(the part's own Content-Type; see `format` for an unlabelled one), at most "
            "JOBOPS_UPLOAD_MAX_BYTES.",
        },
        "org": {
            "type": "string",
            "maxLength": 64,
            "description": "The organisation's slug; needed only by a caller in several.",
        },
        "format": {
            "type": "string",
            "enum": sorted(FORMAT_MEDIA_TYPES),
            "description": "What the file holds, for a part without its own Content-Type "
            "(or application/octet-stream) whose name has no .csv, .jsonl or .ndjson "
            "extension.",
        },
    },
    "required": ["file"],
    "additionalProperties": False,
}


class UploadCreateApi(RateLimitedApi):
    """POST /api/v1/uploads: one file, multipart/form-data, counted by the create's rate
    limit (an upload is the first half of a create)."""

    required_scope: RequiredScope = Scope.JOBS_WRITE

    parser_classes = [MultiPartParser]
    throttle_classes = [JobCreateThrottle]

    class UploadInputSerializer(ClosedSerializer):
        file = serializers.FileField(
            allow_empty_file=True,
            help_text="The input (UPLOAD_REQUEST_SCHEMA says what it may be).",
        )
        org = StrictCharField(
            required=False,
            max_length=64,
            help_text="The organisation's slug; needed only by a caller in several.",
        )
        format = serializers.ChoiceField(choices=sorted(FORMAT_MEDIA_TYPES), required=False)

    @extend_schema(
        operation_id="uploads_create",
        summary="Upload an input file (stored with its sha256)",
        # Inline, not a component: a client generator (and schemathesis) reads the
        # properties of a multipart body only from an inline schema, and sends `file`
        # as a file (with a file name) only when it sees its binary format.
        request={
            "multipart/form-data": OpenApiRequest(
                UPLOAD_REQUEST_SCHEMA,
                encoding={"file": {"contentType": ", ".join(UPLOAD_FORMATS)}},
            )
        },
        parameters=[
            REQUEST_ID,
            response_header("Location", "The upload's URL.", [201]),
            *RATE_LIMIT_HEADERS,
        ],
        responses={
            201: OpenApiResponse(UploadOutputSerializer, "Stored."),
            **error_responses(400, 401, 403, 413, 415, 422, 429, 503),
        },
    )
    def post(self, request: Request) -> Response:
        """The throttle has counted the request; 1. size check before parsing (413,
        unread); 2. multipart only (415); 3. the organisation, as a create finds it;
        4. store through the service (415 for a file type not accepted, 422 for one
        that says nothing of its type, 413 for a file larger than allowed)."""
        limit = settings.JOBOPS_UPLOAD_MAX_BYTES
        refuse_large_body(request, limit=limit + MULTIPART_OVERHEAD)
        # As for JSON bodies: a labelled body the view does not parse is 415, an empty
        # unlabelled one reads as no fields (400, naming `file`).
        serializer = self.UploadInputSerializer(data=json_body(request))
        serializer.is_valid(raise_exception=True)
        uploaded = serializer.validated_data["file"]
        placement = placement_for(request.user, org=serializer.validated_data.get("org"))
        upload = upload_create(
            org_id=placement.org_id,
            user=request.user,
            source=uploaded.file,
            name=uploaded.name or "upload",
            content_type=uploaded.content_type,
            size=uploaded.size,
            actor=actor_for(request.user),
            file_format=serializer.validated_data.get("format"),
        )
        location = request.build_absolute_uri(
            reverse("api:upload-detail", kwargs={"upload_id": upload.id})
        )
        return Response(
            upload_body(upload), status=status.HTTP_201_CREATED, headers={"Location": location}
        )


class UploadDetailApi(APIView):
    """GET /api/v1/uploads/{id}: an upload of one of the caller's organisations."""

    required_scope: RequiredScope = Scope.JOBS_READ

    @extend_schema(
        operation_id="uploads_retrieve",
        summary="Read an upload's record",
        parameters=[REQUEST_ID],
        responses={200: UploadOutputSerializer, **error_responses(401, 403, 404)},
    )
    def get(self, request: Request, upload_id: uuid.UUID) -> Response:
        return Response(upload_body(upload_get_for_user(upload_id=upload_id, user=request.user)))
