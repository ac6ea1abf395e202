"""Organisations → Webhook endpoints → Deliveries in headless Chromium: a superuser reads
an endpoint's deliveries, sends one again with *Redeliver*, and the portal audits it
with the operator's id. Screenshots under var/screenshots/ (names 16x-)."""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.by import By

from audit.models import AuditLog
from audit.services import Actor
from jobs.services.webhooks import webhook_create
from tests.browser.conftest import shoot
from tests.browser.test_portal import click_and_wait, log_in, wait
from tests.factories import OrganisationFactory, UserFactory
from tests.jobs.test_webhooks_portal import BASE, delivered

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def endpoint():
    return webhook_create(
        org=OrganisationFactory(slug="acme"),
        url="https://hooks.example.com/jobops",
        events=["job.status.changed"],
        actor=Actor.system("test"),
    ).endpoint


def test_a_superuser_redelivers_from_the_portal_and_it_is_audited(browser, live_server, endpoint):
    delivery = delivered(endpoint)
    admin = UserFactory(username="ada", is_staff=True, is_superuser=True)
    log_in(browser, live_server, "", "", user=admin)
    browser.get(f"{live_server.url}{BASE}/{endpoint.pk}/deliveries/")
    row = wait(browser, "#deliveries tbody tr")
    assert delivery.webhook_id in row.text and "delivered" in row.text
    shoot(browser, "160-webhook-deliveries")
    click_and_wait(browser, "#deliveries input[type=submit][value=Redeliver]")
    assert "1 delivery queued again" in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    assert "waiting" in wait(browser, "#deliveries tbody tr").text
    delivery.refresh_from_db()
    assert delivery.delivered_at is None
    entry = AuditLog.objects.get(event_type="webhook_redelivered")
    assert (entry.actor_type, entry.actor_id) == ("operator", str(admin.pk))
    assert json.loads(entry.payload)["data"]["webhook_id"] == delivery.webhook_id
