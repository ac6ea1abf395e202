"""Issue 29's operator controls in headless Chromium, as an operator would use them at
3 a.m. (its "done when"): pause and resume a queue from the dashboard, what a viewer
sees of it, retry and re-run, fix-forward with a second operator's approval, search by a
param value and cancel all matching. Screenshots at laptop and phone width under
var/screenshots/ (names 1xx-)."""

from __future__ import annotations

import pytest
from django.test import override_settings
from selenium.webdriver.common.by import By

from audit.models import AuditLog
from audit.services import Actor
from dlq.bulk import bulk_operations_run_once
from dlq.models import BulkOperation
from jobs.models import DeadLetter, Job, ParamsEdit
from jobs.services.queues import queue_pause
from tests.browser.conftest import shoot
from tests.browser.test_portal import click_and_wait, log_in, text_of, wait
from tests.factories import (
    UserFactory,
    client_for,
    client_with_grant,
    job_failed,
    job_in_state,
    make_job,
)
from tests.polling import wait_for
from tests.processes import celery_worker, dispatcher_process, job_events, starting

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def switch_user(browser, live_server, role: str, username: str) -> None:
    """The next operator at the same browser: a fresh session, their own login."""
    browser.delete_all_cookies()
    log_in(browser, live_server, role, username)


@pytest.mark.heavy
def test_pause_sim_jobs_wait_then_resume_and_they_run(browser, live_server, broker):
    owner = UserFactory()
    with starting(
        dispatcher_process(interval=0.2, name="browser-pause-dispatcher"),
        celery_worker(queues=["sim"], concurrency=2, name="browser-pause"),
    ) as ready:
        # The operator logs in and pauses the queue while the processes start.
        log_in(browser, live_server, "operator", "olga")
        wait(browser, 'tr[data-queue="sim"]')
        click_and_wait(browser, 'tr[data-queue="sim"] .queue-pause')
        shoot(browser, "100-pause-form")
        browser.find_element(By.ID, "id_reason").send_keys("INC-29: the simulator is sick")
        click_and_wait(browser, "#confirm-control")
        wait(browser, 'tr[data-queue="sim"] .queue-paused')
        assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-queue="sim"] .queue-resume')

        # Submitted meanwhile, through the services and through the API: accepted, held.
        jobs = [make_job(owner=owner, params={"steps": 1, "step_seconds": 0})]
        created = client_for(owner).post(
            "/api/v1/jobs", {"type": "sim", "params": {"steps": 1}}, format="json"
        )
        assert created.status_code == 201, created.content
        jobs.append(Job.objects.get(id=created.json()["id"]))
        wait_for(lambda: AuditLog.objects.filter(event_type="queue_paused").exists(), timeout=5)
        dispatcher, worker = ready()
        # Publish runs of the dispatcher later (the second begun after both were made)
        # they still wait in PostgreSQL, never published.
        runs = dispatcher.metric("dispatcher_step_runs_total", step="publish")
        dispatcher.wait_for_runs("publish", runs + 2)
        assert {Job.objects.get(id=j.id).status for j in jobs} == {"pending"}
        assert all(job_events(j.id) == ["created"] for j in jobs)
        browser.refresh()
        wait(browser, 'tr[data-queue="sim"] .queue-paused')
        shoot(browser, "101-dashboard-sim-paused")

        click_and_wait(browser, 'tr[data-queue="sim"] .queue-resume')
        assert "paused" in browser.find_element(By.ID, "queue-state").text
        browser.find_element(By.ID, "id_reason").send_keys("INC-29: the simulator is back")
        click_and_wait(browser, "#confirm-control")
        wait(browser, 'tr[data-queue="sim"] .queue-pause')
        assert not browser.find_elements(By.CSS_SELECTOR, 'tr[data-queue="sim"] .queue-paused')
        wait_for(
            lambda: {Job.objects.get(id=j.id).status for j in jobs} == {"succeeded"},
            timeout=30,
            what="the held jobs run after resume",
        )
        # What follows is the portal's: the processes shut down meanwhile.
        worker.terminate()
        dispatcher.terminate()
        browser.get(f"{live_server.url}/admin/audit/auditlog/?chain=ops")
        wait(browser, "#result_list")
        listing = browser.find_element(By.ID, "result_list").text
        assert "queue_paused" in listing and "queue_resumed" in listing
        shoot(browser, "102-audit-log-ops-chain")


def test_a_viewer_sees_the_pause_but_no_button_and_the_api_refuses(browser, live_server, broker):
    queue_pause(queue="sim", reason="INC-30", actor=Actor.system("test"))
    log_in(browser, live_server, "viewer", "vera")
    badge = wait(browser, 'tr[data-queue="sim"] .queue-paused')
    assert badge.text == "paused"
    assert not browser.find_elements(By.CSS_SELECTOR, ".queue-pause, .queue-resume")
    shoot(browser, "103-viewer-dashboard-paused")
    from django.contrib.auth import get_user_model

    vera = get_user_model().objects.get(username="vera")
    refused = client_with_grant(vera).post(
        "/api/v1/admin/queues/sim/resume", {"reason": "let me"}, format="json"
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "ERR-DLQ-403"


def test_retry_by_the_owner_and_rerun_from_the_job_page(browser, live_server, broker):
    failed = job_failed("TRANSIENT_EXTERNAL")
    retried = client_for(failed.owner).post(f"/api/v1/jobs/{failed.id}/retry", {}, format="json")
    assert retried.status_code == 200, retried.content
    assert Job.objects.get(id=failed.id).status in ("pending", "queued")

    done = job_in_state("succeeded", params={"steps": 2})
    log_in(browser, live_server, "operator", "olga")
    browser.get(f"{live_server.url}/admin/jobs/job/{done.id}/change/")
    click_and_wait(browser, "#rerun-job")
    shoot(browser, "110-rerun-confirm")
    browser.find_element(By.ID, "id_justification").send_keys("INC-31: run it again")
    click_and_wait(browser, "#confirm-rerun")
    rerun = Job.objects.get(rerun_of=done)
    assert str(rerun.id) in browser.find_element(By.ID, "job-id").text
    assert str(done.id) in browser.find_element(By.ID, "rerun-of").text
    shoot(browser, "111-rerun-new-job")
    click_and_wait(browser, "#rerun-of a")
    assert str(rerun.id) in browser.find_element(By.ID, "reruns").text
    shoot(browser, "112-rerun-original")


@override_settings(JOBOPS_REPLAY_APPROVAL=True)
def test_fix_forward_requested_by_one_operator_approved_by_another(browser, live_server, broker):
    job = job_in_state("failed", params={"steps": 2}, reason="fatal", error_code="BAD_STEPS")
    row = DeadLetter.objects.get(job=job)
    log_in(browser, live_server, "operator", "olga")
    browser.get(f"{live_server.url}/admin/jobs/deadletter/{row.pk}/change/")
    click_and_wait(browser, "#fix-forward")
    params = browser.find_element(By.ID, "id_params")
    params.clear()
    params.send_keys('{"steps": 3}')
    click_and_wait(browser, "#preview-fix-forward")
    diff = browser.find_element(By.ID, "fix-forward-diff").text
    assert "/steps" in diff and "2" in diff and "3" in diff
    browser.find_element(By.ID, "id_reason").send_keys("INC-32: three steps were meant")
    shoot(browser, "120-fix-forward-diff")
    click_and_wait(browser, "#confirm-fix-forward")
    edit = ParamsEdit.objects.get(dead_letter=row)
    assert edit.state == "requested" and Job.objects.get(id=job.id).status == "failed"
    assert not browser.find_elements(By.ID, f"approve-edit-{edit.pk}")  # not their own
    shoot(browser, "121-fix-forward-requested")

    switch_user(browser, live_server, "operator", "otto")
    browser.get(f"{live_server.url}/admin/jobs/deadletter/{row.pk}/change/")
    assert "waits for approval" in wait(browser, "#edit-waiting").text  # said at the top
    wait(browser, f"#approve-edit-{edit.pk}")
    shoot(browser, "122-fix-forward-to-approve")
    click_and_wait(browser, f"#approve-edit-{edit.pk}")
    after = Job.objects.get(id=job.id)
    assert after.status in ("pending", "queued") and after.params["steps"] == 3
    assert ParamsEdit.objects.get(pk=edit.pk).state == "applied"
    shoot(browser, "123-fix-forward-approved")


def test_search_by_param_then_cancel_all_matching(browser, live_server, broker):
    matching = [make_job(params={"steps": 6, "step_seconds": 0}) for _ in range(3)]
    other = make_job(params={"steps": 7, "step_seconds": 0})
    log_in(browser, live_server, "operator", "olga")
    browser.get(f"{live_server.url}/admin/jobs/job/")
    browser.find_element(By.ID, "searchbar").send_keys("param:steps=6")
    click_and_wait(browser, "#changelist-search input[type=submit]")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 3
    shoot(browser, "130-job-list-param-search")
    with override_settings(JOBOPS_DLQ_BACKGROUND_THRESHOLD=2):
        click_and_wait(browser, "#cancel-matching")
        assert "3 unfinished jobs match" in browser.find_element(By.ID, "dry-run-count").text
        shoot(browser, "131-cancel-matching-dry-run")
        browser.find_element(By.ID, "id_justification").send_keys("INC-33: a bad batch")
        click_and_wait(browser, "#confirm-cancel-matching")
    # More than the threshold: a background operation, worked by the dispatcher's step.
    operation = BulkOperation.objects.get(action="cancel")
    panel = browser.find_element(By.ID, "operation-panel").text
    assert "cancel of 3 jobs" in panel and "dead letter" not in panel
    shoot(browser, "132-background-cancel")
    for _ in range(5):  # a chunk per dispatcher loop, then done
        bulk_operations_run_once()
    browser.refresh()
    wait_for(lambda: "done" in (text_of(browser, ".job-head .badge") or ""), timeout=10)
    assert "3 cancelled" in browser.find_element(By.ID, "operation-progress").text
    shoot(browser, "133-background-cancel-done")
    assert BulkOperation.objects.get(pk=operation.pk).state == "done"
    assert {Job.objects.get(id=j.id).status for j in matching} == {"cancelled"}
    assert Job.objects.get(id=other.id).status != "cancelled"
