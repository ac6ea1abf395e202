"""OpenAPI pieces every API area shares: error responses built from a table, headers.

Each area keeps its own table of `status -> (description, codes)` (jobs/api/docs.py,
dlq/api/docs.py) so that a view's decorator reads as the list of what it can answer.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse

from core.api.serializers import ErrorEnvelopeSerializer

ErrorTable = dict[int, tuple[str, list[str]]]


def error_responses_from(table: ErrorTable, *statuses: int) -> dict[int, OpenApiResponse]:
    """The documented error answers for `statuses`, one example per code."""
    responses = {}
    for status in statuses:
        description, codes = table[status]
        examples = [
            OpenApiExample(
                code,
                value={"error": {"code": code, "message": "...", "details": {}}},
                status_codes=[status],
                response_only=True,
            )
            for code in codes
        ]
        responses[status] = OpenApiResponse(ErrorEnvelopeSerializer, description, examples)
    return responses


def response_header(name: str, description: str, statuses: list[int]) -> OpenApiParameter:
    return OpenApiParameter(
        name, OpenApiTypes.STR, OpenApiParameter.HEADER, description=description, response=statuses
    )


REQUEST_ID = OpenApiParameter(
    "X-Request-ID",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Your id for this request (1-128 of A-Z a-z 0-9 . _ : -); else one is generated. "
    "Returned in the response and stored on a created job.",
)
