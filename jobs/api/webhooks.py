"""/api/v1/webhooks: an organisation admin's webhook endpoints (docs/webhooks.md#api).

Every operation needs the token scope `webhooks:manage` and an admin role in the
endpoint's organisation: a plain member is refused (403), an endpoint of another
organisation is not found (404). The secret is in the answer to POST and to
POST .../rotate only.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.parsers import json_body
from jobs.api.docs import error_responses
from jobs.domain.exceptions import WebhookForbiddenError, WebhookInputError
from jobs.services.webhooks import (
    webhook_create,
    webhook_delete,
    webhook_get,
    webhook_rotate,
    webhook_update,
)
from jobs.tables.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tenants.models import Organisation, Role, Scope
from tenants.permissions import RequiredScope
from tenants.selectors import actor_for, memberships_of


def admin_org_ids(request: Request) -> list[int]:
    """The organisations the caller administers; 403 when none (a plain member)."""
    found = [m.org_id for m in memberships_of(request.user) if m.role == Role.ADMIN]
    if not found:
        raise WebhookForbiddenError()
    return found


# How many of an endpoint's latest attempts its detail shows.
RECENT_ATTEMPTS = 10


def recent_attempts(endpoint: WebhookEndpoint) -> list[dict[str, Any]]:
    """The endpoint's latest attempts, newest first: what the receiver answered."""
    rows = (
        WebhookAttempt.objects.filter(delivery__endpoint=endpoint)
        .select_related("delivery")
        .order_by("-at", "-id")[:RECENT_ATTEMPTS]
    )
    return [
        {
            "at": a.at,
            "webhook_id": a.delivery.webhook_id,
            "event_type": a.delivery.event_type,
            "status": a.status,
            "latency_ms": a.latency_ms,
            "response": a.response,
        }
        for a in rows
    ]


def endpoint_body(endpoint: WebhookEndpoint, *, secret: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": endpoint.id,
        "org": endpoint.organisation.slug,
        "project": endpoint.project.slug if endpoint.project_id and endpoint.project else None,
        "url": endpoint.url,
        "events": list(endpoint.events),
        "description": endpoint.description,
        "enabled": endpoint.enabled,
        "disabled_at": endpoint.disabled_at,
        "disabled_reason": endpoint.disabled_reason,
        "failing_since": endpoint.failing_since,
        "last_success_at": endpoint.last_success_at,
        "last_failure_at": endpoint.last_failure_at,
        "last_error": endpoint.last_error,
        "waiting": WebhookDelivery.objects.filter(
            endpoint=endpoint, delivered_at__isnull=True
        ).count(),
        "created_at": endpoint.created_at,
    }
    if secret is not None:
        body["secret"] = secret
    return body


def _object(request: Request) -> dict[str, Any]:
    data = json_body(request)
    if not isinstance(data, dict):
        raise WebhookInputError("The body is a JSON object.")
    return data


class WebhookCollectionApi(APIView):
    """GET /api/v1/webhooks: the caller's organisations' endpoints; POST: register one."""

    parser_classes = [JSONParser]
    required_scope: RequiredScope = Scope.WEBHOOKS_MANAGE
    error_prefix = "ERR-WEBHOOK"

    @extend_schema(
        operation_id="webhooks_list",
        summary="List webhook endpoints",
        responses={200: OpenApiTypes.OBJECT, **error_responses(401, 403)},
    )
    def get(self, request: Request) -> Response:
        orgs = admin_org_ids(request)
        rows = (
            WebhookEndpoint.objects.filter(organisation_id__in=orgs)
            .select_related("organisation", "project")
            .order_by("id")[:100]
        )
        return Response({"results": [endpoint_body(e) for e in rows]})

    @extend_schema(
        operation_id="webhooks_create",
        summary="Register a webhook endpoint (its secret is shown once)",
        request=OpenApiTypes.OBJECT,
        responses={
            201: OpenApiResponse(OpenApiTypes.OBJECT, "The endpoint, with its `secret`."),
            **error_responses(400, 401, 403, 422),
        },
    )
    def post(self, request: Request) -> Response:
        orgs = admin_org_ids(request)
        data = _object(request)
        slug = data.get("org")
        if slug is None:
            if len(orgs) > 1:
                raise WebhookInputError(
                    "You administer several organisations: name one.",
                    details={"org": ["Required."]},
                )
            org = Organisation.objects.get(pk=orgs[0])
        else:
            org_or_none = Organisation.objects.filter(slug=str(slug)[:50], id__in=orgs).first()
            if org_or_none is None:
                raise WebhookForbiddenError()
            org = org_or_none
        issued = webhook_create(
            org=org,
            url=data.get("url"),
            events=data.get("events"),
            project=data.get("project"),
            description=data.get("description", ""),
            actor=actor_for(request.user),
            created_by=request.user.get_username(),
        )
        return Response(
            endpoint_body(issued.endpoint, secret=issued.secret), status=status.HTTP_201_CREATED
        )


class WebhookDetailApi(APIView):
    """GET, PATCH, DELETE /api/v1/webhooks/{id}."""

    parser_classes = [JSONParser]
    required_scope: RequiredScope = Scope.WEBHOOKS_MANAGE
    error_prefix = "ERR-WEBHOOK"

    @extend_schema(
        operation_id="webhooks_retrieve",
        summary="Read a webhook endpoint and its delivery state",
        responses={200: OpenApiTypes.OBJECT, **error_responses(401, 403, 404)},
    )
    def get(self, request: Request, webhook_id: int) -> Response:
        endpoint = webhook_get(org_ids=admin_org_ids(request), endpoint_id=webhook_id)
        return Response({**endpoint_body(endpoint), "recent_attempts": recent_attempts(endpoint)})

    @extend_schema(
        operation_id="webhooks_partial_update",
        summary="Change a webhook endpoint (url, events, project, description, enabled)",
        request=OpenApiTypes.OBJECT,
        responses={200: OpenApiTypes.OBJECT, **error_responses(400, 401, 403, 404, 422)},
    )
    def patch(self, request: Request, webhook_id: int) -> Response:
        endpoint = webhook_get(org_ids=admin_org_ids(request), endpoint_id=webhook_id)
        endpoint = webhook_update(
            endpoint=endpoint, changes=_object(request), actor=actor_for(request.user)
        )
        return Response(endpoint_body(webhook_get(org_ids=None, endpoint_id=endpoint.id)))

    @extend_schema(
        operation_id="webhooks_destroy",
        summary="Remove a webhook endpoint and its deliveries",
        responses={204: None, **error_responses(401, 403, 404)},
    )
    def delete(self, request: Request, webhook_id: int) -> Response:
        endpoint = webhook_get(org_ids=admin_org_ids(request), endpoint_id=webhook_id)
        webhook_delete(endpoint=endpoint, actor=actor_for(request.user))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookRotateApi(APIView):
    """POST /api/v1/webhooks/{id}/rotate: a new secret (shown once)."""

    required_scope: RequiredScope = Scope.WEBHOOKS_MANAGE
    error_prefix = "ERR-WEBHOOK"

    @extend_schema(
        operation_id="webhooks_rotate",
        summary="Rotate a webhook endpoint's secret (both sign during the overlap)",
        request=None,
        responses={200: OpenApiTypes.OBJECT, **error_responses(401, 403, 404)},
    )
    def post(self, request: Request, webhook_id: int) -> Response:
        endpoint = webhook_get(org_ids=admin_org_ids(request), endpoint_id=webhook_id)
        issued = webhook_rotate(endpoint=endpoint, actor=actor_for(request.user))
        return Response(endpoint_body(issued.endpoint, secret=issued.secret))
