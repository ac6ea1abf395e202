"""GET /api/v1/jobs/{id}/audit-proof and GET /api/v1/audit/tree-heads/consistency
(docs/api.md#audit-proofs): thin views over audit.proofs."""

from __future__ import annotations

import uuid

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.proofs import ChainNotFound, job_proof
from audit.tree_log import TreeHeadNotFound, consistency_document
from core.api.docs import REQUEST_ID, error_responses_from, response_header
from core.api.serializers import QueryFilterSerializer
from core.errors import ApplicationError
from jobs.api.docs import ERRORS
from jobs.api.views import jobs_staff_powers
from jobs.domain.exceptions import JobNotFoundError
from jobs.selectors import job_version_for_user
from tenants.models import Scope
from tenants.permissions import RequiredScope

# A tree size is a count of checkpoints: one a minute is ~500,000 a year.
MAX_TREE_SIZE = 2**53


class TreeHeadQueryError(ApplicationError):
    code = "ERR-AUDIT-400"
    http_status = 400
    default_message = "first and second must be integers with 1 <= first <= second."


class TreeHeadNotFoundError(ApplicationError):
    code = "ERR-AUDIT-404"
    http_status = 404
    default_message = "No signed tree head of that size."


PROOF_ERRORS = {
    **ERRORS,
    404: (
        "ERR-JOB-404: no such job, or the caller may not see it (another organisation's, or "
        "another member's: docs/tenancy.md#visibility); also a job whose audit entries are no "
        "longer in the database (ask the operator for its archive).",
        ["ERR-JOB-404"],
    ),
    409: (
        "ERR-AUDIT-PROOF-PENDING: no signed checkpoint covers the job's newest audit entry "
        "yet; retry after the next checkpoint (Retry-After seconds).",
        ["ERR-AUDIT-PROOF-PENDING"],
    ),
}
CONSISTENCY_ERRORS = {
    **ERRORS,
    400: (
        "ERR-AUDIT-400: first or second missing, not an integer, or not 1 <= first <= second.",
        ["ERR-AUDIT-400"],
    ),
    404: ("ERR-AUDIT-404: no signed tree head of that size (yet).", ["ERR-AUDIT-404"]),
}
PROOF_BODY = OpenApiResponse(
    OpenApiTypes.OBJECT,
    "The proof (format jobops-audit-proof, version 1): the job's audit entries, its chain's "
    "head, the head's inclusion in a signed checkpoint, that checkpoint's inclusion in the "
    "newest signed tree head, and that tree head. Verify it offline with "
    "`manage.py verify_audit_chain --proof FILE --public-key KEY` (docs/security.md).",
)


class JobAuditProofApi(APIView):
    """GET /api/v1/jobs/{id}/audit-proof: the job's visibility rules, then the proof."""

    required_scope: RequiredScope = Scope.JOBS_READ

    @extend_schema(
        operation_id="jobs_audit_proof",
        summary="A proof of the job's audit history, verifiable offline",
        parameters=[
            REQUEST_ID,
            response_header("Retry-After", "Seconds until the next checkpoint.", [409]),
        ],
        responses={200: PROOF_BODY, **error_responses_from(PROOF_ERRORS, 401, 403, 404, 409)},
    )
    def get(self, request: Request, job_id: uuid.UUID) -> Response:
        staff = jobs_staff_powers(request)
        if job_version_for_user(job_id=job_id, user=request.user, staff=staff) is None:
            raise JobNotFoundError()
        try:
            proof = job_proof(job_id)
        except ChainNotFound:
            raise JobNotFoundError(
                "The job's audit entries are no longer in the database."
            ) from None
        return Response(proof, headers={"Cache-Control": "private, no-store"})


class ConsistencyQuerySerializer(QueryFilterSerializer):
    first = serializers.IntegerField(min_value=1, max_value=MAX_TREE_SIZE)
    second = serializers.IntegerField(min_value=1, max_value=MAX_TREE_SIZE)


class TreeHeadConsistencyApi(APIView):
    """GET /api/v1/audit/tree-heads/consistency?first=N&second=M."""

    required_scope: RequiredScope = Scope.JOBS_READ

    @extend_schema(
        operation_id="audit_tree_heads_consistency",
        summary="A consistency proof between two signed tree heads of the checkpoint log",
        parameters=[
            OpenApiParameter("first", OpenApiTypes.INT, OpenApiParameter.QUERY, required=True),
            OpenApiParameter("second", OpenApiTypes.INT, OpenApiParameter.QUERY, required=True),
            REQUEST_ID,
        ],
        responses={
            200: OpenApiResponse(
                OpenApiTypes.OBJECT,
                "The two signed tree heads and the RFC 9162 consistency path (format "
                "jobops-audit-consistency): `verify_audit_chain --consistency FILE "
                "--public-key KEY`.",
            ),
            **error_responses_from(CONSISTENCY_ERRORS, 400, 401, 403, 404),
        },
    )
    def get(self, request: Request) -> Response:
        query = ConsistencyQuerySerializer(data=request.query_params)
        if not query.is_valid():
            raise TreeHeadQueryError(details=query.errors)
        first, second = query.validated_data["first"], query.validated_data["second"]
        if first > second:
            raise TreeHeadQueryError("first must not exceed second.")
        try:
            document = consistency_document(first, second)
        except TreeHeadNotFound as exc:
            raise TreeHeadNotFoundError(f"No signed tree head of size {exc.args[0]}.") from None
        return Response(document, headers={"Cache-Control": "private, max-age=3600"})
