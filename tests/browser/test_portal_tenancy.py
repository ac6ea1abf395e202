"""An operator limited to one organisation in headless Chromium (issue 28's "done
when": an operator limited to org B cannot see or replay org A's dead letters)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from selenium.webdriver.common.by import By

from jobs.models import DeadLetter
from tenants.models import OperatorScope
from tests.browser.conftest import shoot
from tests.browser.test_portal import log_in, wait
from tests.factories import OrganisationFactory, UserFactory, job_in_state

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_limited_to_org_b_sees_b_and_nothing_of_a(browser, live_server, broker):
    a, b = OrganisationFactory(slug="acme"), OrganisationFactory(slug="bolt")
    job_a = job_in_state("failed", owner=UserFactory(org=a), error_code="ACME_SECRET_FAILURE")
    job_b = job_in_state("failed", owner=UserFactory(org=b), error_code="BOLT_FAILURE")
    log_in(browser, live_server, "operator", "bea")
    bea = get_user_model().objects.get(username="bea")
    OperatorScope.objects.create(user=bea).organisations.add(b)

    browser.get(f"{live_server.url}/admin/jobs/deadletter/?state=open")
    wait(browser, "#result_list")
    listing = browser.find_element(By.ID, "content").text
    assert "BOLT_FAILURE" in listing and "ACME_SECRET_FAILURE" not in listing
    assert not browser.find_elements(By.ID, "replay-matching")
    shoot(browser, "90-limited-operator-dead-letters")

    browser.get(f"{live_server.url}/admin/jobs/job/{job_a.id}/change/")
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "ACME_SECRET_FAILURE" not in page and "acme" not in page
    assert str(job_a.id) not in page.replace(f"/admin/jobs/job/{job_a.id}/change/", "")
    shoot(browser, "91-limited-operator-other-orgs-job")

    browser.get(f"{live_server.url}/admin/")
    wait(browser, "#org-filter")
    options = [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#org-select option")]
    assert options[1:] == ["bolt · Organisation bolt"] and "acme" not in " ".join(options)
    shoot(browser, "92-limited-operator-dashboard")
    assert DeadLetter.objects.filter(job=job_a, state="open").exists()
    assert job_b.org_id == b.pk
