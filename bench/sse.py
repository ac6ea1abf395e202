"""Benchmark: the event stream process and job.progress delivery (docs/api.md#the-event-stream).

Scratch database `jobops_bench_sse`, without a broker (every queue on the postgres
executor: the ERP bridge reads the outbox itself), the `events` process as the Procfile
runs it (uvicorn, config.asgi_events), the ERP bridge (`run_erp_bridge`,
JOBOPS_ERP_EVENTS_PROGRESS on) POSTing to a receiver in this process.

1. --streams running jobs (created and claimed here), one token user (its stream cap
   raised).
2. The events process alone, no stream open: its RSS. Then --streams streams (one per
   job, asyncio + httpx in this process), each read until its first events arrived;
   RSS at half and all of them: RSS per 100 streams.
3. Idle, --idle-seconds: the process's CPU (target < 5 % of a core) and the most
   database connections of the events process (by its application_name, sampled;
   target <= 10), heartbeats only. The ERP bridge runs meanwhile, delivering the
   jobs' status events.
4. Progress: for --progress-seconds, each job writes progress every
   JOBOPS_PROGRESS_INTERVAL_SECONDS (2 s), spread over the interval. Each write's event
   carries its `timestamp` (taken before the write commits); its arrival at the
   receiver (the ERP bridge's POST) and on its stream give the latency from flush to
   arrival: p50, p99 (target p99 <= 1 s on both), and a check that every event
   arrived on both, once.
Writes bench/results/sse.json. Not part of `make test`.

Usage: python bench/sse.py [--streams 200] [--quick] [--keep]
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common

NAME = "sse"
FULL = {"streams": 200, "idle_seconds": 20, "progress_seconds": 20}
QUICK = {"streams": 40, "idle_seconds": 5, "progress_seconds": 6}
QUEUES = ("default", "model", "cam", "sim", "report", "erp")


def parse_ts(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


class Receiver:
    """The ERP stand-in: records when each job.progress event arrived (200 to all)."""

    def __init__(self) -> None:
        self.arrivals: dict[tuple[str, int], list[float]] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                now = time.time()
                if body.get("type") == "job.progress":
                    key = (body["job_id"], body["seq"])
                    receiver.arrivals.setdefault(key, []).append(now - parse_ts(body["timestamp"]))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", common.free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/erp/events"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def setup(jobs: int) -> tuple[str, list[Any]]:
    """A user with a token and `jobs` running jobs (created and claimed here)."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from jobs.services import job_claim, job_submit
    from tenants.models import DEFAULT_ORG_SLUG, Membership, Organisation

    user = get_user_model().objects.create_user("sse-bench", password=None)
    org = Organisation.objects.get_or_create(slug=DEFAULT_ORG_SLUG, defaults={"name": "Default"})[0]
    Membership.objects.get_or_create(user=user, organisation=org)
    token = Token.objects.create(user=user).key
    running = []
    for _ in range(jobs):
        job, _ = job_submit(owner=user, job_type="sim", params={"steps": 1})
        claimed = job_claim(job_id=job.id, locked_by="sse-bench")
        assert claimed is not None
        running.append(claimed)
    return token, running


APPLICATION = "jobops-events-bench"


def database_connections(scratch: common.Scratch) -> int:
    """Connections of the events process to the scratch database (by its
    application_name)."""
    return int(
        scratch.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            [scratch.database, APPLICATION],
        )
    )


class Streams:
    """`n` streams read in an asyncio loop on a thread of this process: arrivals of
    job.progress events (seconds after their timestamp) by (job, seq)."""

    def __init__(self, base: str, token: str, job_ids: list[str]) -> None:
        self.base, self.token, self.job_ids = base, token, job_ids
        self.opened = 0
        self.ready = 0
        self.failures: list[str] = []
        self.arrivals: dict[tuple[str, int], list[float]] = {}
        self.stop = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def open(self, count: int) -> None:
        for job_id in self.job_ids[self.opened : self.opened + count]:
            asyncio.run_coroutine_threadsafe(self._read(job_id), self.loop)
        self.opened += count

    async def _read(self, job_id: str) -> None:
        import httpx

        headers = {"Authorization": f"Token {self.token}"}
        url = f"{self.base}/api/v1/jobs/{job_id}/events"
        seen = 0
        try:
            async with httpx.AsyncClient(timeout=None) as client:
                async with client.stream("GET", url, headers=headers) as response:
                    if response.status_code != 200:
                        self.failures.append(f"{response.status_code}")
                        return
                    event = None
                    async for line in response.aiter_lines():
                        if line.startswith("event: "):
                            event = line[7:]
                        elif line.startswith("data: "):
                            seen += 1
                            if seen == 1:  # its events so far came in one read
                                self.ready += 1
                            if event == "job.progress":
                                body = json.loads(line[6:])
                                late = time.time() - parse_ts(body["timestamp"])
                                key = (body["job_id"], body["seq"])
                                self.arrivals.setdefault(key, []).append(late)
                        if self.stop.is_set():
                            return
        except Exception as exc:  # a bench counts failures rather than dying on one
            self.failures.append(repr(exc)[:200])

    def close(self) -> None:
        self.stop.set()
        self.loop.call_soon_threadsafe(self.loop.stop)


def write_progress(jobs: list[Any], seconds: float, interval: float) -> int:
    """Each job writes progress every `interval`, spread over it; returns the writes."""
    from jobs.services import Fence, job_progress_write

    start = time.monotonic()
    gap = interval / len(jobs)
    writes = 0
    percent = 0
    while time.monotonic() - start < seconds:
        percent = min(99, percent + 1)
        for index, job in enumerate(jobs):
            due = start + (writes // len(jobs)) * interval + index * gap
            time.sleep(max(0.0, due - time.monotonic()))
            job_progress_write(
                job_id=job.id,
                fence=Fence("sse-bench", job.attempts),
                percent=percent,
                step="bench",
                message=f"{percent} %",
            )
            writes += 1
    return writes


def main() -> None:
    parser = common.parser_for(__doc__)
    parser.add_argument("--streams", type=int, help="concurrent streams (one job each)")
    parser.add_argument("--idle-seconds", type=float, help="the idle measurement")
    parser.add_argument("--progress-seconds", type=float, help="the progress phase")
    args, report = common.prepare(NAME, parser, full=FULL, quick=QUICK)
    receiver = Receiver()
    brokerless = {f"JOBOPS_EXECUTOR_{q.upper()}": "postgres" for q in QUEUES}
    extra = {
        **brokerless,
        "JOBOPS_BROKER": "false",
        "JOBOPS_EVENTS_PUBLISH": "true",
        "JOBOPS_ERP_EVENTS_URL": receiver.url,
        "JOBOPS_ERP_EVENTS_PROGRESS": "true",
        "JOBOPS_SSE_MAX_STREAMS_PER_USER": str(args.streams + 10),
    }
    with common.Scratch(NAME, keep=args.keep, topology=False) as scratch:
        scratch.setup_django(**extra)
        token, jobs = setup(args.streams)
        env = scratch.env(**extra)
        events_env = {
            **env,
            "DATABASE_URL": f"{env['DATABASE_URL']}?application_name={APPLICATION}",
        }
        port = common.free_port()
        events = common.Service(
            bench=NAME,
            role="events",
            argv=[
                *(sys.executable, "-m", "uvicorn", "config.asgi_events:application"),
                *("--port", str(port), "--no-access-log", "--log-level", "warning"),
                *("--timeout-graceful-shutdown", "2"),
            ],
            env=events_env,
        )
        base = f"http://127.0.0.1:{port}"
        import requests

        def answers() -> bool:
            events.check_alive()
            try:
                return requests.get(f"{base}/nothing", timeout=2).status_code == 404
            except requests.RequestException:
                return False

        common.wait_until(answers, timeout=60, what="the events process to answer")
        rss_idle = events.memory()[0] // 1024
        report.figure("rss_no_stream_kb", rss_idle, "kB", "events process RSS, no stream")

        streams = Streams(base, token, [str(job.id) for job in jobs])
        half = args.streams // 2
        streams.open(half)
        common.wait_until(
            lambda: streams.ready + len(streams.failures) >= half,
            timeout=120,
            what="half the streams to start",
        )
        rss_half = events.memory()[0] // 1024
        streams.open(args.streams - half)
        common.wait_until(
            lambda: streams.ready + len(streams.failures) >= args.streams,
            timeout=120,
            what="every stream to start",
        )
        rss_all = events.memory()[0] // 1024
        report.figure("streams_open", streams.ready, "", "streams open")
        report.figure("rss_half_kb", rss_half, "kB", f"RSS with {half} streams")
        report.figure("rss_all_kb", rss_all, "kB", f"RSS with {args.streams} streams")
        report.figure(
            "rss_per_100_streams_kb",
            round((rss_all - rss_idle) * 100 / args.streams),
            "kB",
            "RSS per 100 streams",
        )

        common.Service(
            bench=NAME,
            role="erp_bridge",
            argv=[sys.executable, str(common.ROOT / "manage.py"), "run_erp_bridge"],
            env=env,
        )
        # 3. Idle: heartbeats only. This process's own connection closed first.
        from django.db import connections

        connections.close_all()
        cpu_before, seen_connections = common.process_cpu_seconds(events.pid), 0
        idle_start = time.monotonic()
        while time.monotonic() - idle_start < args.idle_seconds:
            seen_connections = max(seen_connections, database_connections(scratch))
            time.sleep(0.2)
        cpu = (common.process_cpu_seconds(events.pid) or 0) - (cpu_before or 0)
        idle_cpu = round(100 * cpu / (time.monotonic() - idle_start), 2)
        report.target(
            "idle_cpu_percent",
            label=f"idle CPU, {streams.ready} streams",
            value=idle_cpu,
            unit="% core",
            target=5,
            higher_is_better=False,
        )
        report.target(
            "db_connections_idle",
            label="DB connections (max, idle)",
            value=seen_connections,
            unit="",
            target=10,
            higher_is_better=False,
        )

        # 4. Progress with the ERP bridge running (started before the idle phase: it has
        # delivered the jobs' status events by now).
        from django.conf import settings

        peak = {"connections": 0}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak["connections"] = max(peak["connections"], database_connections(scratch))
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        cpu_before = common.process_cpu_seconds(events.pid)
        started = time.monotonic()
        writes = write_progress(
            jobs, args.progress_seconds, settings.JOBOPS_PROGRESS_INTERVAL_SECONDS
        )
        common.wait_until(
            lambda: len(streams.arrivals) >= writes and len(receiver.arrivals) >= writes,
            timeout=60,
            what="every progress event to arrive on its stream and at the receiver",
        )
        busy_cpu = (common.process_cpu_seconds(events.pid) or 0) - (cpu_before or 0)
        done.set()
        report.figure("progress_writes", writes, "", "progress writes")
        report.figure(
            "busy_cpu_percent",
            round(100 * busy_cpu / (time.monotonic() - started), 2),
            "% core",
            f"events process CPU, {writes / args.progress_seconds:.0f} events/s",
        )
        report.figure(
            "db_connections_busy",
            peak["connections"],
            "",
            "DB connections (max, busy)",
        )
        for where, arrivals in (("stream", streams.arrivals), ("erp", receiver.arrivals)):
            late = [v * 1000 for values in arrivals.values() for v in values]
            summary = common.latency_summary(late)
            report.extra(f"latency_{where}_ms", summary)
            report.figure(f"latency_{where}_p50_ms", summary["p50_ms"], "ms", f"{where}: p50")
            report.target(
                f"latency_{where}_p99_ms",
                label=f"{where}: flush to arrival p99",
                value=summary["p99_ms"],
                unit="ms",
                target=1000,
                higher_is_better=False,
            )
            repeats = sum(len(v) - 1 for v in arrivals.values())
            report.check(
                f"{where}_all_once",
                label=f"{where}: every event once",
                ok=len(arrivals) == writes and repeats == 0,
                detail=f"{len(arrivals)} of {writes}, {repeats} repeated",
            )
        report.check(
            "stream_failures",
            label="streams that failed",
            ok=not streams.failures,
            detail=", ".join(streams.failures[:5]),
        )
        streams.close()
        report.write(scratch)


if __name__ == "__main__":
    main()
