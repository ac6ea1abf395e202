"""`Client(base_url, token)`: the jobops API (`/api/v1/`) from Python.

Safe retries: a create always carries an idempotency key (a uuid4 unless given), the same
on every attempt, so a retry after a lost answer returns the job the first attempt made.
Network errors, 429 and 503 are retried up to `max_attempts` times, after the answer's
`Retry-After` (or a jittered backoff); a call that is not idempotent (a job's retry) is
retried only when its request never left (the connection was refused).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from jobops_client.errors import ApiError, TransportError, WaitTimeout, retry_after_seconds
from jobops_client.models import FINAL_STATUSES, Artefact, BatchResult, Job
from jobops_client.sse import Event, SSEDecoder, StreamError, iter_events

__version__ = "0.1.0"

API = "/api/v1"
STATUS_EVENT = "job.status.changed"
# ETags kept for conditional GETs: the most recently read jobs.
ETAG_CACHE = 1024
# A stream that keeps failing to reconnect is given up for polling after this many.
MAX_RECONNECTS = 5
# The longest a stream read blocks before the client checks its deadline again.
STREAM_READ_SECONDS = 30.0


@dataclass(frozen=True)
class RetryInfo:
    """What `on_retry` hears before each retry: the attempt that failed, the wait before
    the next one (seconds) and why (`429`, `503`, or the network error's class)."""

    attempt: int
    wait: float
    reason: str


def _path_id(job_id: str | uuid.UUID) -> str:
    return quote(str(job_id), safe="")


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise ValueError("run_at needs a time zone (the API refuses a naive time)")
        return value.isoformat()
    return value


def _final(data: str) -> bool:
    try:
        status = json.loads(data).get("status")
    except (ValueError, AttributeError):
        return False
    return status in FINAL_STATUSES


class Client:
    """A session with one jobops; use it as a context manager, or call `close()`.

    `stream_url`: the base of the live-stream server (a separate process), None when
    there is none: `wait` then polls. `max_attempts`: tries per call (1: no retry);
    `max_retry_wait`: the longest `Retry-After` honoured (a longer one is raised at once).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        stream_url: str | None = None,
        timeout: float = 30.0,
        max_attempts: int = 5,
        max_retry_wait: float = 60.0,
        poll_interval: float = 0.2,
        max_poll_interval: float = 5.0,
        on_retry: Callable[[RetryInfo], None] | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts is at least 1")
        headers = {
            "Authorization": f"Token {token}",
            "Accept": "application/json",
            "User-Agent": f"jobops-client/{__version__}",
        }
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        self._stream = (
            httpx.Client(base_url=stream_url.rstrip("/"), headers=headers, timeout=timeout)
            if stream_url
            else None
        )
        self._timeout = timeout
        self.max_attempts = max_attempts
        self.max_retry_wait = max_retry_wait
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.on_retry = on_retry
        self._etags: OrderedDict[str, Job] = OrderedDict()

    def close(self) -> None:
        self._http.close()
        if self._stream is not None:
            self._stream.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport ------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        idempotent: bool = True,
    ) -> httpx.Response:
        """The answer to the call, retried as the module docstring says; the last
        answer when the attempts run out (the caller raises its envelope)."""
        for attempt in range(1, self.max_attempts + 1):
            try:
                response = self._http.request(method, path, json=json_body, headers=headers)
            except httpx.TransportError as exc:
                # A refused connection sent nothing: any call may go again.
                unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if not (idempotent or unsent) or attempt == self.max_attempts:
                    raise TransportError(f"{method} {path}: {exc!r}") from exc
                wait, reason = self._backoff(attempt), type(exc).__name__
            else:
                if response.status_code not in (429, 503) or attempt == self.max_attempts:
                    return response
                retry_after = retry_after_seconds(response)
                wait = self._backoff(attempt) if retry_after is None else retry_after
                if wait > self.max_retry_wait:
                    return response
                reason = str(response.status_code)
            if self.on_retry is not None:
                self.on_retry(RetryInfo(attempt=attempt, wait=wait, reason=reason))
            time.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    @staticmethod
    def _backoff(attempt: int) -> float:
        return float(min(0.25 * 2 ** (attempt - 1), 8.0) * random.uniform(0.5, 1.0))

    def _job(self, response: httpx.Response, *, created: bool | None = None) -> Job:
        if response.status_code not in (200, 201):
            raise ApiError.from_response(response)
        job = Job(data=response.json(), etag=response.headers.get("ETag"), created=created)
        self._remember(job)
        return job

    def _remember(self, job: Job) -> None:
        if job.etag is None:
            return
        self._etags[job.id] = job
        self._etags.move_to_end(job.id)
        while len(self._etags) > ETAG_CACHE:
            self._etags.popitem(last=False)

    # --- jobs -----------------------------------------------------------------------

    def submit(
        self,
        type: str,
        params: Mapping[str, Any],
        key: str | None = None,
        *,
        priority: int | None = None,
        run_at: datetime | str | None = None,
        project: str | None = None,
        org: str | None = None,
    ) -> Job:
        """Create a job (`POST /api/v1/jobs`); `Job.created` says whether this call made
        it or found its key's earlier job. Without `key`, a uuid4 (kept on the job's
        `idempotency_key`): every retry sends the same one."""
        body: dict[str, Any] = {
            "type": type,
            "params": dict(params),
            "idempotency_key": key or str(uuid.uuid4()),
        }
        optional = {"priority": priority, "run_at": _iso(run_at), "project": project, "org": org}
        body.update({name: value for name, value in optional.items() if value is not None})
        response = self._request("POST", f"{API}/jobs", json_body=body)
        return self._job(response, created=response.status_code == 201)

    def submit_many(
        self, items: Iterable[Mapping[str, Any]], *, key: str | None = None
    ) -> list[BatchResult]:
        """Create a batch (`POST /api/v1/jobs/batch`): each item a create's body
        (`type`, `params`, optional `idempotency_key`, `run_at`, `priority`, `org`,
        `project`). One result per item, in order. The request's key (a uuid4 unless
        given) gives each item without its own `<key>:<index>`: a retried batch makes
        nothing twice."""
        jobs = [{name: _iso(value) for name, value in item.items()} for item in items]
        headers = {"Idempotency-Key": key or str(uuid.uuid4())}
        response = self._request(
            "POST", f"{API}/jobs/batch", json_body={"jobs": jobs}, headers=headers
        )
        if response.status_code != 200:
            raise ApiError.from_response(response)
        results = []
        for row in sorted(response.json()["results"], key=lambda r: r["index"]):
            error = row.get("error")
            results.append(
                BatchResult(
                    index=row["index"],
                    status=row["status"],
                    id=row.get("id"),
                    error=ApiError.from_envelope(error) if isinstance(error, dict) else None,
                )
            )
        return results

    def get(self, job_id: str | uuid.UUID) -> Job:
        """The job (`GET /api/v1/jobs/{id}`), revalidated with the ETag of the last read:
        a 304 answers the job already held, at the cost of one indexed value."""
        cached = self._etags.get(str(job_id))
        headers = {"If-None-Match": cached.etag} if cached and cached.etag else None
        response = self._request("GET", f"{API}/jobs/{_path_id(job_id)}", headers=headers)
        if response.status_code == 304 and cached is not None:
            self._etags.move_to_end(cached.id)
            return cached
        return self._job(response)

    def cancel(self, job_id: str | uuid.UUID) -> Job:
        """Ask for the job's cancellation (idempotent: retried like a read)."""
        return self._job(self._request("POST", f"{API}/jobs/{_path_id(job_id)}/cancel"))

    def retry(self, job_id: str | uuid.UUID, *, reason: str | None = None) -> Job:
        """Run a failed job again. Not idempotent (a second retry of a job pending again
        is a 409), so only a request that never left is sent again."""
        body = {"reason": reason} if reason is not None else None
        response = self._request(
            "POST", f"{API}/jobs/{_path_id(job_id)}/retry", json_body=body, idempotent=False
        )
        return self._job(response)

    def artefacts(self, job_id: str | uuid.UUID) -> list[Artefact]:
        """The job's artefacts, each with `download(path)`."""
        return [Artefact(data=row, http=self._http) for row in self.get(job_id).data["artefacts"]]

    # --- waiting --------------------------------------------------------------------

    def wait(
        self,
        job_id: str | uuid.UUID,
        timeout: float,
        *,
        on_event: Callable[[Event], None] | None = None,
    ) -> Job:
        """The job once it has ended (succeeded, failed or cancelled), read after its end;
        WaitTimeout after `timeout` seconds. Over the live stream when there is one
        (`on_event` hears each event: `job.progress`, `job.status.changed`); without
        one (no `stream_url`, a 404, a refused connection, a stream that keeps
        breaking) by polling with ETags, the interval growing to `max_poll_interval`."""
        deadline = time.monotonic() + timeout
        if self._stream is not None:
            job = self._wait_stream(job_id, deadline, on_event)
            if job is not None:
                return job
        return self._wait_poll(job_id, deadline)

    def _wait_poll(self, job_id: str | uuid.UUID, deadline: float) -> Job:
        interval = self.poll_interval
        while True:
            job = self.get(job_id)
            if job.done:
                return job
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(f"job {job_id} is still {job.status}", job=job)
            time.sleep(min(interval, remaining))
            interval = min(interval * 1.5, self.max_poll_interval)

    def _wait_stream(
        self,
        job_id: str | uuid.UUID,
        deadline: float,
        on_event: Callable[[Event], None] | None,
    ) -> Job | None:
        """The ended job read after its final event; None when the stream is not there
        (the caller polls). A stream that ends early is resumed with `Last-Event-ID`
        (the audit seq of the last event seen: nothing is missed or repeated), after
        the server's `retry:` delay."""
        assert self._stream is not None
        decoder = SSEDecoder()
        path = f"{API}/jobs/{_path_id(job_id)}/events"
        connected, failures = False, 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(f"job {job_id}: no final event in time")
            headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
            if decoder.last_event_id is not None:
                headers["Last-Event-ID"] = decoder.last_event_id
            read = min(remaining, STREAM_READ_SECONDS)
            timeout = httpx.Timeout(self._timeout, read=read)
            try:
                with self._stream.stream("GET", path, headers=headers, timeout=timeout) as answer:
                    kind = answer.headers.get("Content-Type", "")
                    if answer.status_code in (401, 403):
                        answer.read()
                        raise ApiError.from_response(answer)
                    if answer.status_code != 200 or not kind.startswith("text/event-stream"):
                        return None  # no stream here (404, a 5xx): poll
                    connected, failures = True, 0
                    for event in iter_events(answer.iter_lines(), decoder):
                        if on_event is not None:
                            on_event(event)
                        if event.event == STATUS_EVENT and _final(event.data):
                            return self.get(job_id)  # the final body: result, artefacts
            except (httpx.TransportError, StreamError):
                if not connected:
                    return None  # refused, or never a good stream: no stream server
            # The stream ended without the final event: perhaps the job ended while no
            # stream was open, else resume where it stopped.
            job = self.get(job_id)
            if job.done:
                return job
            failures += 1
            if failures > MAX_RECONNECTS:
                return None
            delay = decoder.retry_ms / 1000 if decoder.retry_ms is not None else 1.0
            time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
