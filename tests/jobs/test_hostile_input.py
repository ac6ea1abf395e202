"""Hostile or absurd API input gets a 4xx in the envelope, never a 500 (issue: trust).

Each case here answered 500, 201 for work no worker could finish, or leaked data before.
"""

from __future__ import annotations

import base64
from urllib.parse import urlencode

import pytest
from django.db import connection

from jobs.models import Job
from tests.factories import UserFactory, client_for, make_job

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def raw_post(client, body: str):
    return client.post(JOBS, body, content_type="application/json")


@pytest.mark.parametrize("depth", [40, 900, 3_000, 100_000])
def test_a_deeply_nested_body_is_a_400_anywhere_in_it(api, depth):
    body = '{"type": "erp", "params": {"event": "x", "data": {"a": ' + nested(depth) + "}}}"
    response = raw_post(api, body)
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-400"
    assert "nested deeper than 32 levels" in error["message"]
    assert not Job.objects.exists()


def test_nesting_within_the_limit_is_accepted(api):
    data: dict = {}
    inner = data
    for _ in range(28):  # body, params and data add three levels: 31 in all
        inner["a"] = {}
        inner = inner["a"]
    response = api.post(
        JOBS, {"type": "erp", "params": {"event": "x", "data": data}}, format="json"
    )
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    "params",
    [
        '{"event": "a\\u0000b"}',
        '{"event": "x", "data": {"k\\u0000": 1}}',
        '{"event": "x", "data": {"s": "\\ud800"}}',
        '{"event": "x", "data": {"n": 1e400}}',
        '{"event": "x", "data": {"n": ' + "9" * 5000 + "}}",
        '{"event": "x", "data": {"n": NaN}}',
    ],
    ids=["nul-value", "nul-key", "lone-surrogate", "float-overflow", "huge-int", "nan"],
)
def test_what_postgresql_or_json_refuses_is_a_400(api, params):
    response = raw_post(api, '{"type": "erp", "params": ' + params + "}")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["code"] == "ERR-JOB-400"
    assert not Job.objects.exists()


def _cursor(position: str) -> str:
    token = urlencode({"o": "0", "r": "0", "p": position})
    return base64.b64encode(token.encode()).decode()


@pytest.mark.parametrize("position", ["not-a-date", "2026-13-45T99:99:99", "a\x00b"])
def test_a_well_formed_cursor_with_a_bad_position_is_a_400(api, position):
    make_job(owner=api.user)
    response = api.get(JOBS, {"cursor": _cursor(position)})
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["details"]["cursor"] == ["Invalid cursor position."]


@pytest.mark.parametrize(
    ("cursor", "message"),
    [
        ("A" * 3000, "Invalid cursor: longer than 200 characters."),
        ("A" * 200, "Invalid cursor."),  # NUL bytes: DRF read them as the first page
        (base64.b64encode(b"o=0&x=1").decode(), "Invalid cursor."),
        (base64.b64encode(b"o=1&o=2").decode(), "Invalid cursor."),
    ],
    ids=["3000-chars", "nul-bytes", "unknown-key", "repeated-key"],
)
def test_a_cursor_no_answer_ever_sent_is_a_400_in_the_envelope(api, cursor, message):
    make_job(owner=api.user)
    response = api.get(JOBS, {"cursor": cursor})
    assert response.status_code == 400, response.content[:300]
    body = response.json()["error"]
    assert body["code"] == "ERR-JOB-400" and body["details"]["cursor"] == [message]


@pytest.mark.parametrize("size", ["-1", "0", "-5000"])
def test_a_page_size_below_one_is_a_400_not_the_default_page(api, size):
    make_job(owner=api.user)
    response = api.get(JOBS, {"page_size": size})
    assert response.status_code == 400, response.content[:300]
    body = response.json()["error"]
    assert body["code"] == "ERR-JOB-400"
    assert body["details"]["page_size"] == ["At least 1 (at most 200 are sent)."]


def test_a_page_size_above_the_maximum_is_read_as_the_maximum(api):
    make_job(owner=api.user)
    response = api.get(JOBS, {"page_size": "100000"})
    assert response.status_code == 200 and len(response.json()["results"]) == 1


def test_a_real_cursor_still_pages(api):
    for _ in range(3):
        make_job(owner=api.user)
    first = api.get(JOBS, {"page_size": 2}).json()
    second = api.get(first["next"])
    assert second.status_code == 200 and len(second.json()["results"]) == 1
    back = api.get(second.json()["previous"])  # a reverse cursor passes the checks too
    assert back.status_code == 200 and len(back.json()["results"]) == 2


# --- params that imply more work than a worker can do (point 4) ----------------------


@pytest.mark.parametrize(
    ("job_type", "params", "field"),
    [
        ("cam", {"width": 1e4, "height": 1e4, "tool_diameter": 1e-3, "stepover": 0.05}, "stepover"),
        ("sim", {"steps": 10000, "step_seconds": 60}, "step_seconds"),
        ("sim", {"steps": 5, "step_seconds": "NaN"}, "step_seconds"),
        ("model", {"points": [[0, 1], [1, "Infinity"]]}, "points"),
        ("model", {"points": [[0, 1], [1, 1e300]]}, "points"),
    ],
    ids=["cam-passes", "sim-time", "sim-nan", "model-inf", "model-huge"],
)  # fmt: skip
def test_params_that_exhaust_a_worker_are_a_422_naming_the_field(api, job_type, params, field):
    response = api.post(JOBS, {"type": job_type, "params": params}, format="json")
    assert response.status_code == 422, response.content
    assert field in response.json()["error"]["details"]
    assert not Job.objects.exists()


# sim's soft time limit is 840 s; its work budget keeps 20 % headroom: at most 672 s.
@pytest.mark.parametrize(
    ("steps", "step_seconds", "planned"),
    [(10000, 0.084, "840"), (10000, 0.06721, "672.1")],
    ids=["at-the-time-limit", "just-over-80-percent"],
)
def test_sim_planned_over_its_work_budget_is_a_422_naming_step_seconds(
    api, steps, step_seconds, planned
):
    params = {"steps": steps, "step_seconds": step_seconds}
    response = api.post(JOBS, {"type": "sim", "params": params}, format="json")
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-422"
    [message] = error["details"]["step_seconds"]
    assert f"plans {planned} s of work" in message
    assert not Job.objects.exists()


def test_sim_work_budget_message_names_the_allowed_maximum(api):
    params = {"steps": 10000, "step_seconds": 0.084}
    response = api.post(JOBS, {"type": "sim", "params": params}, format="json")
    [message] = response.json()["error"]["details"]["step_seconds"]
    assert "at most 672 s (80% of its 840 s soft time limit)" in message


@pytest.mark.parametrize(
    ("steps", "step_seconds"),
    [(10000, 0.0672), (1200, 0.56), (10000, 0.067)],
    ids=["exactly-80-percent", "exactly-80-percent-up-to-rounding", "under"],
)
def test_sim_planned_within_its_work_budget_is_created(api, steps, step_seconds):
    params = {"steps": steps, "step_seconds": step_seconds}
    response = api.post(JOBS, {"type": "sim", "params": params}, format="json")
    assert response.status_code == 201, response.content


def test_the_work_budget_fraction_is_one_setting(api, settings):
    settings.JOBOPS_WORK_BUDGET_FRACTION = 0.5  # 420 s of sim's 840 s
    over = {"steps": 1000, "step_seconds": 0.43}
    response = api.post(JOBS, {"type": "sim", "params": over}, format="json")
    assert response.status_code == 422, response.content
    within = {"steps": 1000, "step_seconds": 0.42}
    response = api.post(JOBS, {"type": "sim", "params": within}, format="json")
    assert response.status_code == 201, response.content


def test_the_handler_receives_the_validated_params(api):
    response = api.post(JOBS, {"type": "sim", "params": {"steps": "20.0"}}, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert job.params == {"steps": 20, "step_seconds": 0.5, "seed": 0}


# --- reports see only their owner's jobs (point 3) ------------------------------------


def test_only_staff_may_ask_for_every_owners_jobs(api, staff_api):
    body = {"type": "report", "params": {"all_owners": True}}
    refused = api.post(JOBS, body, format="json")
    assert refused.status_code == 422
    assert "all_owners" in refused.json()["error"]["details"]
    assert staff_api.post(JOBS, body, format="json").status_code == 201


# --- database trouble is a 503 with Retry-After (point 7) ----------------------------


@pytest.mark.django_db(transaction=True)
def test_a_read_only_database_answers_503_with_retry_after():
    user = UserFactory()
    job = make_job(owner=user)
    client = client_for(user)
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_read_only = on")
    try:
        created = client.post(JOBS, {"type": "sim", "params": {}}, format="json")
        cancelled = client.post(f"{JOBS}/{job.id}/cancel")
    finally:
        connection.close()  # the next connection is writable again
    for response in (created, cancelled):
        assert response.status_code == 503, response.content
        assert response.json()["error"]["code"] == "ERR-JOB-503"
        assert response["Retry-After"] == "5"
    assert Job.objects.count() == 1 and not Job.objects.get().cancel_requested


@pytest.mark.django_db(transaction=True)
def test_an_unreachable_database_answers_503(monkeypatch):
    user = UserFactory()
    job = make_job(owner=user)
    client = client_for(user)
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "PORT", "1")  # nothing listens there
    try:
        for response in (
            client.post(JOBS, {"type": "sim", "params": {}}, format="json"),
            client.post(f"{JOBS}/{job.id}/cancel"),
        ):
            assert response.status_code == 503, response.content
            assert response.json()["error"]["code"] == "ERR-JOB-503"
            assert int(response["Retry-After"]) > 0
    finally:
        monkeypatch.undo()
        connection.close()
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_blackholed_broker_does_not_hold_the_request(settings):
    """The request never waits on the broker (docs/architecture.md): the job is committed
    `pending` and the dispatcher publishes it. Before: the 5 s publish timeout."""
    import socket
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes the TCP handshake; AMQP never answers
    settings.BROKER_URL = f"amqp://guest:guest@127.0.0.1:{silent.getsockname()[1]}//"
    client = client_for(UserFactory())
    try:
        started = time.monotonic()
        response = client.post(JOBS, {"type": "sim", "params": {}}, format="json")
        elapsed = time.monotonic() - started
    finally:
        silent.close()
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "pending"
    assert elapsed < 0.5, elapsed


@pytest.mark.parametrize("query", ["status=%00", "q=a%00b", "type%00=sim"])
def test_a_nul_in_an_admin_query_string_is_a_400(otp_admin_client, query):
    make_job()
    response = otp_admin_client.get(f"/admin/jobs/job/?{query}")
    assert response.status_code == 400


def test_a_nul_in_an_api_query_string_is_a_400_envelope(api):
    response = api.get(f"{JOBS}?status=%00")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "ERR-HTTP-400"
