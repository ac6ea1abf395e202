"""The dashboard's Connectors panel and the job page's Attempts table in headless
Chromium, as an operator reads them at 3 a.m.: a connector that opened after failures in
a row (why, since when, the next probe), closed and opened again by hand with a reason;
a job that failed twice and then succeeded, read attempt by attempt; and what each page
says when there is nothing to show. Screenshots at laptop and phone width under
var/screenshots/ (names 14x- and 15x-)."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.test import override_settings
from selenium.webdriver.common.by import By

from audit.models import AuditLog
from audit.services import OPS_CHAIN
from jobs.models import ConnectorBreaker
from jobs.services.connectors import BreakerEnd, breakers_count, breakers_forget
from jobs.services.worker import job_claim, job_retry, job_succeed
from tests.browser.conftest import LAPTOP, PHONE, shoot, viewport
from tests.browser.test_portal import click_and_wait, log_in, wait
from tests.factories import fence_of, job_in_state, make_job

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ERP = {
    "failures": 3,
    "cooldown_seconds": 1800.0,
    "probe_wait_seconds": 30.0,
    "jitter_seconds": 60.0,
}


@pytest.fixture
def breakers():
    """The erp connector with a 3-failure breaker, read fresh on every request."""
    with override_settings(JOBOPS_CONNECTORS={"erp": dict(ERP)}, JOBOPS_CONNECTOR_CACHE_SECONDS=0):
        breakers_forget()
        yield
    breakers_forget()


def open_by_failures(code: str = "ERP_503") -> None:
    """Three erp jobs meet a 5xx in a row, as workers record it: the third opens it."""
    for _ in range(ERP["failures"]):
        job = job_in_state("running", job_type="erp", params={"event": "invoice.paid"})
        breakers_count([BreakerEnd("erp", job.id, code)])


def cells(browser, row_css: str) -> list[str]:
    """The row's cells as the operator reads them, in one step (the panel refreshes)."""
    return browser.execute_script(
        "const r = document.querySelector(arguments[0]);"
        "return r ? [...r.querySelectorAll('td')]"
        ".map(c => c.textContent.replace(/\\s+/g, ' ').trim()) : null",
        row_css,
    )


def header(browser, table_css: str) -> list[str]:
    return browser.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' thead th')]"
        ".map(c => c.textContent.replace(/\\s+/g, ' ').trim())",
        table_css,
    )


def ops_entries(event_type: str) -> list[dict]:
    rows = AuditLog.objects.filter(chain=OPS_CHAIN, event_type=event_type).order_by("seq")
    return [json.loads(r.payload)["data"] for r in rows]


def reachable_on_a_phone(browser, css: str) -> bool:
    """At phone width the control is on the page's width (no sideways scroll to find it)."""
    viewport(browser, *PHONE, mobile=True)
    try:
        return browser.execute_script(
            "const e = document.querySelector(arguments[0]); if (!e) return false;"
            "const r = e.getBoundingClientRect();"
            "return r.width > 0 && r.left >= 0 && r.right <= window.innerWidth",
            css,
        )
    finally:
        viewport(browser, *LAPTOP)


def test_an_open_connector_says_why_and_an_operator_closes_and_opens_it(
    browser, live_server, broker, breakers
):
    open_by_failures()
    log_in(browser, live_server, "operator", "olga")
    row = 'tr[data-connector="erp"]'
    wait(browser, row)
    assert header(browser, "#connectors") == [
        "Connector",
        "Breaker",
        "Failures in a row",
        "Last error",
        "Open since",
        "Next probe",
        "Job types",
    ]
    name, state, failures, error, since, probe, *_ = cells(browser, row)
    assert name.startswith("erp") and state == "open"
    assert failures == "3 of 3" and error == "ERP_503"
    # Since when and the next probe: the time and how far away, readable at once.
    assert "UTC" in since and since.endswith(("ago", "now")), since
    assert "UTC" in probe and ("in 29 min" in probe or "in 30 min" in probe), probe
    assert "{#" not in browser.find_element(By.ID, "dashboard-panel").text  # no template leaks
    status = browser.find_element(By.ID, "portal-status").text
    assert "Connector erp is open" in status and "ERP_503" in status
    assert reachable_on_a_phone(browser, f"{row} .connector-close")
    shoot(browser, "140-connector-open", at="#connectors-title")

    click_and_wait(browser, f"{row} .connector-close")
    assert "open" in browser.find_element(By.ID, "connector-state").text
    shoot(browser, "141-connector-close-form")
    # A reason of blanks passes the browser's `required` and is refused by the service.
    browser.find_element(By.ID, "id_reason").send_keys("   ")
    click_and_wait(browser, "#confirm-control")
    assert browser.find_element(By.ID, "control-error").text
    assert ConnectorBreaker.objects.get(name="erp").state == "open"
    reason = browser.find_element(By.ID, "id_reason")
    reason.clear()
    reason.send_keys("INC-41: ERP is answering again")
    click_and_wait(browser, "#confirm-control")
    wait(browser, f"{row} .connector-open")
    _name, state, failures, _error, since, probe, *_ = cells(browser, row)
    assert (failures, since, probe) == ("0 of 3", "—", "—")
    assert state.startswith("closed by hand") and "INC-41: ERP is answering again" in state
    done = browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    assert "Connector erp's breaker closed." in done
    [closed] = ops_entries("connector_closed")
    assert closed["manual"] is True and closed["reason"] == "INC-41: ERP is answering again"
    shoot(browser, "142-connector-closed", at="#connectors-title")

    click_and_wait(browser, f"{row} .connector-open")
    browser.find_element(By.ID, "id_reason").send_keys("INC-42: ERP maintenance until 04:00")
    click_and_wait(browser, "#confirm-control")
    wait(browser, f"{row} .connector-close")
    state = cells(browser, row)[1]
    assert state.startswith("open") and "by hand" in state
    assert "INC-42: ERP maintenance until 04:00" in browser.find_element(By.ID, "connectors").text
    assert ops_entries("connector_opened")[-1]["reason"] == "INC-42: ERP maintenance until 04:00"
    shoot(browser, "143-connector-opened-by-hand", at="#connectors-title")

    browser.get(f"{live_server.url}/admin/audit/auditlog/?chain=ops")
    wait(browser, "#result_list")
    listing = browser.find_element(By.ID, "result_list").text
    assert listing.count("connector_opened") == 2 and "connector_closed" in listing
    shoot(browser, "144-audit-log-connector-events")


def test_a_viewer_sees_the_open_connector_without_controls(browser, live_server, broker, breakers):
    open_by_failures()
    log_in(browser, live_server, "viewer", "vera")
    row = 'tr[data-connector="erp"]'
    wait(browser, row)
    assert cells(browser, row)[1] == "open"
    assert not browser.find_elements(By.CSS_SELECTOR, ".connector-open, .connector-close")
    shoot(browser, "145-viewer-connector-open", at="#connectors-title")


def test_without_connectors_the_panel_says_so(browser, live_server, broker):
    types = {name: {**spec, "connector": None} for name, spec in settings.JOB_TYPES.items()}
    with override_settings(JOB_TYPES=types, JOBOPS_CONNECTORS={}):
        log_in(browser, live_server, "operator", "olga")
        empty = wait(browser, "#connectors-empty")
        assert "No connectors configured" in empty.text
        assert not browser.find_elements(By.ID, "connectors")
        shoot(browser, "146-no-connectors", at="#connectors-title")


def test_a_job_that_failed_twice_then_succeeded_reads_attempt_by_attempt(
    browser, live_server, broker
):
    job = job_in_state(
        "retrying",
        worker="celery@worker-a",
        error_code="ERP_503",
        error_message="the ERP answered 503",
    )
    second = job_claim(job_id=job.id, locked_by="celery@worker-b")
    job_retry(
        job_id=job.id,
        fence=fence_of(second),
        delay=0,
        error_code="NETWORK_TIMEOUT",
        error_message="read timed out",
    )
    third = job_claim(job_id=job.id, locked_by="celery@worker-a")
    job_succeed(job_id=job.id, fence=fence_of(third), result={"ok": True})

    log_in(browser, live_server, "operator", "olga")
    browser.get(f"{live_server.url}/admin/jobs/job/{job.id}/change/")
    wait(browser, "#attempts table")
    assert header(browser, "#attempts") == [
        "#",
        "Started (UTC)",
        "Ended (UTC)",
        "Duration",
        "Outcome",
        "Error code",
    ]
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#attempts tbody tr')]"
        ".map(r => [...r.querySelectorAll('td')]"
        ".map(c => c.textContent.replace(/\\s+/g, ' ').trim()))"
    )
    assert "{#" not in browser.find_element(By.ID, "attempts").text  # no template leaks
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert [r[4] for r in rows] == ["failed, retried", "failed, retried", "succeeded"]
    assert [r[5] for r in rows] == ["ERP_503", "NETWORK_TIMEOUT", "—"]
    for _number, started, ended, took, *_ in rows:
        # The date once per row and the times to the second, on one line each.
        assert len(started) == len("2026-11-26 03:12:09"), started
        assert len(ended) == len("03:12:09") or len(ended) == len(started), ended
        assert took.endswith(" s"), took
    # Nothing on the page is wider than a phone: the table scrolls inside its panel.
    viewport(browser, *PHONE, mobile=True)
    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth"
    )
    shoot(browser, "150-job-three-attempts", at="#attempts")


def test_a_job_not_started_says_no_attempts_yet(browser, live_server, broker):
    job = make_job()
    log_in(browser, live_server, "operator", "olga")
    browser.get(f"{live_server.url}/admin/jobs/job/{job.id}/change/")
    empty = wait(browser, "#attempts-empty")
    assert empty.text == "No attempts yet: the job has not started."
    shoot(browser, "151-job-no-attempts", at="#attempts")
