"""The Python client (clients/python, docs/client.md) against a live jobops: submit with
its key and safe retries, batches, ETag reads, cancel and retry, artefacts checked by
sha256, the error envelope as exceptions, and `wait` polling when there is no stream."""

from __future__ import annotations

import socket
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from jobops_client import (
    ApiError,
    ArtefactIntegrityError,
    Client,
    RetryInfo,
    TransportError,
    WaitTimeout,
)

from jobs.models import Artefact as ArtefactRow
from jobs.models import Job
from jobs.services import artefact_save, job_claim, job_succeed
from tests.factories import fence_of, job_in_state
from tests.polling import wait_for
from tests.processes import free_port

pytestmark = pytest.mark.usefixtures("clean_redis")

SIM = {"steps": 1, "step_seconds": 0}


@pytest.fixture
def client(live_api, account):
    _, key = account
    with Client(live_api, key, poll_interval=0.05) as made:
        yield made


def succeed(job_id: str, result: dict | None = None) -> None:
    """The job run to success, as a worker would end it (the services, in this process)."""
    claimed = job_claim(job_id=uuid.UUID(job_id), locked_by="w1")
    job_succeed(job_id=claimed.id, fence=fence_of(claimed), result=result)


class DroppingProxy:
    """A TCP proxy before the live server: each connection is forwarded, but for the
    first `drops` of them the answer is cut off as it starts: the server did the work,
    the client hears a closed connection (a network error after the request left)."""

    def __init__(self, upstream: str, *, drops: int) -> None:
        self.upstream = int(upstream.rsplit(":", 1)[1])
        self.drops = drops
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            drop, self.drops = self.drops > 0, self.drops - 1
            threading.Thread(target=self._serve, args=(conn, drop), daemon=True).start()

    def _serve(self, conn: socket.socket, drop: bool) -> None:
        up = socket.create_connection(("127.0.0.1", self.upstream))

        def forward() -> None:
            try:
                while data := conn.recv(65536):
                    up.sendall(data)
            except OSError:
                pass

        threading.Thread(target=forward, daemon=True).start()
        try:
            while data := up.recv(65536):
                if drop:
                    break
                conn.sendall(data)
        except OSError:
            pass
        finally:
            for end in (conn, up):  # shutdown, not only close: the forward thread holds it
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    def close(self) -> None:
        self.server.close()


def test_submit_makes_a_key_and_a_repeat_answers_the_same_job(client, account):
    made = client.submit("sim", SIM)
    assert made.created is True and made.status == "pending"
    assert uuid.UUID(made.idempotency_key).version == 4  # made by the client
    again = client.submit("sim", SIM, made.idempotency_key)
    assert (again.created, again.id) == (False, made.id)
    with pytest.raises(ApiError) as refused:
        client.submit("sim", {"steps": 2}, made.idempotency_key)
    error = refused.value
    assert (error.status, error.code) == (422, "ERR-JOB-IDEMPOTENCY-MISMATCH")
    assert error.details["job_id"] == made.id
    assert Job.objects.filter(owner=account[0]).count() == 1


def test_a_lost_answer_is_retried_with_the_same_key_and_makes_one_job(live_api, account):
    proxy = DroppingProxy(live_api, drops=1)
    retries: list[RetryInfo] = []
    try:
        with Client(proxy.url, account[1], on_retry=retries.append) as client:
            job = client.submit("sim", SIM, priority=3)
    finally:
        proxy.close()
    # The first attempt made the job; the retry, with the same key, found it (200).
    assert job.created is False and job.data["priority"] == 3
    assert [r.reason for r in retries] == ["RemoteProtocolError"]
    assert Job.objects.filter(idempotency_key=job.idempotency_key).count() == 1


def test_a_call_that_is_not_idempotent_is_not_sent_twice(live_api, account):
    failed = job_in_state("failed", owner=account[0])
    proxy = DroppingProxy(live_api, drops=1)
    try:
        with Client(proxy.url, account[1]) as client, pytest.raises(TransportError):
            client.retry(failed.id)
    finally:
        proxy.close()
    # Its one request went through: sent again, it would have been a 409.
    assert Job.objects.get(id=failed.id).status == "pending"


def test_a_429_is_waited_out_as_retry_after_says(live_api, account):
    retries: list[RetryInfo] = []
    with Client(live_api, account[1], on_retry=retries.append) as client:
        spent = client.submit_many([{"type": "sim", "params": SIM}] * 30)  # the allowance
        assert {r.status for r in spent} == {"created"}
        job = client.submit("sim", SIM)
    assert job.created is True
    assert retries and retries[0].reason == "429" and 0 < retries[0].wait <= 2
    with Client(live_api, account[1], max_attempts=1) as impatient:
        with pytest.raises(ApiError) as refused:
            impatient.submit("sim", SIM)
    assert (refused.value.status, refused.value.code) == (429, "ERR-JOB-RATE-LIMIT")
    assert refused.value.retry_after is not None


def test_submit_many_answers_in_order_and_a_retried_batch_makes_nothing_twice(client):
    items = [
        {"type": "sim", "params": SIM},
        {"type": "sim", "params": {"steps": "many"}},
        {"type": "sim", "params": SIM, "idempotency_key": "own"},
    ]
    first = client.submit_many(items, key="batch-1")
    assert [r.status for r in first] == ["created", "error", "created"]
    assert first[1].error is not None and first[1].error.code == "ERR-JOB-422"
    again = client.submit_many(items, key="batch-1")
    assert [r.status for r in again] == ["existing", "error", "existing"]
    assert [r.id for r in again] == [r.id for r in first]


def test_get_revalidates_with_its_etag(client):
    made = client.submit("sim", SIM)
    read = client.get(made.id)
    assert read is made  # a 304: the job held already
    client.cancel(made.id)
    cancelled = client.get(made.id)
    assert cancelled.status == "cancelled" and cancelled.etag != made.etag
    with pytest.raises(ApiError) as missing:
        client.get(uuid.uuid4())
    assert (missing.value.status, missing.value.code) == (404, "ERR-JOB-404")


def test_retry_runs_a_failed_job_again(client, account):
    failed = job_in_state("failed", owner=account[0])
    assert client.retry(failed.id, reason="upstream fixed").status == "pending"
    with pytest.raises(ApiError) as twice:
        client.retry(failed.id)
    assert (twice.value.status, twice.value.code) == (409, "ERR-JOB-409")


@pytest.mark.parametrize("stream", ["none", "refused", "not served"])
def test_wait_polls_when_there_is_no_stream(live_api, account, stream):
    stream_url = {
        "none": None,
        "refused": f"http://127.0.0.1:{free_port()}",  # nothing listens
        "not served": live_api,  # jobops itself answers the stream's path 404
    }[stream]
    with Client(live_api, account[1], stream_url=stream_url, poll_interval=0.05) as client:
        made = client.submit("sim", SIM)
        with pytest.raises(WaitTimeout) as early:
            client.wait(made.id, timeout=0.2)
        assert early.value.job.status == "pending"
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.wait, made.id, 30)
            succeed(made.id, {"answer": 42})
            ended = waiting.result()
    assert (ended.status, ended.result) == ("succeeded", {"answer": 42})


def test_artefacts_download_checks_their_sha256_and_removes_a_bad_file(client, tmp_path):
    made = client.submit("sim", SIM)
    succeed(made.id)
    artefact_save(job_id=made.id, kind="report", name="out.csv", data=b"a,b\n1,2\n")
    [artefact] = client.artefacts(made.id)
    assert (artefact.name, artefact.size) == ("out.csv", 8)
    assert artefact.download(tmp_path / "out.csv").read_bytes() == b"a,b\n1,2\n"
    # The stored file changed behind the job's record (same size, other bytes).
    Path(ArtefactRow.objects.get(id=artefact.id).file.path).write_bytes(b"a,b\n6,6\n")
    with pytest.raises(ArtefactIntegrityError, match="sha256"):
        artefact.download(tmp_path / "bad.csv")
    assert not (tmp_path / "bad.csv").exists()


class ScriptedStream:
    """A tiny SSE server standing in for the job's live stream (another process in
    production): connection i writes `scripts[i]` (each item a chunk, or a
    threading.Event it waits for first) and closes; it records each request's headers."""

    def __init__(self, scripts: list[list[str | threading.Event]]) -> None:
        self.scripts, self.requests = scripts, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index = len(outer.requests)
                outer.requests.append({"path": self.path, **dict(self.headers)})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for step in outer.scripts[index]:
                    if isinstance(step, threading.Event):
                        step.wait(10)
                    else:
                        self.wfile.write(step.encode())
                        self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def status(seq: int, value: str) -> str:
    return f'id: {seq}\nevent: job.status.changed\ndata: {{"status": "{value}"}}\n\n'


def test_wait_follows_the_stream_and_resumes_after_the_last_whole_event(live_api, account):
    release = threading.Event()
    stream = ScriptedStream(
        [
            [
                "retry: 10\n\n: keep-alive\n\n",
                'id: 3\nevent: job.progress\ndata: {"percent": 50}\n\n',
                status(4, "running"),
                'id: 5\nevent: job.status.changed\ndata: {"status": "succ',  # cut off
            ],
            [release, status(5, "succeeded")],
        ]
    )
    seen = []
    try:
        with Client(live_api, account[1], stream_url=stream.url) as client:
            made = client.submit("sim", SIM)
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(client.wait, made.id, 30, on_event=seen.append)
                wait_for(lambda: len(stream.requests) == 2, timeout=10, what="a reconnect")
                succeed(made.id, {"done": True})
                release.set()
                ended = waiting.result()
    finally:
        stream.close()
    assert (ended.status, ended.result) == ("succeeded", {"done": True})
    assert [(e.event, e.id) for e in seen] == [
        ("job.progress", "3"),
        ("job.status.changed", "4"),
        ("job.status.changed", "5"),
    ]
    first, resumed = stream.requests
    assert first["path"] == resumed["path"] == f"/api/v1/jobs/{made.id}/events"
    assert first["Authorization"] == f"Token {account[1]}"
    assert first["Accept"] == "text/event-stream" and "Last-Event-ID" not in first
    assert resumed["Last-Event-ID"] == "4"  # the cut-off event 5 is asked for again


def test_a_stream_that_closes_after_the_job_ended_answers_the_ended_job(live_api, account):
    stream = ScriptedStream([[": nothing to say\n\n"]])
    try:
        with Client(live_api, account[1], stream_url=stream.url) as client:
            made = client.submit("sim", SIM)
            succeed(made.id)
            assert client.wait(made.id, 10).status == "succeeded"
    finally:
        stream.close()
    assert len(stream.requests) == 1  # read once after the close: no reconnect needed
