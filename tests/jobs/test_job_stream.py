"""`GET /api/v1/jobs/{id}/events` (jobs/api/stream.py) against the real uvicorn process
the Procfile runs, started once for the module with short timings."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator

import httpx
import pytest
from django.conf import settings
from rest_framework.authtoken.models import Token

from jobs.models import EventOutbox
from jobs.selectors.job_events import STREAM_FIELDS
from jobs.services import job_progress_write, job_succeed
from tests.factories import (
    OrganisationFactory,
    UserFactory,
    fence_of,
    job_in_state,
)
from tests.polling import wait_for
from tests.processes import Process, free_port, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

HEARTBEAT = 0.3
PER_USER = 2


@pytest.fixture(scope="module")
def stream_url(django_db_setup, django_db_blocker) -> Iterator[str]:
    port = free_port()
    env = subprocess_env(
        JOBOPS_SSE_HEARTBEAT_SECONDS=str(HEARTBEAT),
        JOBOPS_SSE_POLL_SECONDS="0.1",
        JOBOPS_SSE_MAX_STREAMS_PER_USER=str(PER_USER),
    )
    args = [sys.executable, "-m", "uvicorn", "config.asgi_events:application", "--port", str(port)]
    process = Process(args, env, "events")
    try:
        wait_for(
            lambda: "Uvicorn running" in process.log_text() or not process.alive(),
            timeout=30,
        )
        assert process.alive(), process.log_text()[-3000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


def token_headers(user) -> dict[str, str]:
    token, _ = Token.objects.get_or_create(user=user)
    return {"Authorization": f"Token {token.key}"}


def events_path(job) -> str:
    return f"/api/v1/jobs/{job.id}/events"


def read_stream(response: httpx.Response, *, until=None) -> list[dict]:
    """The stream's frames (events and comments) until it ends, or `until(frames)`."""
    frames: list[dict] = []
    frame: dict = {}
    for line in response.iter_lines():
        if line == "":
            if frame:
                frames.append(frame)
                frame = {}
                if until is not None and until(frames):
                    return frames
            continue
        if line.startswith(":"):
            frame["comment"] = line[1:].strip()
            continue
        name, _, value = line.partition(": ")
        frame[name] = value
    if frame:
        frames.append(frame)
    return frames


def events_of(frames: list[dict]) -> list[dict]:
    return [f for f in frames if "event" in f]


def outbox_bodies(job) -> dict[int, dict]:
    """The outbox's events of the job by seq, without their random event_id."""
    rows = EventOutbox.objects.filter(job_id=job.id).order_by("seq")
    return {row.seq: {k: v for k, v in row.payload.items() if k != "event_id"} for row in rows}


def stream(stream_url, job, user, **headers) -> list[dict]:
    with httpx.stream(
        "GET", stream_url + events_path(job), headers={**token_headers(user), **headers},
        timeout=15,
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return read_stream(response)


def test_a_stream_sends_the_outbox_bodies_with_seq_ids_and_ends_after_the_final_event(
    stream_url,
):
    job = job_in_state("succeeded")
    frames = stream(stream_url, job, job.owner)

    events = events_of(frames)
    assert [int(f["id"]) for f in events] == [1, 2, 3, 4]
    assert {f["event"] for f in events} == {"job.status.changed"}
    bodies = [json.loads(f["data"]) for f in events]
    assert [b["status"] for b in bodies] == ["pending", "queued", "running", "succeeded"]
    expected = outbox_bodies(job)
    for body in bodies:
        assert tuple(body) == STREAM_FIELDS["job.status.changed"]
        assert body == expected[body["seq"]]
    # It ended by itself (the `with` returned): nothing follows a terminal status.


def test_a_live_stream_sends_progress_events_as_the_outbox_holds_them(stream_url):
    job = job_in_state("running", worker="w1")
    seen: list[dict] = []
    with httpx.stream(
        "GET", stream_url + events_path(job), headers=token_headers(job.owner), timeout=15
    ) as response:
        lines = response.iter_lines()

        def next_event() -> dict:
            frame: dict = {}
            for line in lines:
                if line == "":
                    if "event" in frame:
                        return frame
                    frame = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(": ")
                    frame[name] = value
            raise AssertionError("the stream ended")

        seen += [next_event() for _ in range(3)]  # created, queued, started
        job_progress_write(
            job_id=job.id, fence=fence_of(job), percent=40, step="load", message="4 of 10"
        )
        seen.append(next_event())
        job_succeed(job_id=job.id, fence=fence_of(job), result={"ok": True})
        seen.append(next_event())
        assert list(lines) == []  # ended after the final event

    assert [f["event"] for f in seen][-2:] == ["job.progress", "job.status.changed"]
    expected = outbox_bodies(job)
    for frame in seen:
        body = json.loads(frame["data"])
        assert int(frame["id"]) == body["seq"]
        assert tuple(body) == STREAM_FIELDS[frame["event"]]
        assert body == expected[body["seq"]], frame
    assert json.loads(seen[3]["data"])["progress"] == {
        "percent": 40,
        "step": "load",
        "message": "4 of 10",
    }


def test_resuming_with_last_event_id_misses_nothing_and_repeats_nothing(stream_url):
    job = job_in_state("succeeded")
    first = events_of(stream(stream_url, job, job.owner, **{"Last-Event-ID": "0"}))
    for cut in range(len(first) + 1):
        rest = events_of(stream(stream_url, job, job.owner, **{"Last-Event-ID": str(cut)}))
        assert [f["id"] for f in first[:cut] + rest] == [f["id"] for f in first]
        assert [f["data"] for f in first[:cut] + rest] == [f["data"] for f in first]


def test_another_organisations_job_is_a_404_envelope(stream_url):
    job = job_in_state("running")
    stranger = UserFactory(org=OrganisationFactory())
    response = httpx.get(stream_url + events_path(job), headers=token_headers(stranger), timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "ERR-JOB-404"


def test_a_token_in_the_query_string_is_refused_before_anything_is_read(stream_url):
    job = job_in_state("running")
    key = Token.objects.get_or_create(user=job.owner)[0].key
    response = httpx.get(f"{stream_url}{events_path(job)}?token={key}", timeout=10)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-400" and error["details"] == {"query": ["token"]}


def test_without_credentials_it_is_a_401_and_any_other_path_a_404(stream_url):
    job = job_in_state("running")
    assert httpx.get(stream_url + events_path(job), timeout=10).status_code == 401
    other = httpx.get(f"{stream_url}/api/v1/jobs/{job.id}", headers=token_headers(job.owner))
    assert other.status_code == 404 and other.json()["error"]["code"] == "ERR-JOB-404"
    bad = httpx.get(
        stream_url + events_path(job),
        headers={**token_headers(job.owner), "Last-Event-ID": "x"},
        timeout=10,
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "ERR-JOB-400"


def test_a_users_streams_are_capped_and_a_closed_one_frees_its_place(stream_url):
    job = job_in_state("running")
    headers = token_headers(job.owner)
    url = stream_url + events_path(job)
    with httpx.Client(timeout=10) as client:
        opened = [client.stream("GET", url, headers=headers) for _ in range(PER_USER)]
        responses = [s.__enter__() for s in opened]
        try:
            assert [r.status_code for r in responses] == [200] * PER_USER
            refused = httpx.get(url, headers=headers, timeout=10)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "ERR-JOB-429"
            assert refused.json()["error"]["details"]["scope"] == "user"
            assert refused.headers["Retry-After"]
            # Another user is not held by this user's cap.
            other = job_in_state("running")
            with httpx.stream(
                "GET", stream_url + events_path(other), headers=token_headers(other.owner)
            ) as response:
                assert response.status_code == 200
        finally:
            for s in opened:
                s.__exit__(None, None, None)

    def admitted() -> bool:
        with httpx.stream("GET", url, headers=headers, timeout=10) as response:
            return response.status_code == 200

    wait_for(admitted, timeout=10, what="a place freed by the closed streams")


def test_an_idle_stream_sends_a_heartbeat_comment(stream_url):
    job = job_in_state("running")
    with httpx.stream(
        "GET", stream_url + events_path(job), headers=token_headers(job.owner), timeout=15
    ) as response:
        frames = read_stream(response, until=lambda fs: any("comment" in f for f in fs))
    assert {"comment": "heartbeat"} in frames
    assert len(events_of(frames)) == 3  # created, queued, started; then only heartbeats


def test_a_session_authenticates_a_stream_as_the_api_does(stream_url, client):
    job = job_in_state("succeeded")
    client.force_login(job.owner)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    with httpx.stream(
        "GET",
        stream_url + events_path(job),
        cookies={settings.SESSION_COOKIE_NAME: cookie},
        timeout=15,
    ) as response:
        assert response.status_code == 200
        assert len(events_of(read_stream(response))) == 4


def test_the_process_wide_cap_refuses_one_more_stream_whoever_asks(settings):
    """In process: the app's count at JOBOPS_SSE_MAX_STREAMS refuses any user's next
    stream with 429 (scope total) after the checks that come before it."""
    from jobs.api.stream import EventStreamApp, StreamRefused

    settings.JOBOPS_SSE_MAX_STREAMS = 5
    job = job_in_state("running")
    token = Token.objects.get_or_create(user=job.owner)[0].key
    scope = {
        "type": "http",
        "method": "GET",
        "path": events_path(job),
        "query_string": b"",
        "headers": [(b"authorization", f"Token {token}".encode())],
    }
    app = EventStreamApp()
    assert asyncio.run(app._admit(scope))[0] == job.id  # admitted below the cap
    app.open_streams = 5
    with pytest.raises(StreamRefused) as refused:
        asyncio.run(app._admit(scope))
    assert refused.value.status == 429
    assert refused.value.body["error"]["details"] == {
        "limit": 5,
        "scope": "total",
        "retry_after": 5,
    }
