"""Organisations → Webhook endpoints in the portal (jobs/admin/webhooks.py), and
`manage.py webhook`."""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from audit.models import AuditLog
from audit.services import Actor
from jobs.models import EventOutbox
from jobs.processes.events import outbox_prune
from jobs.services.webhooks import webhook_create, webhook_deliveries_purge
from jobs.tables.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tests.factories import OrganisationFactory, otp_login, role_user

pytestmark = pytest.mark.django_db

BASE = "/admin/jobs/webhookendpoint"


@pytest.fixture
def endpoint():
    org = OrganisationFactory(slug="acme")
    return webhook_create(
        org=org,
        url="https://hooks.example.com/jobops",
        events=["job.status.changed"],
        actor=Actor.system("test"),
    ).endpoint


def delivered(endpoint, **fields):
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint,
        webhook_id=f"msg_{uuid.uuid4()}",
        event_type="job.status.changed",
        job_id=uuid.uuid4(),
        seq=1,
        body='{"type": "job.status.changed"}',
        attempts=1,
        next_attempt_at=timezone.now(),
        delivered_at=timezone.now(),
        **fields,
    )
    WebhookAttempt.objects.create(
        delivery=delivery, at=timezone.now(), status=200, latency_ms=12, response="ok"
    )
    return delivery


def test_the_pages_load_and_sit_under_organisations(otp_admin_client, endpoint):
    for url in (f"{BASE}/", f"{BASE}/add/", f"{BASE}/{endpoint.pk}/change/"):
        assert otp_admin_client.get(url).status_code == 200, url
    index = otp_admin_client.get("/admin/tenants/")
    assert index.status_code == 200 and b"webhookendpoint" in index.content


def test_redeliver_from_the_portal_is_audited(otp_admin_client, endpoint):
    delivery = delivered(endpoint)
    page = otp_admin_client.get(f"{BASE}/{endpoint.pk}/deliveries/")
    assert page.status_code == 200
    assert delivery.webhook_id.encode() in page.content and b"12 ms" in page.content
    response = otp_admin_client.post(
        f"{BASE}/{endpoint.pk}/deliveries/", {"redeliver": delivery.pk}
    )
    assert response.status_code == 302
    delivery.refresh_from_db()
    assert delivery.delivered_at is None and delivery.next_attempt_at <= timezone.now()
    entry = AuditLog.objects.get(event_type="webhook_redelivered")
    assert entry.actor_type == "operator"
    assert entry.actor_id == str(otp_admin_client.user.pk)
    assert json.loads(entry.payload)["data"]["webhook_id"] == delivery.webhook_id


def test_the_add_page_shows_the_secret_once_and_refuses_loopback(otp_admin_client):
    org = OrganisationFactory(slug="beta")
    fields = {"organisation": org.pk, "events": ["job.status.changed"], "description": ""}
    refused = otp_admin_client.post(
        f"{BASE}/add/", {**fields, "url": "http://127.0.0.1/x"}, follow=True
    )
    assert b"refused" in refused.content and not WebhookEndpoint.objects.exists()
    made = otp_admin_client.post(
        f"{BASE}/add/", {**fields, "url": "https://example.com/x"}, follow=True
    )
    assert b"whsec_" in made.content
    endpoint = WebhookEndpoint.objects.get()
    assert b"whsec_" not in otp_admin_client.get(f"{BASE}/{endpoint.pk}/change/").content


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_the_portal_roles_do_not_redeliver(role, endpoint):
    delivery = delivered(endpoint)
    client = otp_login(Client(), role_user(role))
    response = client.post(f"{BASE}/{endpoint.pk}/deliveries/", {"redeliver": delivery.pk})
    assert response.status_code == 403
    assert not AuditLog.objects.filter(event_type="webhook_redelivered").exists()


def test_the_command_adds_lists_disables_enables_rotates_and_removes():
    OrganisationFactory(slug="gamma")
    out = io.StringIO()
    call_command(
        "webhook", "add", "gamma", "https://example.com/h", "--events", "job.progress", stdout=out
    )
    endpoint = WebhookEndpoint.objects.get()
    assert f"endpoint {endpoint.pk}" in out.getvalue() and "secret whsec_" in out.getvalue()
    for action, state in (("disable", False), ("enable", True)):
        call_command("webhook", action, str(endpoint.pk), stdout=io.StringIO())
        endpoint.refresh_from_db()
        assert endpoint.enabled is state
    listing = io.StringIO()
    call_command("webhook", "list", "gamma", stdout=listing)
    assert "https://example.com/h" in listing.getvalue()
    rotated = io.StringIO()
    call_command("webhook", "rotate", str(endpoint.pk), stdout=rotated)
    assert rotated.getvalue().startswith("secret whsec_")
    call_command("webhook", "remove", str(endpoint.pk), stdout=io.StringIO())
    assert not WebhookEndpoint.objects.exists()
    with pytest.raises(CommandError, match="refused"):
        call_command(
            "webhook",
            "add",
            "gamma",
            "http://[::1]/h",
            "--events",
            "job.progress",
            stdout=io.StringIO(),
        )
    kinds = list(AuditLog.objects.values_list("event_type", flat=True))
    for kind in ("webhook_created", "webhook_disabled", "webhook_enabled", "webhook_rotated"):
        assert kind in kinds


def test_the_purge_removes_old_deliveries_and_keeps_waiting_ones(endpoint):
    old = delivered(endpoint)
    WebhookDelivery.objects.filter(pk=old.pk).update(
        delivered_at=timezone.now() - timedelta(days=30)
    )
    WebhookAttempt.objects.update(at=timezone.now() - timedelta(days=30))
    recent = delivered(endpoint)
    waiting = delivered(endpoint)
    WebhookDelivery.objects.filter(pk=waiting.pk).update(delivered_at=None)
    assert webhook_deliveries_purge(dry_run=True) == 1
    assert webhook_deliveries_purge() == 1
    assert set(WebhookDelivery.objects.values_list("pk", flat=True)) == {recent.pk, waiting.pk}


def test_outbox_prune_keeps_rows_the_fanout_has_not_read(endpoint):
    row = EventOutbox.objects.create(
        job_id=uuid.uuid4(), seq=1, payload={}, published_at=timezone.now() - timedelta(days=9)
    )
    assert outbox_prune(older_than=timedelta(days=1)) == 0
    assert EventOutbox.objects.filter(pk=row.pk).exists()
    WebhookEndpoint.objects.all().delete()  # no endpoint: nothing to wait for
    assert outbox_prune(older_than=timedelta(days=1)) == 1


def test_staff_limited_to_other_organisations_do_not_see_the_endpoint(endpoint):
    from django.contrib.auth.models import Permission

    from tenants.models import OperatorScope

    staff = role_user("operator")
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_webhookendpoint", "change_webhookendpoint"])
    )
    OperatorScope.objects.create(user=staff).organisations.add(OrganisationFactory(slug="other"))
    client = otp_login(Client(), staff)
    assert client.get(f"{BASE}/").status_code == 200
    assert b"hooks.example.com" not in client.get(f"{BASE}/").content
    assert client.get(f"{BASE}/{endpoint.pk}/deliveries/").status_code == 404


def test_the_changelist_actions_disable_and_enable_endpoints_each_audited(
    otp_admin_client, endpoint
):
    for action, enabled, event in (
        ("disable", False, "webhook_disabled"),
        ("disable", False, None),  # already disabled: nothing changes, nothing audited
        ("enable", True, "webhook_enabled"),
    ):
        before = AuditLog.objects.count()
        page = otp_admin_client.post(
            f"{BASE}/", {"action": action, "_selected_action": [endpoint.pk]}, follow=True
        )
        endpoint.refresh_from_db()
        assert endpoint.enabled is enabled
        assert (b"1 endpoint(s)" if event else b"0 endpoint(s)") in page.content
        added = AuditLog.objects.order_by("id")[before:]
        assert [e.event_type for e in added] == ([event] if event else [])
        if event:
            assert added[0].actor_id == str(otp_admin_client.user.pk)
