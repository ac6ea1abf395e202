from __future__ import annotations

import os
import re
from datetime import UTC

import pytest

from audit.models import AuditLog
from jobs.domain.states import Status
from jobs.models import Job
from tests.factories import StaffFactory, job_in_state, make_job

pytestmark = pytest.mark.django_db


def test_admin_without_otp_verification_sends_staff_to_login(client):
    client.force_login(StaffFactory(is_superuser=True))
    response = client.get("/admin/jobs/job/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_job_detail_shows_its_audit_trail_and_cannot_be_edited(otp_admin_client):
    job = make_job()
    response = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/")
    assert response.status_code == 200
    assert b"#1" in response.content and b"created" in response.content
    posted = otp_admin_client.post(f"/admin/jobs/job/{job.id}/change/", {"status": "succeeded"})
    assert posted.status_code == 403
    assert Job.objects.get(id=job.id).status == Status.PENDING


def test_cancel_action_asks_first_then_cancels_through_the_service(otp_admin_client):
    job = make_job()
    chosen = {"action": "cancel_jobs", "_selected_action": [str(job.id)]}
    asked = otp_admin_client.post("/admin/jobs/job/", chosen)
    assert asked.status_code == 200 and b"Yes, cancel 1 job" in asked.content
    assert Job.objects.get(id=job.id).status == Status.PENDING
    response = otp_admin_client.post("/admin/jobs/job/", {**chosen, "confirm": "yes"})
    assert response.status_code == 302
    assert Job.objects.get(id=job.id).status == Status.CANCELLED
    actor_ids = set(AuditLog.objects.filter(job_id=job.id).values_list("actor_id", flat=True))
    assert str(otp_admin_client.user.pk) in actor_ids


def _cancel_selected(client, jobs) -> list[str]:
    chosen = {"action": "cancel_jobs", "_selected_action": [str(j.id) for j in jobs]}
    response = client.post("/admin/jobs/job/", {**chosen, "confirm": "yes"}, follow=True)
    assert response.status_code == 200
    return [str(m) for m in response.context["messages"]]


def test_cancel_action_says_how_many_it_cancelled_and_which_had_already_ended(
    otp_admin_client,
):
    waiting = make_job()
    done = [job_in_state("succeeded") for _ in range(2)]
    assert _cancel_selected(otp_admin_client, [waiting, *done]) == [
        "Cancelled 1 job; 2 had already ended (2 succeeded) and were left as they are."
    ]
    assert Job.objects.get(id=waiting.id).status == Status.CANCELLED
    assert {j.status for j in Job.objects.filter(id__in=[d.id for d in done])} == {"succeeded"}


def test_cancel_action_counts_running_jobs_as_asked_to_stop(otp_admin_client):
    running = job_in_state("running")
    ended = [job_in_state("failed"), job_in_state("cancelled")]
    assert _cancel_selected(otp_admin_client, [running, *ended]) == [
        "Cancel requested for 1 job already running (it stops at the next cancellation "
        "check); 2 had already ended (1 cancelled, 1 failed) and were left as they are."
    ]
    assert Job.objects.get(id=running.id).cancel_requested


def test_cancel_from_the_job_page_of_an_ended_job_says_it_had_ended(otp_admin_client):
    job = job_in_state("succeeded")
    done = otp_admin_client.post(f"/admin/jobs/job/{job.id}/cancel/", follow=True)
    assert [str(m) for m in done.context["messages"]] == [
        "The job had already ended (succeeded) and was left as it is."
    ]
    assert Job.objects.get(id=job.id).status == Status.SUCCEEDED


def test_audit_log_admin_refuses_changes(otp_admin_client):
    job = make_job()
    entry = AuditLog.objects.get(job_id=job.id)
    assert otp_admin_client.get(f"/admin/audit/auditlog/{entry.pk}/change/").status_code == 200
    assert otp_admin_client.get("/admin/audit/auditlog/add/").status_code == 403
    assert (
        otp_admin_client.post(
            f"/admin/audit/auditlog/{entry.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )
    assert AuditLog.objects.filter(pk=entry.pk).exists()


# --- the job pages of the operator portal (issue 9) ----------------------------------------


def _running(job, *, percent=40, step="mesh", message="refining cell 12"):
    from jobs.services import Fence, job_claim, job_progress_write

    claimed = job_claim(job_id=job.id, locked_by="w1")
    job_progress_write(
        job_id=job.id, fence=Fence("w1", claimed.attempts), percent=percent, step=step,
        message=message,
    )  # fmt: skip
    return Fence("w1", claimed.attempts)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status__exact": "running"}, {"run"}),
        ({"type__exact": "report"}, {"rep"}),
        ({"category__exact": "import_export"}, {"rep"}),
        ({"category__exact": "planning", "status__exact": "running"}, {"run"}),
        ({"category__exact": "notification"}, set()),
        ({"queue__exact": "report"}, {"rep"}),
        ({"owner": "bob"}, {"bob"}),
        ({"owner": "nobody"}, set()),
        ({"created_at_from": "2000-01-01", "created_at_to": "2000-01-31"}, {"old"}),
        ({"dead_letter": "open"}, {"dl"}),
        ({"dead_letter": "none", "status__exact": "pending"}, {"bob", "rep", "old"}),
    ],
)
def test_the_job_list_filters(otp_admin_client, query, expected):
    from datetime import datetime

    from tests.factories import UserFactory, worker_lost

    named = {
        "bob": make_job(owner=UserFactory(username="bob")),
        "rep": make_job(job_type="report", params={}),
        "old": make_job(),
        "run": make_job(),
        "dl": worker_lost(),
    }
    Job.objects.filter(id=named["old"].id).update(created_at=datetime(2000, 1, 15, tzinfo=UTC))
    _running(named["run"])
    page = otp_admin_client.get("/admin/jobs/job/", query)
    assert page.status_code == 200
    ids = {str(j.id) for j in page.context["cl"].result_list}
    assert ids == {str(named[n].id) for n in expected}


def test_the_job_list_shows_each_jobs_category_and_offers_every_category(otp_admin_client):
    make_job(job_type="erp", params={"event": "order.created"})
    page = otp_admin_client.get("/admin/jobs/job/")
    text = page.content.decode()
    assert '<td class="field-category">notification</td>' in text
    filters = {f.title: f for f in page.context["cl"].filter_specs}
    choices = [c["display"] for c in filters["category"].choices(page.context["cl"])]
    assert choices == [
        "All", "planning", "import_export", "notification", "maintenance", "audit_enrichment"
    ]  # fmt: skip
    job = make_job(job_type="report", params={}, key="monthly")
    detail = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/").content.decode()
    assert "<dt>Category</dt><dd>import_export</dd>" in detail
    assert "monthly · until " in detail and " · last seen " in detail


def test_the_job_list_searches_by_id_key_and_request_id(otp_admin_client):
    keyed = make_job(key="order-4711")
    other = make_job()
    Job.objects.filter(id=other.id).update(request_id="req-abc")
    for term, job in ((str(keyed.id), keyed), ("order-4711", keyed), ("req-abc", other)):
        page = otp_admin_client.get("/admin/jobs/job/", {"q": term})
        assert [j.id for j in page.context["cl"].result_list] == [job.id], term
    assert otp_admin_client.get("/admin/jobs/job/", {"q": "not a uuid'"}).status_code == 200


def test_the_job_page_is_laid_out_for_a_person(otp_admin_client, settings, tmp_path):
    from jobs.services import artefact_save, job_succeed

    settings.MEDIA_ROOT = tmp_path
    job = make_job(owner=otp_admin_client.user)
    fence = _running(job, percent=60, step="solve", message="iteration 40 of 80")
    artefact_save(job_id=job.id, kind="report", name="out.csv", data="a,b\n1,2\n", fence=fence)
    running = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/")
    text = running.content.decode()
    assert 'class="badge badge-running big"' in text and "60%" in text
    assert "solve" in text and "iteration 40 of 80" in text
    assert "<strong>1</strong> of 6" in text and 'id="cancel-job"' in text
    download = otp_admin_client.get(f"/admin/jobs/job/{job.id}/artefacts/{job.artefacts.get().id}/")
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"a,b\n1,2\n"
    job_succeed(job_id=job.id, fence=fence, result={"cells": 1200})
    done = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/").content.decode()
    assert "&quot;cells&quot;: 1200" in done and 'id="cancel-job"' not in done
    timeline = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/").context["timeline"]
    assert [e["event"] for e in timeline] == ["created", "started", "progress", "succeeded"]
    assert timeline[0]["actor"] == otp_admin_client.user.username


def test_the_job_page_says_which_attempt_its_progress_belongs_to(otp_admin_client):
    from jobs.services import job_claim, job_retry

    job = make_job()
    page = otp_admin_client.get(f"/admin/jobs/job/{job.id}/live/").content.decode()
    assert '<span id="progress-attempt">not started yet (6 attempts allowed)</span>' in page
    fence = _running(job, percent=99, step="9900/10000")
    page = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/").content.decode()
    assert '<strong>99%</strong> · <span id="progress-attempt">attempt 1 of 6</span>' in page
    job_retry(job_id=job.id, fence=fence, delay=0, error_code="TIME_LIMIT", error_message="x")
    job_claim(job_id=job.id, locked_by="w2")
    page = otp_admin_client.get(f"/admin/jobs/job/{job.id}/live/").content.decode()
    assert '<strong>0%</strong> · <span id="progress-attempt">attempt 2 of 6</span>' in page
    assert "9900/10000" not in page


def test_a_failed_job_page_shows_its_error_dead_letter_and_a_replay_link(otp_admin_client):
    from tests.factories import job_failed

    job = job_failed("ERP_NOT_CONFIGURED", reason="fatal")
    text = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/").content.decode()
    assert 'id="last-error"' in text and "ERP_NOT_CONFIGURED" in text
    assert 'id="dead-letters"' in text and "badge-open" in text
    assert f"/admin/jobs/deadletter/replay/run/?job={job.id}" in text
    assert f"/admin/audit/auditlog/verify/?job={job.id}&amp;run=1" in text


def test_cancel_from_the_job_page_asks_first(otp_admin_client):
    job = make_job()
    _running(job)
    asked = otp_admin_client.get(f"/admin/jobs/job/{job.id}/cancel/")
    assert asked.status_code == 200 and b"Cancel <strong>1</strong> job?" in asked.content
    assert Job.objects.get(id=job.id).cancel_requested is False
    done = otp_admin_client.post(f"/admin/jobs/job/{job.id}/cancel/")
    assert done.status_code == 302
    job.refresh_from_db()
    assert job.cancel_requested and job.status == Status.RUNNING  # it stops at its next check
    events = AuditLog.objects.filter(job_id=job.id).values_list("event_type", flat=True)
    assert "cancel_requested" in events


# --- ids an operator can tell apart and search for (issue 25) -------------------------------

JOB_CELL = re.compile(
    r'<a href="/admin/jobs/job/([0-9a-f-]{36})/change/"[^>]*>\s*<code[^>]*>([^<]+)</code>'
)


def _shown_ids(page) -> dict[str, str]:
    """{job id: what the list shows of it} from the rendered job list."""
    return dict(JOB_CELL.findall(page.content.decode()))


def _found(client, term: str) -> list[str]:
    page = client.get("/admin/jobs/job/", {"q": term})
    assert page.status_code == 200, term
    return sorted(str(j.id) for j in page.context["cl"].result_list)


def test_the_job_list_tells_apart_jobs_created_in_the_same_minute(otp_admin_client):
    jobs = [make_job() for _ in range(3)]  # UUIDv7: their ids begin with the same time
    shown = _shown_ids(otp_admin_client.get("/admin/jobs/job/"))
    assert set(shown) == {str(j.id) for j in jobs}
    assert len(set(shown.values())) == 3
    for job_id, text in shown.items():
        assert text.strip("…") in job_id and len(text.strip("…")) >= 12


def test_the_job_list_finds_a_job_by_what_it_shows_or_a_prefix_or_suffix_of_its_id(
    otp_admin_client,
):
    jobs = [make_job() for _ in range(3)]
    shown = _shown_ids(otp_admin_client.get("/admin/jobs/job/"))
    for job in jobs:
        full = str(job.id)
        for term in (
            shown[full],  # exactly what the list shows, ellipsis included
            full[-6:],  # a suffix
            full[-17:],  # a suffix across a dash
            full[-17:].replace("-", "").upper(),  # without the dash, in capitals
            full[:28],  # a prefix long enough to reach the random bits
            full.replace("-", "")[:26],  # the same without dashes
            f"  {full}  ",  # the whole id, as before
        ):
            assert _found(otp_admin_client, term) == [full], term
    everyone = sorted(str(j.id) for j in jobs)
    common = os.path.commonprefix(everyone)  # the time they were made, to the minute or so
    assert _found(otp_admin_client, common[:8]) == everyone


@pytest.mark.parametrize(
    "term",
    # Terms longer than any id or key, yet within the URI limit (a 10,000-character query
    # string is refused earlier, 414: tests/core/test_request_limits.py).
    ["%", "%%%%", "_", "0_a%", "----", "…", "a" * 3_000, "0" * 3_000, "abc", "' OR 1=1 --"],
    ids=lambda term: repr(term[:12]) + (f"x{len(term)}" if len(term) > 12 else ""),
)
def test_the_job_list_search_answers_nonsense_with_no_rows_not_a_500(otp_admin_client, term):
    make_job(key="%")
    page = otp_admin_client.get("/admin/jobs/job/", {"q": term})
    assert page.status_code == 200
    assert [j.idempotency_key for j in page.context["cl"].result_list] == (
        ["%"] if term == "%" else []  # an idempotency key is matched exactly, never as a pattern
    )
    if len(term) > 255:
        assert "longer (3000 characters) than any id" in page.content.decode()


def test_a_search_by_the_end_of_an_id_that_runs_out_of_time_says_so(otp_admin_client, monkeypatch):
    job = make_job()
    monkeypatch.setattr("jobs.selectors.read_within", lambda seconds, read: None)  # a huge table
    page = otp_admin_client.get("/admin/jobs/job/", {"q": f"…{str(job.id)[-12:]}"})
    assert page.status_code == 200 and not page.context["cl"].result_list
    assert f"ids ending in {str(job.id)[-12:]} stopped after 3 s" in page.content.decode()
    by_start = otp_admin_client.get("/admin/jobs/job/", {"q": str(job.id)[:28]})  # no scan
    assert [j.id for j in by_start.context["cl"].result_list] == [job.id]


# --- justifications under the event that resolved the dead letter (issue 25) -----------------


def _broker_copy_seen(job) -> None:
    """The dead-letter watcher records the broker copy of the job's open dead letter:
    a `dead_lettered` entry by dlq-watcher naming the row."""
    from dlq.broker import DecodedMessage
    from dlq.services.reconcile import Outcome, dead_letter_reconcile

    message = DecodedMessage(
        message_id=f"task:{job.id}:{job.attempts}",
        job_id=str(job.id),
        attempt=job.attempts,
        queue=job.queue,
        reason="rejected",
    )
    assert dead_letter_reconcile(message=message) == Outcome.BROKER_COPY


def _timeline_justifications(client, job) -> list[tuple[str, str | None]]:
    page = client.get(f"/admin/jobs/job/{job.id}/change/")
    timeline = page.context["timeline"]
    rendered = page.content.decode().split('<ol class="timeline">')[1].split("</ol>")[0]
    for entry in timeline:  # what the page says is what the list of entries says
        if entry["justification"]:
            assert rendered.count(f"“{entry['justification']}”") == 1
    return [(e["event"], e["justification"]) for e in timeline if e["event"] != "progress"]


def test_a_justification_shows_only_under_the_event_that_resolved_the_dead_letter(
    otp_admin_client, broker
):
    from dlq.services.replay import dead_letters_discard, dead_letters_replay
    from jobs.services import WORKER, job_claim, job_fail_with_dead_letter
    from tests.factories import OperatorFactory, fence_of, job_failed

    operator = OperatorFactory()
    job = job_failed("UPSTREAM_DOWN")
    _broker_copy_seen(job)
    dead_letters_replay(actor_user=operator, justification="INC-1: upstream back", job_ids=[job.id])
    claimed = job_claim(job_id=job.id, locked_by="w2")  # the replay fails again
    job_fail_with_dead_letter(
        job_id=job.id, reason="fatal", actor=WORKER, error_code="BAD", fence=fence_of(claimed)
    )
    _broker_copy_seen(Job.objects.get(id=job.id))
    dead_letters_discard(actor_user=operator, justification="INC-2: bad data", job_ids=[job.id])

    events = _timeline_justifications(otp_admin_client, job)
    assert [e for e in events if e[0] not in ("created", "queued", "started")] == [
        ("failed", None),
        ("dead_lettered", None),
        ("dlq_replayed", "INC-1: upstream back"),
        ("failed", None),
        ("dead_lettered", None),
        ("dlq_discarded", "INC-2: bad data"),
    ]


def test_a_justification_changed_after_the_fact_is_not_shown_as_the_audited_one(
    otp_admin_client, broker
):
    from dlq.services.replay import dead_letters_discard
    from jobs.models import DeadLetter
    from jobs.selectors import JUSTIFICATION_MISMATCH
    from tests.factories import OperatorFactory, job_failed

    job = job_failed("UPSTREAM_DOWN")
    dead_letters_discard(actor_user=OperatorFactory(), justification="duplicate", job_ids=[job.id])
    DeadLetter.objects.filter(job=job).update(justification="approved by the CEO")
    events = dict(_timeline_justifications(otp_admin_client, job))
    assert events["dlq_discarded"] == JUSTIFICATION_MISMATCH


def test_a_copy_recorded_under_a_live_lock_says_so_without_a_justification(otp_admin_client):
    from dlq.broker import DecodedMessage
    from dlq.services.reconcile import Outcome, dead_letter_reconcile
    from tests.factories import job_in_state

    job = job_in_state("running")
    message = DecodedMessage(
        message_id="task:live", job_id=str(job.id), attempt=job.attempts, queue=job.queue
    )
    assert dead_letter_reconcile(message=message) == Outcome.LIVE_LOCK
    page = otp_admin_client.get(f"/admin/jobs/job/{job.id}/change/")
    [entry] = [e for e in page.context["timeline"] if e["event"] == "dead_lettered"]
    assert entry["justification"] is None and "live lock" in entry["summary"]
