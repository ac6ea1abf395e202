"""Webhook endpoints of an organisation: register, change, rotate, disable, redeliver
(docs/webhooks.md).

Each change is audited on the ops chain in its transaction (`webhook_created`,
`webhook_updated`, `webhook_rotated`, `webhook_disabled`, `webhook_enabled`,
`webhook_deleted`, `webhook_redelivered`), naming the endpoint and its organisation,
never a secret. Delivery itself is jobs/processes/webhooks.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import OPS_CHAIN, Actor, audit_append
from core.redact import redact_url
from jobs.domain.exceptions import WebhookInputError, WebhookNotFoundError
from jobs.integrations import metrics
from jobs.integrations.webhook_http import url_refusal
from jobs.services.webhook_secrets import secret_decrypt, secret_encrypt, secret_new
from jobs.tables.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tenants.models import Organisation, Project

STATUS_CHANGED, PROGRESS, DEAD_LETTERED = "job.status.changed", "job.progress", "job.dead_lettered"
EVENT_TYPES = (STATUS_CHANGED, PROGRESS, DEAD_LETTERED)
MAX_URL = 2048
MAX_ENDPOINTS_PER_ORG = 50
MAX_REDELIVER = 500
DELIVERY_ACTOR = Actor.system("webhooks")


@dataclass(frozen=True)
class IssuedSecret:
    """An endpoint and its new secret: the secret exists in clear only here."""

    endpoint: WebhookEndpoint
    secret: str


def _audit(event_type: str, endpoint: WebhookEndpoint, actor: Actor, **data: Any) -> None:
    audit_append(
        chain=OPS_CHAIN,
        event_type=event_type,
        actor=actor,
        data={"endpoint_id": endpoint.id, "org_id": endpoint.organisation_id, **data},
    )


def _url(url: Any) -> str:
    if not isinstance(url, str) or not url.strip():
        raise WebhookInputError("A URL is needed.", details={"url": ["Required."]})
    url = url.strip()
    if len(url) > MAX_URL:
        raise WebhookInputError(
            f"The URL is longer than {MAX_URL} characters.", details={"url": ["Too long."]}
        )
    refusal = url_refusal(url)
    if refusal:
        raise WebhookInputError(f"The URL is refused: {refusal}.", details={"url": [refusal]})
    return url


def _events(events: Any) -> list[str]:
    if not isinstance(events, list) or not events or len(events) > len(EVENT_TYPES):
        raise WebhookInputError(
            "Name the events to receive: a list of " + ", ".join(EVENT_TYPES) + ".",
            details={"events": ["A non-empty list."]},
        )
    unknown = [e for e in events if e not in EVENT_TYPES]
    if unknown:
        raise WebhookInputError(
            f"Unknown event type(s): {', '.join(map(str, unknown))[:200]}; known: "
            + ", ".join(EVENT_TYPES)
            + ".",
            details={"events": [f"One of: {', '.join(EVENT_TYPES)}."]},
        )
    return [e for e in EVENT_TYPES if e in events]


def _project(org: Organisation, project: Any) -> Project | None:
    if project is None or project == "":
        return None
    found = (
        Project.objects.filter(organisation=org, slug=project).first()
        if isinstance(project, str)
        else None
    )
    if found is None:
        raise WebhookInputError(
            f"{str(project)[:60]!r} is not a project of {org.slug}.",
            details={"project": [f"Not a project of {org.slug}."]},
        )
    return found


def _description(text: Any) -> str:
    if text is None:
        return ""
    if not isinstance(text, str) or len(text) > 200:
        raise WebhookInputError(
            "A description is text of at most 200 characters.",
            details={"description": ["At most 200 characters."]},
        )
    return text


def webhook_create(
    *,
    org: Organisation,
    url: Any,
    events: Any,
    project: Any = None,
    description: Any = "",
    actor: Actor,
    created_by: str = "",
) -> IssuedSecret:
    """Register an endpoint of `org`; returns it with its secret (shown once)."""
    url, events_ = _url(url), _events(events)
    project_ = _project(org, project)
    description_ = _description(description)
    if WebhookEndpoint.objects.filter(organisation=org).count() >= MAX_ENDPOINTS_PER_ORG:
        raise WebhookInputError(f"An organisation has at most {MAX_ENDPOINTS_PER_ORG} endpoints.")
    secret = secret_new()
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.create(
            organisation=org,
            project=project_,
            url=url,
            events=events_,
            description=description_,
            secret_encrypted=secret_encrypt(secret),
            created_by=created_by[:200],
        )
        _audit("webhook_created", endpoint, actor, url=redact_url(url), events=events_)
    return IssuedSecret(endpoint, secret)


def webhook_update(
    *, endpoint: WebhookEndpoint, changes: dict[str, Any], actor: Actor
) -> WebhookEndpoint:
    """Change an endpoint's url, events, project, description or `enabled`."""
    unknown = sorted(set(changes) - {"url", "events", "project", "description", "enabled"})
    if unknown:
        raise WebhookInputError(
            f"Unknown field(s): {', '.join(unknown)[:200]}.",
            details={f: ["Not a field of an endpoint."] for f in unknown[:10]},
        )
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        changed: list[str] = []
        if "url" in changes:
            endpoint.url = _url(changes["url"])
            changed.append("url")
        if "events" in changes:
            endpoint.events = _events(changes["events"])
            changed.append("events")
        if "project" in changes:
            endpoint.project = _project(endpoint.organisation, changes["project"])
            changed.append("project")
        if "description" in changes:
            endpoint.description = _description(changes["description"])
            changed.append("description")
        if "enabled" in changes:
            if not isinstance(changes["enabled"], bool):
                raise WebhookInputError(
                    "enabled is true or false.", details={"enabled": ["A boolean."]}
                )
            if changes["enabled"] and not endpoint.enabled:
                _enable(endpoint, actor)
            elif not changes["enabled"] and endpoint.enabled:
                _disable(endpoint, actor, reason="disabled by an admin")
        if changed:
            endpoint.save(update_fields=[*changed, "updated_at"])
            _audit("webhook_updated", endpoint, actor, fields=changed)
    return endpoint


def _enable(endpoint: WebhookEndpoint, actor: Actor) -> None:
    """Enable in the caller's transaction: its waiting deliveries are due at once and
    the retry window starts afresh."""
    endpoint.disabled_at = None
    endpoint.disabled_reason = ""
    endpoint.failing_since = None
    endpoint.save(update_fields=["disabled_at", "disabled_reason", "failing_since", "updated_at"])
    WebhookDelivery.objects.filter(endpoint=endpoint, delivered_at__isnull=True).update(
        next_attempt_at=timezone.now()
    )
    _audit("webhook_enabled", endpoint, actor)


def _disable(endpoint: WebhookEndpoint, actor: Actor, *, reason: str) -> None:
    endpoint.disabled_at = timezone.now()
    endpoint.disabled_reason = reason[:200]
    endpoint.save(update_fields=["disabled_at", "disabled_reason", "updated_at"])
    _audit("webhook_disabled", endpoint, actor, reason=reason[:200])


def webhook_set_enabled(*, endpoint: WebhookEndpoint, enabled: bool, actor: Actor) -> bool:
    """Enable or disable; False when it already was (nothing audited)."""
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        if enabled == endpoint.enabled:
            return False
        if enabled:
            _enable(endpoint, actor)
        else:
            _disable(endpoint, actor, reason="disabled by an admin")
    return True


def webhook_disable_failing(*, endpoint_id: int, now: datetime) -> bool:
    """Delivery's disable, in its transaction, once the retry window has passed since
    the endpoint's first failure; counted and audited. False if it was not due."""
    endpoint = WebhookEndpoint.objects.select_for_update().filter(pk=endpoint_id).first()
    if endpoint is None or not endpoint.enabled or endpoint.failing_since is None:
        return False
    if now - endpoint.failing_since < settings.JOBOPS_WEBHOOK_RETRY_WINDOW:
        return False
    _disable(
        endpoint,
        DELIVERY_ACTOR,
        reason=f"failing since {endpoint.failing_since:%Y-%m-%d %H:%M} UTC: {endpoint.last_error}",
    )
    metrics.WEBHOOK_ENDPOINTS_DISABLED.inc()
    return True


def webhook_rotate(
    *, endpoint: WebhookEndpoint, actor: Actor, overlap: timedelta | None = None
) -> IssuedSecret:
    """A new secret; the current one keeps signing too (a second signature) for
    `overlap` (JOBOPS_WEBHOOK_ROTATION_OVERLAP), so that receivers can switch."""
    overlap = settings.JOBOPS_WEBHOOK_ROTATION_OVERLAP if overlap is None else overlap
    secret = secret_new()
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        endpoint.previous_secret_encrypted = endpoint.secret_encrypted
        endpoint.previous_secret_until = timezone.now() + overlap
        endpoint.secret_encrypted = secret_encrypt(secret)
        endpoint.save(
            update_fields=[
                "previous_secret_encrypted",
                "previous_secret_until",
                "secret_encrypted",
                "updated_at",
            ]
        )
        _audit("webhook_rotated", endpoint, actor, overlap_seconds=int(overlap.total_seconds()))
    return IssuedSecret(endpoint, secret)


def signing_secrets(endpoint: WebhookEndpoint, *, now: datetime) -> list[str]:
    """The secrets that sign now: the current one, and the previous during its overlap."""
    found = [secret_decrypt(endpoint.secret_encrypted)]
    if (
        endpoint.previous_secret_encrypted
        and endpoint.previous_secret_until
        and now < endpoint.previous_secret_until
    ):
        found.append(secret_decrypt(endpoint.previous_secret_encrypted))
    return found


def webhook_delete(*, endpoint: WebhookEndpoint, actor: Actor) -> None:
    """Remove the endpoint with its deliveries and their attempts."""
    with transaction.atomic():
        _audit("webhook_deleted", endpoint, actor, url=redact_url(endpoint.url))
        endpoint.delete()


def webhook_get(*, org_ids: Iterable[int] | None, endpoint_id: Any) -> WebhookEndpoint:
    """The endpoint, if it belongs to one of `org_ids` (None: any); else not found."""
    try:
        pk = int(endpoint_id)
    except (TypeError, ValueError):
        raise WebhookNotFoundError() from None
    found = WebhookEndpoint.objects.filter(pk=pk)
    if org_ids is not None:
        found = found.filter(organisation_id__in=list(org_ids))
    endpoint = found.select_related("organisation", "project").first()
    if endpoint is None:
        raise WebhookNotFoundError()
    return endpoint


def webhook_redeliver(
    *, endpoint: WebhookEndpoint, delivery_ids: Iterable[int], actor: Actor
) -> int:
    """Send the deliveries again (with their own webhook-id): each is made due now,
    delivered or not, and audited `webhook_redelivered`; returns how many."""
    ids = sorted({int(i) for i in delivery_ids})[:MAX_REDELIVER]
    with transaction.atomic():
        rows = list(
            WebhookDelivery.objects.select_for_update()
            .filter(endpoint=endpoint, id__in=ids)
            .order_by("id")
        )
        for delivery in rows:
            delivery.delivered_at = None
            delivery.next_attempt_at = timezone.now()
            delivery.save(update_fields=["delivered_at", "next_attempt_at"])
            _audit(
                "webhook_redelivered",
                endpoint,
                actor,
                delivery_id=delivery.id,
                webhook_id=delivery.webhook_id,
            )
    return len(rows)


def webhook_deliveries_purge(*, older_than: timedelta | None = None, dry_run: bool = False) -> int:
    """Delete delivered deliveries (with their attempts) delivered longer ago than
    JOBOPS_WEBHOOK_LOG_RETENTION, and attempts of waiting ones older than it; a purge
    extra (settings.JOBOPS_PURGE_EXTRAS). Returns the deliveries."""
    cutoff = timezone.now() - (older_than or settings.JOBOPS_WEBHOOK_LOG_RETENTION)
    done = WebhookDelivery.objects.filter(delivered_at__lt=cutoff)
    if dry_run:
        return done.count()
    with transaction.atomic():
        WebhookAttempt.objects.filter(at__lt=cutoff).delete()
        _, per_model = done.delete()
    return int(per_model.get(WebhookDelivery._meta.label, 0))
