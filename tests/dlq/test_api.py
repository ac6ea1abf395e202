"""The admin DLQ API (docs/api.md): who may call it, what it answers, what it changes."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from audit.models import AuditLog
from dlq.models import BulkOperation
from jobs.domain.states import Status
from jobs.models import DeadLetter, Job
from tests.factories import (
    OperatorFactory,
    StaffFactory,
    client_for,
    dead_letter_without_job,
    otp_login,
    role_user,
    worker_lost,
)
from tests.polling import wait_for
from tests.queues import depth, worker_dead_letter

pytestmark = pytest.mark.django_db
DLQ = "/api/v1/admin/dlq"
NO_SUCH_JOB = "7d1c8a3e-0f0b-4c55-9a53-0d1a2b3c4d5e"


@pytest.fixture(autouse=True)
def _fresh_limits():
    cache.clear()


def session_api(user) -> APIClient:
    """An API client on an OTP-verified admin session (what the portal's pages use)."""
    return otp_login(APIClient(enforce_csrf_checks=False), user)


@pytest.fixture
def operator_api():
    return session_api(role_user("operator"))


@pytest.fixture
def viewer_api():
    return session_api(role_user("viewer"))


def _code(response) -> str:
    return response.json()["error"]["code"]


def test_calls_without_a_verified_otp_are_err_dlq_401(broker):
    anonymous = APIClient()
    token_only = client_for(OperatorFactory())  # staff with a token, but no OTP grant
    password_only = APIClient()
    password_only.force_login(OperatorFactory())  # a session that skipped the OTP step
    for client in (anonymous, token_only, password_only):
        for call in (client.get(DLQ), client.post(f"{DLQ}/sim_dlq/replay", {}, format="json")):
            assert call.status_code == 401 and _code(call) == "ERR-DLQ-401"
            assert "WWW-Authenticate" in call


def test_verified_non_staff_are_err_dlq_401(broker):
    user = OperatorFactory(is_staff=False)
    refused = session_api(user).get(DLQ)
    assert refused.status_code == 401 and _code(refused) == "ERR-DLQ-401"


def test_the_list_shows_each_dlq_with_depth_and_open_dead_letters(viewer_api, broker):
    worker_lost()
    queues = {q["queue"]: q for q in viewer_api.get(DLQ).json()}
    assert set(queues) >= {"default_dlq", "sim_dlq", "erp_dlq"}
    assert queues["sim_dlq"] == {
        "queue": "sim_dlq",
        "depth": 0,
        "open": 1,
        "broker_error": None,
        "broker_dlq": True,
    }


def test_a_postgres_queue_has_no_broker_dlq_to_peek_and_its_rows_still_count(
    viewer_api, broker, settings
):
    """docs/postgres-executor.md: its dead letters are the database rows alone."""
    settings.JOBOPS_QUEUE_EXECUTORS = {**settings.JOBOPS_QUEUE_EXECUTORS, "sim": "postgres"}
    worker_lost()
    queues = {q["queue"]: q for q in viewer_api.get(DLQ).json()}
    assert queues["sim_dlq"] == {
        "queue": "sim_dlq",
        "depth": None,
        "open": 1,
        "broker_error": None,
        "broker_dlq": False,
    }
    refused = viewer_api.get(f"{DLQ}/sim_dlq/peek", {"limit": 5})
    assert refused.status_code == 409 and _code(refused) == "ERR-DLQ-409"
    assert "no broker DLQ" in refused.json()["error"]["message"]


def test_peek_shows_messages_with_their_rows_and_consumes_nothing(viewer_api, amqp):
    job = worker_dead_letter(amqp, code="BOOM")
    before = depth(amqp, "sim_dlq")
    answer = viewer_api.get(f"{DLQ}/sim_dlq/peek", {"limit": 5})
    assert answer.status_code == 200, answer.content
    [message] = answer.json()
    assert message["job_id"] == str(job.id) and message["routing_key"] == "sim"
    assert message["death"]["reason"] == "rejected" and message["death"]["count"] == 1
    assert message["death"]["first_time"] and message["payload"]["job_id"] == str(job.id)
    assert [r["error_code"] for r in message["dead_letters"]] == ["BOOM"]
    assert before == 1
    # Nothing consumed. A quorum DLQ takes a peeked message back through its log after
    # the peek's answer: the depth is 1 again shortly, not at that instant.
    wait_for(lambda: depth(amqp, "sim_dlq") == 1, timeout=10, what="the peeked message back")


def test_peek_refuses_an_unknown_queue_and_a_bad_limit(viewer_api, broker):
    missing = viewer_api.get(f"{DLQ}/sim/peek")  # the primary queue is not a DLQ
    assert missing.status_code == 404 and _code(missing) == "ERR-DLQ-404"
    for limit in ("0", "101", "2.0", "x"):
        bad = viewer_api.get(f"{DLQ}/sim_dlq/peek", {"limit": limit})
        assert bad.status_code == 400 and _code(bad) == "ERR-DLQ-400", limit


def test_peek_of_a_dlq_the_broker_does_not_hold_is_empty_not_an_error(viewer_api, amqp):
    amqp.queue_delete("cam_dlq")  # as in a vhost where setup_topology has not run
    answer = viewer_api.get(f"{DLQ}/cam_dlq/peek")
    assert answer.status_code == 200, answer.content
    assert answer.json() == []


def test_viewer_is_refused_a_replay_and_a_discard(viewer_api, broker):
    job = worker_lost()
    for action in ("replay", "discard"):
        refused = viewer_api.post(
            f"{DLQ}/sim_dlq/{action}", {"justification": "x", "dry_run": True}, format="json"
        )
        assert refused.status_code == 403 and _code(refused) == "ERR-DLQ-403"
    assert Job.objects.get(id=job.id).status == Status.FAILED


def test_operator_dry_run_counts_and_samples_and_changes_nothing(operator_api, broker):
    jobs = [worker_lost() for _ in range(3)]
    answer = operator_api.post(
        f"{DLQ}/sim_dlq/replay", {"dry_run": True, "limit": 2}, format="json"
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["dry_run"] and body["matched"] == 2 and len(body["sample"]) == 2
    assert body["resolved"] == []
    assert {j.status for j in Job.objects.filter(id__in=[j.id for j in jobs])} == {"failed"}


@pytest.mark.parametrize("action", ["replay", "discard"])
def test_a_limited_dry_run_samples_exactly_the_rows_the_run_then_takes(
    operator_api, broker, action
):
    rows = [DeadLetter.objects.get(job=worker_lost()).id for _ in range(4)]
    body = {"justification": "INC-8", "limit": 2}
    dry = operator_api.post(f"{DLQ}/sim_dlq/{action}", {**body, "dry_run": True}, format="json")
    sample = [s["dead_letter_id"] for s in dry.json()["sample"]]
    assert (dry.json()["matched"], sample) == (2, rows[:2])  # the oldest two, oldest first
    done = operator_api.post(f"{DLQ}/sim_dlq/{action}", body, format="json")
    assert done.json()["resolved"] == sample
    assert set(DeadLetter.objects.filter(state="open").values_list("id", flat=True)) == set(
        rows[2:]
    )


def test_a_replay_says_how_many_dead_letters_name_no_job_and_why(operator_api, broker):
    junk = [dead_letter_without_job() for _ in range(2)]
    job = worker_lost()
    note = "2 dead letters name no job: they can only be discarded."
    dry = operator_api.post(f"{DLQ}/sim_dlq/replay", {"dry_run": True}, format="json").json()
    assert (dry["matched"], dry["without_job"], dry["notes"]) == (1, 2, [note])
    discard = operator_api.post(f"{DLQ}/sim_dlq/discard", {"dry_run": True}, format="json")
    assert (discard.json()["matched"], discard.json()["without_job"]) == (3, 0)
    assert discard.json()["notes"] == []

    done = operator_api.post(f"{DLQ}/sim_dlq/replay", {"justification": "INC-4"}, format="json")
    assert done.json()["job_ids"] == [str(job.id)] and done.json()["notes"] == [note]
    assert {DeadLetter.objects.get(id=r.id).state for r in junk} == {"open"}
    rest = operator_api.post(
        f"{DLQ}/sim_dlq/discard",
        {"justification": "junk", "filter": {"without_job": True}},
        format="json",
    )
    assert sorted(rest.json()["resolved"]) == sorted(r.id for r in junk)


def test_operator_replays_chosen_jobs_and_the_audit_names_user_row_and_message(operator_api, amqp):
    job = worker_dead_letter(amqp, code="UPSTREAM_DOWN")
    other = worker_lost()
    answer = operator_api.post(
        f"{DLQ}/sim_dlq/replay",
        {"justification": "INC-7: upstream is back", "job_ids": [str(job.id)]},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["job_ids"] == [str(job.id)] and body["broker_acked"] == 1
    assert Job.objects.get(id=job.id).status == Status.PENDING
    assert Job.objects.get(id=other.id).status == Status.FAILED
    row = DeadLetter.objects.get(job=job)
    assert (row.state, row.justification) == ("replayed", "INC-7: upstream is back")
    entry = AuditLog.objects.filter(job_id=job.id, event_type="dlq_replayed").get()
    assert entry.actor_id == str(operator_api.user.pk)
    assert f'"message_id":"{row.message_id}"' in entry.payload
    assert body["message_ids"] == [row.message_id]
    assert depth(amqp, "sim_dlq") == 0


def test_operator_discards_by_filter(operator_api, broker):
    job = worker_lost()
    answer = operator_api.post(
        f"{DLQ}/sim_dlq/discard",
        {"justification": "duplicate order", "filter": {"reason": "worker_lost"}},
        format="json",
    )
    assert answer.status_code == 200 and answer.json()["job_ids"] == [str(job.id)]
    assert DeadLetter.objects.get(job=job).state == "discarded"
    assert AuditLog.objects.filter(job_id=job.id, event_type="dlq_discarded").exists()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "ERR-DLQ-422"),  # no justification for a real replay
        ({"justification": "   "}, "ERR-DLQ-422"),
        ({"justification": "x", "job_ids": [NO_SUCH_JOB]}, "ERR-DLQ-422"),
        ({"justification": "x", "dry_run": "true"}, "ERR-DLQ-400"),
        ({"justification": "x", "limit": 0}, "ERR-DLQ-400"),
        ({"justification": "x", "job_ids": [42]}, "ERR-DLQ-400"),
        ({"justification": "x", "filter": {"colour": "red"}}, "ERR-DLQ-400"),
        ({"justification": "x", "status": "pending"}, "ERR-DLQ-400"),
        ([], "ERR-DLQ-400"),
    ],
)
def test_bad_requests_are_refused_with_their_code(operator_api, broker, body, code):
    worker_lost()
    refused = operator_api.post(f"{DLQ}/sim_dlq/replay", body, format="json")
    assert _code(refused) == code, refused.content
    assert refused.status_code == int(code[-3:])
    assert DeadLetter.objects.get().state == "open"


def test_a_replay_in_an_unknown_queue_is_err_dlq_404(operator_api, broker):
    answer = operator_api.post(f"{DLQ}/nope_dlq/replay", {"justification": "x"}, format="json")
    assert answer.status_code == 404 and _code(answer) == "ERR-DLQ-404"


def test_a_large_selection_runs_in_the_background_and_can_be_stopped(
    operator_api, broker, settings
):
    settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD = 2
    for _ in range(3):
        worker_lost()
    answer = operator_api.post(f"{DLQ}/sim_dlq/replay", {"justification": "bulk"}, format="json")
    assert answer.status_code == 202, answer.content
    operation = answer.json()
    assert operation["state"] == "queued" and operation["total"] == 3
    assert answer["Location"].endswith(f"/api/v1/admin/dlq/operations/{operation['id']}")
    read = operator_api.get(answer["Location"])
    assert read.status_code == 200 and read.json()["id"] == operation["id"]
    stopped = operator_api.post(f"{DLQ}/operations/{operation['id']}/stop")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    assert BulkOperation.objects.get().processed == 0
    assert DeadLetter.objects.filter(state="open").count() == 3


def test_unknown_operations_are_err_dlq_404(viewer_api):
    for operation_id in ("not-a-uuid", "7d1c8a3e-0f0b-4c55-9a53-0d1a2b3c4d5e"):
        missing = viewer_api.get(f"{DLQ}/operations/{operation_id}")
        assert missing.status_code == 404 and _code(missing) == "ERR-DLQ-404"


def test_admin_calls_are_limited_per_minute(viewer_api, broker, settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "admin_dlq": 3}
    assert [viewer_api.get(DLQ).status_code for _ in range(3)] == [200, 200, 200]
    limited = viewer_api.get(DLQ)
    assert limited.status_code == 429 and _code(limited) == "ERR-DLQ-429"
    assert 1 <= int(limited["Retry-After"]) <= 60


def test_an_unknown_method_is_405_whoever_asks():
    for client in (APIClient(), session_api(StaffFactory())):
        answer = client.delete(DLQ)
        assert answer.status_code == 405 and "GET" in answer["Allow"]


def test_a_replay_posted_as_a_form_is_415_even_without_a_body(operator_api, broker):
    worker_lost()
    for content_type in ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        response = operator_api.generic(
            "POST", f"{DLQ}/sim_dlq/replay", "", content_type=content_type
        )
        assert response.status_code == 415, response.content
        assert _code(response) == "ERR-HTTP-415"
    assert DeadLetter.objects.get().state == "open"


def test_a_replay_body_with_a_5000_digit_number_is_a_plain_400(operator_api, broker):
    worker_lost()
    body = '{"justification": "x", "limit": 1' + "0" * 5000 + "}"
    response = operator_api.generic(
        "POST", f"{DLQ}/sim_dlq/replay", body, content_type="application/json"
    )
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert _code(response) == "ERR-DLQ-400" and "more than 4300 digits" in message
    assert "sys." not in message
    assert DeadLetter.objects.get().state == "open"
