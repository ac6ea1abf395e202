"""`GET /api/v1/jobs/{id}/events`: a job's events as Server-Sent Events (docs/api.md).

A small ASGI app (config/asgi_events.py, the Procfile's `events` process under uvicorn)
that serves only this route; the sync API stays under gunicorn, where a stream would
hold a worker for its whole life.

1. Refusals before the stream starts are the API's error envelope: another path or
   method, a token in the query string (400: a URL ends up in logs and histories),
   then the API's own checks, run through its authentication, scope and visibility
   (`JobEventsOpenApi`, a DRF view: 401, 403, 404 as the sync API answers them), a
   bad `Last-Event-ID` (400), then the caps (429): `JOBOPS_SSE_MAX_STREAMS` in this
   process, `JOBOPS_SSE_MAX_STREAMS_PER_USER` per user in this process.
2. The stream: each event as `id: <audit seq>`, `event: <type>`, `data: <JSON body>`
   (jobs.selectors.job_events builds the bodies: those of the outbox, without
   `event_id`). `Last-Event-ID` (the header a browser's EventSource sends on a
   reconnect) resumes after that seq: the entries are read by (chain, seq > last), so a
   resumed stream misses none and repeats none. A comment line every
   `JOBOPS_SSE_HEARTBEAT_SECONDS` keeps proxies from closing an idle stream. The stream
   ends after the job's final event (a terminal status and nothing after it). A
   failure after the start is an `event: error` with the envelope as its data.
3. No database connection is held between reads: every read runs on one of
   `JOBOPS_SSE_DB_CONNECTIONS` threads, which closes its connection after it. One
   query a tick (`JOBOPS_SSE_POLL_SECONDS`) reads the heads of every open stream's job
   (`_Heads`); only a stream whose job moved reads its entries, at most once a second
   (`READ_GAP_SECONDS`). No NOTIFY is needed from the transitions.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import parse_qs

import structlog
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError, close_old_connections, connection
from django_otp.middleware import OTPMiddleware
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.exceptions import error_body
from jobs.api.views import jobs_staff_powers
from jobs.domain.exceptions import JobNotFoundError
from jobs.selectors import job_version_for_user
from jobs.selectors.job_events import EventCursor, job_events_poll
from tenants.models import Scope
from tenants.permissions import RequiredScope

log = structlog.get_logger("jobs.stream")

ROUTE = re.compile(r"^/api/v1/jobs/(?P<job_id>[0-9a-fA-F-]{32,36})/events/?$")
# Query parameters that carry a credential somewhere: refused, never read.
TOKEN_PARAMETERS = frozenset({"token", "access_token", "api_key", "apikey", "key", "auth"})
# A stream reads its job's entries at most this often; the heads of every stream's job
# are read each JOBOPS_SSE_POLL_SECONDS (one query), so that an event waits for the next
# tick rather than for a second: a progress write every 2 s is read as it commits.
READ_GAP_SECONDS = 1.0
# The largest Last-Event-ID accepted (a seq is a bigint).
MAX_SEQ = 2**63 - 1
T = TypeVar("T")

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class StreamRefused(Exception):
    """A refusal before the stream starts: its status, envelope and headers."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None):
        super().__init__(body["error"]["message"])
        self.status, self.body, self.headers = status, body, headers or {}


class JobEventsOpenApi(APIView):
    """The sync half of opening a stream: the API's authentication (token header or
    session), scope and visibility, answered as the sync API answers them. Not routed:
    the ASGI app calls it once per stream before it starts."""

    required_scope: RequiredScope = Scope.JOBS_READ

    def get(self, request: Request, job_id: uuid.UUID) -> Response:
        staff = jobs_staff_powers(request)
        if job_version_for_user(job_id=job_id, user=request.user, staff=staff) is None:
            raise JobNotFoundError()
        return Response({"user_id": request.user.pk})


def _open(scope: dict[str, Any], job_id: uuid.UUID) -> Any:
    """Run JobEventsOpenApi behind the session, authentication and second-factor
    middleware the sync API has (a session's user, its OTP verification)."""
    request = ASGIRequest(scope, io.BytesIO())
    view = JobEventsOpenApi.as_view()
    # The stubs type a middleware's get_response too narrowly to chain them.
    verified: Any = OTPMiddleware(lambda r: view(r, job_id=job_id))
    authenticated: Any = AuthenticationMiddleware(verified)
    response: Any = SessionMiddleware(authenticated)(request)
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response.render()
    return response


class _Heads:
    """One query a tick for the heads (`audit_seq`) of every open stream's job; wakes
    the streams whose job moved past what they sent (or is gone)."""

    def __init__(self, run: Callable[..., Awaitable[Any]]) -> None:
        self._run = run
        self._waiting: dict[uuid.UUID, list[tuple[int, asyncio.Event]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def wait(self, job_id: uuid.UUID, last: int, timeout: float) -> bool:
        """Until the job's head passes `last` (True) or `timeout` passed (False)."""
        moved = asyncio.Event()
        entry = (last, moved)
        self._waiting.setdefault(job_id, []).append(entry)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._tick())
        try:
            await asyncio.wait_for(moved.wait(), timeout=max(0.0, timeout))
            return True
        except TimeoutError:
            return False
        finally:
            waiting = self._waiting.get(job_id, [])
            if entry in waiting:
                waiting.remove(entry)
            if not waiting:
                self._waiting.pop(job_id, None)

    async def _tick(self) -> None:
        while self._waiting:
            await asyncio.sleep(settings.JOBOPS_SSE_POLL_SECONDS)
            ids = list(self._waiting)
            if not ids:
                break
            try:
                heads = await self._run(_read_heads, ids)
            except DatabaseError as exc:
                log.warning("stream_heads_failed", error=repr(exc))
                continue
            for job_id in ids:
                head = heads.get(job_id)
                for last, moved in self._waiting.get(job_id, []):
                    if head is None or head > last:
                        moved.set()


def _read_heads(ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    with connection.cursor() as db:
        db.execute("SELECT id, audit_seq FROM jobs WHERE id = ANY(%s)", [ids])
        return dict(db.fetchall())


class EventStreamApp:
    """The ASGI app: `GET /api/v1/jobs/{id}/events` and nothing else."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=settings.JOBOPS_SSE_DB_CONNECTIONS, thread_name_prefix="stream-db"
        )
        self._heads = _Heads(self._db)
        self.open_streams = 0
        self.per_user: Counter[Any] = Counter()

    async def _db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn` on a database thread, which closes its connection afterwards: a
        stream holds none between its reads."""

        def call() -> T:
            close_old_connections()
            try:
                return fn(*args, **kwargs)
            finally:
                connection.close()

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            job_id, after, user = await self._admit(scope)
        except StreamRefused as refused:
            await _answer(send, refused.status, refused.body, refused.headers)
            return
        self.open_streams += 1
        self.per_user[user] += 1
        try:
            await self._serve(scope, receive, send, job_id=job_id, after=after)
        finally:
            self.open_streams -= 1
            self.per_user[user] -= 1
            if self.per_user[user] <= 0:
                del self.per_user[user]

    async def _admit(self, scope: dict[str, Any]) -> tuple[uuid.UUID, int, Any]:
        """The refusals of step 1, in order; returns (job id, Last-Event-ID, user)."""
        match = ROUTE.match(scope.get("path", ""))
        if match is None:
            raise StreamRefused(
                404,
                error_body("ERR-JOB-404", "Not found: this host serves only the job event stream."),
            )
        if scope.get("method") not in ("GET", "HEAD"):
            raise StreamRefused(
                405, error_body("ERR-HTTP-405", "Only GET is allowed."), {"Allow": "GET"}
            )
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        named = sorted(TOKEN_PARAMETERS & {name.lower() for name in query})
        if named:
            raise StreamRefused(
                400,
                error_body(
                    "ERR-JOB-400",
                    "A credential in the query string is refused: send the token in the "
                    "Authorization header (Token ...), or use a session.",
                    {"query": named},
                ),
            )
        try:
            job_id = uuid.UUID(match["job_id"])
        except ValueError:
            raise StreamRefused(404, error_body("ERR-JOB-404", "No such job.")) from None
        after = _last_event_id(scope)
        try:
            response = await self._db(_open, scope, job_id)
        except DatabaseError:
            raise StreamRefused(
                503,
                error_body("ERR-JOB-503", "The database is unavailable; retry."),
                {"Retry-After": "5"},
            ) from None
        if response.status_code != 200:
            headers = {k: v for k, v in response.items() if k in ("WWW-Authenticate",)}
            raise StreamRefused(response.status_code, json.loads(response.content), headers)
        user = response.data["user_id"]
        limit = settings.JOBOPS_SSE_MAX_STREAMS
        if self.open_streams >= limit:
            raise _too_many("total", limit)
        per_user = settings.JOBOPS_SSE_MAX_STREAMS_PER_USER
        if self.per_user[user] >= per_user:
            raise _too_many("user", per_user)
        return job_id, after, user

    async def _serve(
        self, scope: dict[str, Any], receive: Receive, send: Send, *, job_id: uuid.UUID, after: int
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),  # nginx: send each event as it comes
                ],
            }
        )
        if scope.get("method") == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        stream = asyncio.create_task(self._events(send, job_id=job_id, after=after))
        gone = asyncio.create_task(_disconnected(receive))
        done, _ = await asyncio.wait({stream, gone}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stream, gone):
            if task not in done:
                task.cancel()
        await asyncio.gather(stream, gone, return_exceptions=True)
        if stream in done and stream.exception() is None:
            await send({"type": "http.response.body", "body": b""})

    async def _events(self, send: Send, *, job_id: uuid.UUID, after: int) -> None:
        """Step 2: poll, send, wait for the head to move or the heartbeat to fall due."""
        cursor = EventCursor(job_id=job_id, last=after)
        heartbeat = settings.JOBOPS_SSE_HEARTBEAT_SECONDS
        last_sent = time.monotonic()
        while True:
            read_at = time.monotonic()
            try:
                poll = await self._db(job_events_poll, cursor=cursor)
            except DatabaseError as exc:
                log.warning("stream_poll_failed", job_id=str(job_id), error=repr(exc))
                await _send(send, _error_event("ERR-JOB-503", "The database is unavailable."))
                return
            if poll.job is None:
                await _send(send, _error_event("ERR-JOB-404", "The job is gone (purged)."))
                return
            if poll.events:
                await _send(
                    send, b"".join(_event(seq, kind, body) for seq, kind, body in poll.events)
                )
                last_sent = time.monotonic()
            if poll.job.ended and cursor.last >= poll.job.audit_seq:
                return  # its final event is sent: nothing follows a terminal status
            if cursor.last < poll.job.audit_seq:
                continue  # more than one read's worth waited
            while not await self._heads.wait(
                job_id, cursor.last, timeout=last_sent + heartbeat - time.monotonic()
            ):
                await _send(send, b": heartbeat\n\n")
                last_sent = time.monotonic()
            # Its job moved: read its entries, but not twice within READ_GAP_SECONDS (a
            # job writing progress every tick would else cost a read per tick).
            await asyncio.sleep(max(0.0, read_at + READ_GAP_SECONDS - time.monotonic()))


def _too_many(scope: str, limit: int) -> StreamRefused:
    return StreamRefused(
        429,
        error_body(
            "ERR-JOB-429",
            f"Too many open event streams ({scope} limit {limit}); close one or retry later.",
            {"limit": limit, "scope": scope, "retry_after": 5},
        ),
        {"Retry-After": "5"},
    )


def _last_event_id(scope: dict[str, Any]) -> int:
    for name, value in scope.get("headers", []):
        if name.lower() == b"last-event-id":
            text = value.decode("latin-1").strip()
            if not text.isdigit() or int(text) > MAX_SEQ:
                raise StreamRefused(
                    400,
                    error_body(
                        "ERR-JOB-400",
                        "Last-Event-ID must be the id of an event of this stream (a seq).",
                        {"Last-Event-ID": text[:40]},
                    ),
                )
            return int(text)
    return 0


def _event(seq: int, kind: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return f"id: {seq}\nevent: {kind}\ndata: {data}\n\n".encode()


def _error_event(code: str, message: str) -> bytes:
    data = json.dumps(error_body(code, message), separators=(",", ":"))
    return f"event: error\ndata: {data}\n\n".encode()


async def _send(send: Send, chunk: bytes) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def _answer(send: Send, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    content = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
