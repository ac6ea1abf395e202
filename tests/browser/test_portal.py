"""The operator portal in headless Chromium, as an operator would use it at 3 a.m.

Each test signs in as an operator who passed password + TOTP (`log_in`), does one thing
an operator does, and saves what it saw under var/screenshots/ (laptop 1366x768 and phone width).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from dlq.models import BulkOperation
from jobs.models import DeadLetter, Job
from tests.browser.conftest import next_page, shoot
from tests.factories import job_failed, make_job, otp_login, role_user
from tests.polling import wait_for
from tests.processes import celery_worker, dispatcher_process, together
from tests.queues import depth, worker_dead_letter

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def log_in(browser, live_server, role: str, username: str, *, user: Any = None) -> None:
    """An operator signed in with password and TOTP code, as the login form leaves them:
    a real session in the database (the user, the auth backend, the OTP device that
    verified the code) whose cookie the browser then carries. Made server-side: the
    form itself is tests/browser/test_admin_login.py's subject, and going through it
    again costs every other test a page load, a POST and a redirect. `user`: one of the
    test's own (a superuser), instead of a `role` user."""
    user = user or role_user(role, username=username)
    session = otp_login(Client(), user).session
    # The attributes the login's answer sets the cookie with (SessionMiddleware).
    cookie = {
        "url": live_server.url,
        "name": settings.SESSION_COOKIE_NAME,
        "value": session.session_key,
        "path": settings.SESSION_COOKIE_PATH,
        "httpOnly": settings.SESSION_COOKIE_HTTPONLY,
        "secure": settings.SESSION_COOKIE_SECURE,
    }
    if settings.SESSION_COOKIE_SAMESITE:
        cookie["sameSite"] = settings.SESSION_COOKIE_SAMESITE
    if not settings.SESSION_EXPIRE_AT_BROWSER_CLOSE:
        cookie["expires"] = time.time() + settings.SESSION_COOKIE_AGE
    browser.execute_cdp_cmd("Network.setCookie", cookie)
    browser.get(f"{live_server.url}/admin/")
    assert "Dashboard" in browser.title, browser.page_source[:500]


def wait(browser, css: str, timeout: float = 15):
    return WebDriverWait(browser, timeout).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def text_of(browser, css: str) -> str:
    """The element's text now, read in one step (a refreshing panel may replace it)."""
    return browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent.trim() : null",
        css,
    )


def click_and_wait(browser, css: str):
    """Click and wait for the next page. Found and clicked in one step: a refreshing
    panel may replace the element between a find and a click."""
    wait(browser, css)
    next_page(
        browser, lambda: browser.execute_script("document.querySelector(arguments[0]).click()", css)
    )


@pytest.fixture
def operator(browser, live_server, broker):
    log_in(browser, live_server, "operator", "olga")
    return browser


def test_the_dashboard_reads_at_a_glance_and_refreshes_itself(operator, live_server):
    for _ in range(3):
        job_failed("TRANSIENT_EXTERNAL", job_type="erp")
    job_failed("ERP_NOT_CONFIGURED", reason="fatal", job_type="erp")
    make_job()
    with override_settings(JOBOPS_PORTAL_REFRESH_SECONDS=1):
        operator.get(f"{live_server.url}/admin/")
        erp = wait(operator, 'tr[data-queue="erp"]')
        assert erp.find_elements(By.CSS_SELECTOR, "td")[1].text == "4"  # open dead letters
        assert "3 \u00d7" in operator.find_element(By.ID, "failures").text  # "3 times"
        shoot(operator, "10-dashboard")
        job_failed("TRANSIENT_EXTERNAL", job_type="erp")  # a new failure, no reload
        # Read in one step: the refresh replaces the row between a find and a read.
        wait_for(
            lambda: text_of(operator, 'tr[data-queue="erp"] td:nth-child(2)') == "5",
            timeout=10,
        )


def test_filter_the_job_list_and_open_a_job(operator, live_server):
    target = make_job(job_type="report", params={"limit": 10})
    make_job()
    operator.get(f"{live_server.url}/admin/jobs/job/")
    wait(operator, "#result_list")
    operator.find_element(By.LINK_TEXT, "report").click()  # the type filter
    wait(operator, "#result_list")
    rows = operator.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1
    shoot(operator, "20-job-list-filtered")
    click_and_wait(operator, "#result_list tbody tr a")
    assert str(target.id) in operator.find_element(By.ID, "job-id").text
    # Published on commit: `queued` once the broker confirmed it (pending before).
    assert operator.find_element(By.CSS_SELECTOR, ".job-head .badge").text in ("pending", "queued")
    shoot(operator, "21-job-detail")


def test_cancel_a_running_job(operator, live_server):
    with (
        override_settings(JOBOPS_PORTAL_REFRESH_SECONDS=1),
        together(
            dispatcher_process(interval=0.2, name="browser-cancel-dispatcher"),
            celery_worker(queues=["sim"], name="browser-cancel"),
        ) as (dispatcher, worker),
    ):
        # 30 s of steps: running long past the cancel, under way once it has made 1 %.
        job = make_job(params={"steps": 300, "step_seconds": 0.1})
        wait_for(lambda: Job.objects.get(id=job.id).progress_percent >= 1, timeout=30)
        operator.get(f"{live_server.url}/admin/jobs/job/{job.id}/change/")
        assert operator.find_element(By.CSS_SELECTOR, ".job-head .badge").text == "running"
        shoot(operator, "30-running-job")
        click_and_wait(operator, "#cancel-job")
        assert "Cancel 1 job?" in operator.find_element(By.CLASS_NAME, "dryrun").text
        shoot(operator, "31-cancel-confirmation")
        click_and_wait(operator, "#confirm-cancel")
        assert "Cancellation requested" in operator.find_element(By.CLASS_NAME, "messagelist").text
        final = wait_for(
            lambda: (j := Job.objects.get(id=job.id)).status in ("cancelled", "succeeded") and j,
            timeout=20,
        )
        assert final.status == "cancelled", worker.log_text()[-2000:]
        # What follows is the portal's: the processes shut down meanwhile.
        worker.terminate()
        dispatcher.terminate()
        # Back on the job's page, which follows the job and reloads once it has ended.
        wait_for(lambda: text_of(operator, ".job-head .badge") == "cancelled", timeout=15)
        wait(operator, "#timeline")
        assert "cancelled" in operator.find_element(By.ID, "timeline").text
        shoot(operator, "32-cancelled-job")


def test_peek_a_dlq_without_consuming_it(operator, live_server, amqp):
    job = worker_dead_letter(amqp, code="UPSTREAM_DOWN")
    operator.get(f"{live_server.url}/admin/jobs/deadletter/queues/")
    row = wait(operator, 'tr[data-queue="sim_dlq"]')
    assert row.find_elements(By.CSS_SELECTOR, "td")[1].text == "1"  # broker depth
    shoot(operator, "40-dlq-overview")
    row.find_element(By.LINK_TEXT, "Peek").click()
    message = wait(operator, ".message")
    assert str(job.id) in message.text and "rejected" in message.text
    shoot(operator, "41-dlq-peek")
    operator.refresh()
    wait(operator, ".message")
    # Two peeks, nothing consumed. A quorum DLQ takes a peeked message back through its
    # log after the peek's answer: the depth is 1 again shortly, not at that instant.
    wait_for(lambda: depth(amqp, "sim_dlq") == 1, timeout=10, what="the peeked message back")


def test_dry_run_then_replay_with_a_justification(operator, live_server, amqp):
    jobs = [worker_dead_letter(amqp, code="UPSTREAM_DOWN") for _ in range(2)]
    job_failed("BAD_INPUT", reason="nonretryable")
    operator.get(f"{live_server.url}/admin/jobs/deadletter/?state=open")
    wait(operator, "#groups")
    shoot(operator, "50-dead-letters-by-cause")
    operator.find_element(By.PARTIAL_LINK_TEXT, "UPSTREAM_DOWN").click()  # filter to the cause
    wait(operator, "#result_list")
    click_and_wait(operator, "#replay-matching")
    assert "2 open dead letters" in operator.find_element(By.ID, "dry-run-count").text
    assert len(operator.find_elements(By.CSS_SELECTOR, "#sample tbody tr")) == 2
    shoot(operator, "51-replay-dry-run")
    operator.find_element(By.ID, "confirm-action").click()  # no justification yet
    assert DeadLetter.objects.filter(state="open").count() == 3  # the browser refused
    operator.find_element(By.ID, "id_justification").send_keys("INC-501: upstream is back")
    click_and_wait(operator, "#confirm-action")
    assert "2 dead letters replayed" in operator.find_element(By.ID, "action-result").text
    shoot(operator, "52-replay-done")
    assert {Job.objects.get(id=j.id).status for j in jobs} == {"pending"}
    assert DeadLetter.objects.get(error_code="BAD_INPUT").state == "open"
    assert depth(amqp, "sim_dlq") == 0


def test_a_large_replay_runs_in_the_background_and_can_be_stopped(operator, live_server):
    for _ in range(4):
        job_failed("TRANSIENT_EXTERNAL")
    with override_settings(JOBOPS_DLQ_BACKGROUND_THRESHOLD=2):
        operator.get(f"{live_server.url}/admin/jobs/deadletter/replay/run/?queue=sim_dlq")
        operator.find_element(By.ID, "id_justification").send_keys("INC-502: bulk replay")
        click_and_wait(operator, "#confirm-action")
    assert "0 of 4 handled" in operator.find_element(By.ID, "operation-progress").text
    shoot(operator, "60-background-replay")
    click_and_wait(operator, "#stop-operation")
    assert BulkOperation.objects.get().state == "stopped"
    assert operator.find_element(By.CSS_SELECTOR, ".job-head .badge").text == "stopped"
    shoot(operator, "61-background-replay-stopped")


def test_verify_a_job_chain(operator, live_server):
    job = job_failed("BAD_INPUT", reason="nonretryable")
    operator.get(f"{live_server.url}/admin/jobs/job/{job.id}/change/")
    wait(operator, "#timeline")
    shoot(operator, "70-failed-job-with-timeline")
    click_and_wait(operator, "#verify-chain")
    assert operator.find_element(By.ID, "verify-result").text.startswith("Intact.")
    shoot(operator, "71-chain-verified")


def test_a_viewer_is_refused_a_replay(browser, live_server, broker):
    job_failed("TRANSIENT_EXTERNAL")
    log_in(browser, live_server, "viewer", "vera")
    browser.get(f"{live_server.url}/admin/jobs/deadletter/?state=open")
    wait(browser, "#groups")
    assert not browser.find_elements(By.ID, "replay-matching")
    assert "Replay" not in browser.find_element(By.ID, "groups").text
    shoot(browser, "80-viewer-dead-letters")
    browser.get(f"{live_server.url}/admin/jobs/deadletter/replay/run/?queue=sim_dlq")
    assert "operator" in browser.find_element(By.ID, "forbidden").text
    shoot(browser, "81-viewer-refused-replay")
    assert DeadLetter.objects.get().state == "open"


def test_the_api_docs_work_offline(offline_browser, live_server):
    offline_browser.get(f"{live_server.url}/api/v1/docs/")
    wait(offline_browser, ".swagger-ui .opblock", timeout=20)
    titles = offline_browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    assert any("/api/v1/admin/dlq/{queue}/replay" in t.text for t in titles)
    shoot(offline_browser, "90-api-docs-offline")
    offline_browser.get(f"{live_server.url}/api/v1/redoc/")
    assert "jobops API" in wait(offline_browser, "h1", timeout=20).text
    shoot(offline_browser, "91-api-redoc-offline")


def test_the_job_list_tells_jobs_apart_and_copies_a_whole_id(operator, live_server):
    jobs = [make_job() for _ in range(4)]  # one minute: the same first 8 characters
    operator.get(f"{live_server.url}/admin/jobs/job/")
    wait(operator, "#result_list")
    shown = [c.text for c in operator.find_elements(By.CSS_SELECTOR, "#result_list code.short-id")]
    assert sorted(shown) == sorted(f"…{str(j.id)[-12:]}" for j in jobs)
    shoot(operator, "22-job-list-short-ids")
    operator.execute_cdp_cmd(
        "Browser.grantPermissions",
        {
            "origin": live_server.url,
            "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"],
        },
    )
    first = operator.find_element(By.CSS_SELECTOR, "#result_list button.copy-id")
    first.click()
    wait_for(lambda: first.text == "copied", timeout=5)
    copied = operator.execute_async_script(
        "navigator.clipboard.readText().then(arguments[0], () => arguments[0](null))"
    )
    assert copied == first.get_attribute("data-copy") and copied in {str(j.id) for j in jobs}
    search = operator.find_element(By.ID, "searchbar")
    search.send_keys(shown[1])  # what the list shows finds that job
    click_and_wait(operator, "#changelist-search input[type=submit]")
    assert [c.text for c in operator.find_elements(By.CSS_SELECTOR, "#result_list code")] == [
        shown[1]
    ]


def test_a_limited_dry_run_lists_what_it_takes_and_what_it_cannot_replay(operator, live_server):
    from tests.factories import dead_letter_without_job, worker_lost

    for _ in range(3):
        dead_letter_without_job()
    rows = [DeadLetter.objects.get(job=worker_lost()) for _ in range(4)]
    operator.get(f"{live_server.url}/admin/jobs/deadletter/?state=open")
    undecodable = wait(operator, "#groups").find_element(
        By.XPATH, "//tr[contains(., 'UNDECODABLE')]"
    )
    assert "Replay" not in undecodable.text and "Discard" in undecodable.text
    shoot(operator, "54-dead-letters-without-a-job")
    operator.get(f"{live_server.url}/admin/jobs/deadletter/replay/run/?queue=sim_dlq&limit=2")
    wait(operator, "#sample")
    assert "2 open dead letters" in operator.find_element(By.ID, "dry-run-count").text
    listed = operator.find_elements(By.CSS_SELECTOR, "#sample tbody tr td:first-child")
    assert [int(td.text) for td in listed] == [rows[0].id, rows[1].id]
    assert "3 dead letters name no job" in operator.find_element(By.ID, "without-job").text
    shoot(operator, "53-replay-dry-run-limited")
