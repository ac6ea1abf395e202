"""The dead-letter pages of the portal (docs/operations/portal.md), through Django's test client."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditLog
from dlq.bulk import bulk_operations_run_once
from dlq.models import BulkOperation
from jobs.models import DeadLetter, Job
from tests.factories import dead_letter_without_job, job_failed, otp_login, role_user, worker_lost
from tests.polling import wait_for
from tests.queues import depth, worker_dead_letter

pytestmark = pytest.mark.django_db
LIST = "/admin/jobs/deadletter/"
RUN = "/admin/jobs/deadletter/{action}/run/"


@pytest.fixture
def operator() -> Client:
    return otp_login(Client(), role_user("operator"))


def test_the_queues_page_shows_each_dlq_with_depth_and_open_rows(operator, amqp):
    worker_dead_letter(amqp, code="BOOM")
    worker_lost()
    page = operator.get("/admin/jobs/deadletter/queues/")
    sim = next(q for q in page.context["queues"] if q["queue"] == "sim_dlq")
    assert (sim["depth"], sim["open"]) == (1, 2)
    assert b'data-refresh-url="/admin/jobs/deadletter/queues/panel/"' in page.content


def test_the_list_groups_dead_letters_by_cause(operator, broker):
    for _ in range(3):
        job_failed("TRANSIENT_EXTERNAL", job_type="erp")
    job_failed("FATAL", reason="fatal")
    page = operator.get(LIST, {"state": "open"})
    groups = [(g["count"], g["error_code"], g["queue"]) for g in page.context["groups"]]
    assert groups == [(3, "TRANSIENT_EXTERNAL", "erp_dlq"), (1, "FATAL", "sim_dlq")]
    assert "3 \u00d7".encode() in page.content  # "3 times"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"queue": "erp_dlq"}, {"E1"}),
        ({"reason": "fatal"}, {"F1", "D1", "OLD"}),
        ({"error_code": "E1"}, {"E1"}),
        ({"retryable": "1"}, {"E1", "W1"}),
        ({"state": "discarded"}, {"D1"}),
        ({"age": "older7d"}, {"OLD"}),
        ({"age": "24h", "state": "open"}, {"E1", "F1", "W1"}),
    ],
)
def test_the_list_filters_by_queue_reason_state_code_age_and_cause(
    operator, broker, query, expected
):
    job_failed("E1", job_type="erp")
    job_failed("F1", reason="fatal")
    job_failed("W1", reason="worker_lost")
    DeadLetter.objects.filter(job=job_failed("D1", reason="fatal")).update(
        state="discarded", resolved_at=timezone.now(), justification="x"
    )
    DeadLetter.objects.filter(job=job_failed("OLD", reason="fatal")).update(
        created_at=timezone.now() - timedelta(days=8)
    )
    page = operator.get(LIST, query)
    assert {r.error_code for r in page.context["cl"].result_list} == expected


def test_peek_shows_the_messages_and_consumes_nothing(operator, amqp):
    job = worker_dead_letter(amqp, code="BOOM")
    before = depth(amqp, "sim_dlq")
    page = operator.get("/admin/jobs/deadletter/peek/sim_dlq/")
    assert page.status_code == 200
    [item] = page.context["messages_found"]
    assert item["m"].job_id == str(job.id) and item["death"]["reason"] == "rejected"
    text = page.content.decode()
    assert str(job.id) in text and "rejected" in text and "&quot;job_id&quot;" in text
    assert before == 1
    # Nothing consumed. A quorum DLQ takes a peeked message back through its log after
    # the peek's answer: the depth is 1 again shortly, not at that instant.
    wait_for(lambda: depth(amqp, "sim_dlq") == 1, timeout=10, what="the peeked message back")
    assert operator.get("/admin/jobs/deadletter/peek/sim/").status_code == 404


def test_replay_shows_a_dry_run_then_needs_a_justification(operator, amqp):
    job = worker_dead_letter(amqp, code="UPSTREAM_DOWN")
    url = RUN.format(action="replay")
    query = {"queue": "sim_dlq", "error_code": "UPSTREAM_DOWN"}
    dry = operator.get(url, query)
    assert dry.context["dry_run"].matched == 1
    assert b'id="dry-run-count"' in dry.content and str(job.id)[:8].encode() in dry.content
    form = dict(dry.context["hidden"])
    refused = operator.post(url, {**form, "justification": "  "})
    assert b'id="action-error"' in refused.content
    assert Job.objects.get(id=job.id).status == "failed"

    done = operator.post(url, {**form, "justification": "INC-12: upstream is back"})
    assert done.status_code == 200 and b'id="action-result"' in done.content
    assert Job.objects.get(id=job.id).status == "pending"
    row = DeadLetter.objects.get(job=job)
    assert (row.state, row.justification) == ("replayed", "INC-12: upstream is back")
    assert AuditLog.objects.filter(job_id=job.id, event_type="dlq_replayed").exists()
    assert depth(amqp, "sim_dlq") == 0


@pytest.mark.parametrize("action", ["replay", "discard"])
def test_a_limited_dry_run_lists_exactly_the_rows_the_action_then_takes(operator, broker, action):
    rows = [DeadLetter.objects.get(job=worker_lost()).id for _ in range(4)]
    url = RUN.format(action=action)
    dry = operator.get(url, {"queue": "sim_dlq", "limit": "2"})
    sample = [s["dead_letter_id"] for s in dry.context["dry_run"].sample]
    assert (dry.context["dry_run"].matched, sample) == (2, rows[:2])  # oldest first
    listed = re.findall(
        r'<tr><td><a href="/admin/jobs/deadletter/(\d+)/change/">', dry.content.decode()
    )
    assert [int(i) for i in listed] == sample
    done = operator.post(url, {**dict(dry.context["hidden"]), "justification": "INC-3"})
    assert done.context["result"].resolved == sample
    assert set(DeadLetter.objects.filter(state="open").values_list("id", flat=True)) == set(
        rows[2:]
    )


@pytest.mark.parametrize("limit", ["-5", "0", "two", "1.5"])
@pytest.mark.parametrize("action", ["replay", "discard"])
def test_a_limit_that_is_no_positive_integer_is_refused_never_read_as_all(
    operator, broker, action, limit
):
    rows = [DeadLetter.objects.get(job=worker_lost()).id for _ in range(3)]
    url = RUN.format(action=action)
    dry = operator.get(url, {"queue": "sim_dlq", "limit": limit})
    assert dry.status_code == 200 and "dry_run" not in dry.context
    assert "The limit must be a whole number of at least 1" in dry.context["error"]
    hidden = [(k, str(v)) for k, v in dry.context["hidden"]]
    assert ("limit", limit) in hidden  # carried to the confirm, never dropped
    done = operator.post(url, {"queue": "sim_dlq", "limit": limit, "justification": "INC-9"})
    assert done.status_code == 200
    assert "The limit must be a whole number of at least 1" in done.context["error"]
    assert b"The limit must be a whole number of at least 1" in done.content
    assert set(DeadLetter.objects.filter(state="open").values_list("id", flat=True)) == set(rows)
    assert not AuditLog.objects.filter(event_type__startswith="dlq_").exists()


def test_the_selected_rows_go_to_a_discard_dry_run(operator, broker):
    keep, drop = worker_lost(), worker_lost()
    row = DeadLetter.objects.get(job=drop)
    chosen = operator.post(LIST, {"action": "discard_selected", "_selected_action": [row.id]})
    assert chosen.status_code == 302 and f"ids={row.id}" in chosen["Location"]
    dry = operator.get(chosen["Location"])
    assert dry.context["dry_run"].matched == 1
    operator.post(chosen["Location"].split("?")[0], {"ids": row.id, "justification": "dup"})
    assert DeadLetter.objects.get(id=row.id).state == "discarded"
    assert DeadLetter.objects.get(job=keep).state == "open"


def test_the_age_filter_is_pinned_between_the_dry_run_and_the_confirm(operator, broker):
    worker_lost()
    dry = operator.get(RUN.format(action="discard"), {"age": "24h"})
    hidden = dict(dry.context["hidden"])
    assert "created_after" in hidden and "age" not in hidden
    assert dry.context["dry_run"].matched == 1


def test_a_large_replay_runs_in_the_background_with_a_page_to_stop_it(operator, broker, settings):
    settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD = 2
    for _ in range(3):
        worker_lost()
    started = operator.post(RUN.format(action="replay"), {"justification": "bulk"})
    operation = BulkOperation.objects.get()
    assert started.status_code == 302
    assert started["Location"] == f"/admin/dlq/bulkoperation/{operation.id}/change/"
    page = operator.get(started["Location"])
    assert b'id="stop-operation"' in page.content and b"data-refresh-url" in page.content
    assert (
        b"0</strong> of 3"
        in operator.get(f"/admin/dlq/bulkoperation/{operation.id}/panel/").content
    )
    operator.post(f"/admin/dlq/bulkoperation/{operation.id}/stop/")
    operation.refresh_from_db()
    assert operation.state == "stopped"
    assert b'id="stop-operation"' not in operator.get(started["Location"]).content


def test_stop_on_a_finished_operation_says_it_had_finished_and_changes_nothing(
    operator, broker, settings
):
    settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD = 2
    for _ in range(3):
        worker_lost()
    operator.post(RUN.format(action="replay"), {"justification": "bulk"}, follow=True)
    operation = BulkOperation.objects.get()
    for _ in range(5):  # a chunk per dispatcher loop, then done
        bulk_operations_run_once()
    operation.refresh_from_db()
    assert operation.state == "done"
    stop = operator.post(f"/admin/dlq/bulkoperation/{operation.id}/stop/", follow=True)
    assert [str(m) for m in stop.context["messages"]] == [
        "The replay had already finished (done, 3 of 3 dead letters handled); nothing was changed."
    ]
    after = BulkOperation.objects.get()
    assert (after.state, after.stop_requested, after.stopped_by, after.finished_at) == (
        "done",
        False,
        None,
        operation.finished_at,
    )


def test_stop_on_a_queued_operation_says_it_is_stopped(operator, broker, settings):
    settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD = 2
    for _ in range(3):
        worker_lost()
    operator.post(RUN.format(action="discard"), {"justification": "bulk"}, follow=True)
    operation = BulkOperation.objects.get()
    stop = operator.post(f"/admin/dlq/bulkoperation/{operation.id}/stop/", follow=True)
    assert [str(m) for m in stop.context["messages"]] == [
        "The discard is stopped (0 of 3 dead letters handled)."
    ]


def test_dead_letters_cannot_be_edited_or_deleted(operator, broker):
    row = DeadLetter.objects.get(job=worker_lost())
    superuser = otp_login(Client(), role_user("operator", is_superuser=True))
    for client in (operator, superuser):
        assert client.get(f"{LIST}add/").status_code == 403
        assert client.post(f"{LIST}{row.id}/change/", {"state": "replayed"}).status_code == 403
        assert client.post(f"{LIST}{row.id}/delete/", {"post": "yes"}).status_code == 403
    assert DeadLetter.objects.get(id=row.id).state == "open"


# --- ids an operator can tell apart and search for (issue 25) -------------------------------

JOB_CELL = re.compile(
    r'<a href="/admin/jobs/job/([0-9a-f-]{36})/change/"[^>]*>\s*<code[^>]*>([^<]+)</code>'
)


def _shown_ids(page) -> dict[str, str]:
    """{job id: what the page shows of it}."""
    return dict(JOB_CELL.findall(page.content.decode()))


def test_the_list_and_the_dry_run_tell_apart_jobs_that_died_together(operator, broker):
    jobs = [worker_lost() for _ in range(3)]  # UUIDv7: their ids begin with the same time
    ids = {str(j.id) for j in jobs}
    for page in (operator.get(LIST), operator.get(RUN.format(action="discard"))):
        shown = _shown_ids(page)
        assert set(shown) == ids and len(set(shown.values())) == 3
        for job_id, text in shown.items():
            assert text.startswith("…") and job_id.endswith(text[1:]) and len(text) == 13
        assert 'class="copy-id"' in page.content.decode()


def test_the_list_finds_dead_letters_by_what_it_shows_of_their_job(operator, broker):
    jobs = [worker_lost() for _ in range(2)]
    shown = _shown_ids(operator.get(LIST))
    for job in jobs:
        full = str(job.id)
        for term in (shown[full], full[-5:], full[:28].upper(), full, "junk-message-id"):
            page = operator.get(LIST, {"q": term})
            assert page.status_code == 200
            found = [r.job_id for r in page.context["cl"].result_list]
            assert found == ([] if term == "junk-message-id" else [job.id]), term
    for nonsense in ("%", "_%_", "x" * 3_000):  # within the URI limit (4096)
        page = operator.get(LIST, {"q": nonsense})
        assert page.status_code == 200 and not page.context["cl"].result_list


# --- replay where it can do something (issue 25) ---------------------------------------------


def test_replay_is_not_offered_for_dead_letters_that_name_no_job(operator, broker):
    for _ in range(2):
        dead_letter_without_job()
    job_failed("UPSTREAM_DOWN")
    page = operator.get(LIST, {"state": "open"})
    groups = {g["error_code"]: (g["open"], g["replayable"]) for g in page.context["groups"]}
    assert groups == {"UNDECODABLE": (2, 0), "UPSTREAM_DOWN": (1, 1)}
    rows = page.content.decode().split('id="groups"')[1].split("</table>")[0].split("<tr>")
    undecodable = next(r for r in rows if "UNDECODABLE" in r)
    assert "Replay" not in undecodable and "Discard…" in undecodable
    assert "no job to replay" in undecodable
    assert "Replay 1…" in next(r for r in rows if "UPSTREAM_DOWN" in r)

    queues = operator.get("/admin/jobs/deadletter/queues/panel/")
    sim = next(q for q in queues.context["queues"] if q["queue"] == "sim_dlq")
    assert (sim["open"], sim["replayable"]) == (3, 1)
    DeadLetter.objects.filter(job__isnull=False).update(
        state="discarded", resolved_at=timezone.now(), justification="x"
    )
    row = operator.get("/admin/jobs/deadletter/queues/panel/").content.decode()
    row = row.split('data-queue="sim_dlq"')[1].split("</tr>")[0]
    assert "Replay" not in row and "Discard…" in row


def test_a_replay_dry_run_says_how_many_dead_letters_name_no_job(operator, broker):
    junk = [dead_letter_without_job() for _ in range(2)]
    job = job_failed("UPSTREAM_DOWN")
    url = RUN.format(action="replay")

    dry = operator.get(url, {"queue": "sim_dlq", "limit": "1"})
    assert (dry.context["dry_run"].matched, dry.context["dry_run"].without_job) == (1, 2)
    note = "2 dead letters name no job: they can only be discarded."
    text = dry.content.decode()
    assert 'id="without-job"' in text and note in text
    discard = "/admin/jobs/deadletter/discard/run/?queue=sim_dlq&without_job=1"
    assert f'href="{discard.replace("&", "&amp;")}"' in text and "Discard them…" in text
    instead = operator.get(discard)  # exactly those, whatever limit the replay had
    assert [s["dead_letter_id"] for s in instead.context["dry_run"].sample] == [r.id for r in junk]

    chosen = ",".join(str(r.id) for r in junk)
    only_junk = operator.get(url, {"ids": chosen})
    assert (only_junk.context["dry_run"].matched, only_junk.context["dry_run"].without_job) == (
        0,
        2,
    )
    assert note in only_junk.content.decode()
    assert f"discard/run/?ids={chosen.replace(',', '%2C')}&amp;without_job=1" in (
        only_junk.content.decode()
    )

    by_job = operator.get(url, {"job": str(job.id)})
    assert by_job.context["dry_run"].without_job == 0
    assert 'id="without-job"' not in by_job.content.decode()
