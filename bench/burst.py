"""Benchmark: a thousand concurrent creates under the real rate limits (issue 10, point 8).

Scratch database and vhost `jobops_bench_burst`; gunicorn (4 workers), the dispatcher
and a worker whose `ai` handler counts its runs in Redis; JOBOPS_RATE_LIMITS set to
the real limits of docs/api.md#rate-limits (60/min per user, 500/min overall) in their env.

1. --requests concurrent `POST /api/v1/jobs` (one connection each, all sent at
   once), spread over --users users, each with its own idempotency key.
2. Each token bucket that ran dry must have let through exactly its allowance: its
   capacity plus what it refilled (limit/60 per second) between its first and its
   last acceptance, by the server's clock (the jobs' created_at), give or take one
   token at the window's ends. A refusal whose RateLimit-Remaining is >= 1 came from
   the global bucket, else from the user's.
3. Every refusal is 429 with a Retry-After; per user, the last request its own
   bucket refused is sent again Retry-After seconds after its answer, with its own
   key: it must be accepted.
4. Once the worker is done: every accepted job exists exactly once (rows per key),
   no refused key made a job, every accepted job succeeded and its handler ran
   exactly once (Redis counts), and nothing else ran.
Writes bench/results/burst.json.

Usage: python bench/burst.py [--requests 1000] [--users 5] [--per-user 60]
       [--global-limit 500] [--quick] [--keep]
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as common
from bench._jobflow import (
    bench_user,
    created_times,
    status_counts,
    user_token,
    wait_for_status,
)

NAME = "burst"
# Sizes of `make bench`, and of --quick (seconds, for development).
FULL = {"requests": 1000, "users": 5}
QUICK = {"requests": 200, "users": 2}
JOB_TYPE, QUEUE = "ai", "default"


@dataclass
class Sent:
    """One request and its answer (times from time.monotonic, like Redis' clock rate)."""

    user: str
    key: str
    sent: float = 0.0
    answered: float = 0.0
    status: int = 0
    retry_after: int | None = None
    remaining: int | None = None
    job_id: str | None = None


async def post_all(base: str, requests: list[Sent], tokens: dict[str, str]) -> None:
    """Send every request at once, one connection each."""
    import httpx

    limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=300) as client:

        async def one(request: Sent) -> None:
            request.sent = time.monotonic()
            response = await client.post(
                "/api/v1/jobs",
                json={"type": JOB_TYPE, "params": {"text": "x"}, "idempotency_key": request.key},
                headers={"Authorization": f"Token {tokens[request.user]}"},
            )
            request.answered = time.monotonic()
            request.status = response.status_code
            if "Retry-After" in response.headers:
                request.retry_after = int(response.headers["Retry-After"])
            if "RateLimit-Remaining" in response.headers:
                request.remaining = int(response.headers["RateLimit-Remaining"])
            if response.status_code == 201:
                request.job_id = response.json()["id"]

        await asyncio.gather(*(one(r) for r in requests))


def allowance(accepted: list[float], *, capacity: int, ran_dry: bool) -> tuple[int, int, float]:
    """(least, most) jobs a bucket should have accepted, and the refill window in s.

    `accepted` are the server's created_at of the accepted jobs. A bucket starts full
    at its first request (accepted) and refills limit/60 per second; while requests
    keep it dry, each refilled token goes at once. So it accepts its capacity plus
    what refilled between its first and its last acceptance: that, give or take one
    token for where the window's ends fall between two refills. Never dry: everything.
    """
    window = max(accepted) - min(accepted) if accepted else 0.0
    if not ran_dry:
        return len(accepted), len(accepted), window
    expected = capacity + capacity / 60 * window
    return math.floor(expected) - 1, math.ceil(expected) + 1, window


def check_buckets(
    report: common.Report,
    scratch: common.Scratch,
    burst: list[Sent],
    users: list[str],
    limits: tuple[int, int],
) -> None:
    per_user, global_limit = limits
    created = dict(created_times(scratch, [str(r.job_id) for r in burst if r.status == 201]))
    refused = [r for r in burst if r.status == 429]
    by_global = [r for r in refused if refused_by_global(r)]
    rows = {}
    for user in [*users, "global"]:
        mine = [r for r in burst if user in ("global", r.user)]
        times = [created[str(r.job_id)] for r in mine if r.status == 201]
        dry = (
            by_global
            if user == "global"
            else [r for r in refused if r.user == user and r not in by_global]
        )
        capacity = global_limit if user == "global" else per_user
        least, most, window = allowance(times, capacity=capacity, ran_dry=bool(dry))
        rows[user] = {"accepted": len(times), "least": least, "most": most, "window_s": window}
        report.check(
            f"bucket_{user}",
            label=f"bucket {user}: its allowance accepted",
            ok=least <= len(times) <= most,
            detail=f"{len(times)} accepted; "
            + (
                f"allowance {capacity} + {capacity / 60 * window:.1f} refilled over "
                f"{window:.1f} s = [{least}, {most}]"
                if dry
                else "never ran dry (refused nothing)"
            ),
        )
    report.extra("buckets", rows)


def refused_by_global(request: Sent) -> bool:
    """RateLimit-Remaining is the user's bucket: one token left means the global one
    refused."""
    return request.status == 429 and (request.remaining or 0) >= 1


def retry_refused(base: str, burst: list[Sent], tokens: dict[str, str]) -> list[Sent]:
    """Per user, its last request its own bucket refused, sent again (same key)
    Retry-After seconds after that answer, all users at once.

    Refusals by the shared global bucket are not retried together: its Retry-After
    is the wait for one token, which several clients retrying at once cannot all get.
    Only when the global bucket refused alone is one of its refusals retried.
    """
    retries = []
    for user in tokens:
        refused = [r for r in burst if r.user == user and r.status == 429]
        own = [r for r in refused if not refused_by_global(r)]
        if own:
            last = max(own, key=lambda r: r.answered)
            retries.append((last, Sent(user=user, key=last.key)))
    if not retries:
        refused = [r for r in burst if r.status == 429]
        if refused:
            last = max(refused, key=lambda r: r.answered)
            retries.append((last, Sent(user=last.user, key=last.key)))
    if not retries:
        return []
    wait = max(last.answered + (last.retry_after or 0) for last, _ in retries) - time.monotonic()
    time.sleep(max(0.0, wait))
    again = [retry for _, retry in retries]
    asyncio.run(post_all(base, again, tokens))
    return again


def check_jobs(
    report: common.Report,
    scratch: common.Scratch,
    burst: list[Sent],
    retries: list[Sent],
    runs_key: str,
) -> None:
    import redis

    accepted = [r for r in [*burst, *retries] if r.status == 201]
    accepted_ids = [str(r.job_id) for r in accepted]
    retried_keys = {r.key for r in retries if r.status == 201}
    refused_keys = [r.key for r in burst if r.status == 429 and r.key not in retried_keys]
    with scratch.connect() as conn:
        rows = conn.execute(
            "SELECT count(*), count(DISTINCT j.idempotency_key), "
            "count(*) FILTER (WHERE j.id = ANY(%s::uuid[])), "
            "count(*) FILTER (WHERE j.idempotency_key = ANY(%s)) "
            "FROM jobs j JOIN auth_user u ON u.id = j.owner_id "
            "WHERE u.username LIKE 'bench-burst-%%'",
            [accepted_ids, refused_keys],
        ).fetchone()
    total, distinct_keys, found, from_refused = rows
    report.check(
        "rows_once",
        label="every accepted job exists once",
        ok=total == distinct_keys == found == len(accepted) and from_refused == 0,
        detail=f"{len(accepted)} accepted, {total} rows, {distinct_keys} keys, "
        f"{found} accepted ids found, {from_refused} rows from refused keys",
    )
    counts = status_counts(scratch, accepted_ids)
    client = redis.Redis.from_url(scratch.redis_url)
    runs = {k.decode(): int(v) for k, v in client.hgetall(runs_key).items()}
    client.close()
    report.check(
        "ran_once",
        label="every accepted job succeeded and ran once",
        ok=counts == {"succeeded": len(accepted)}
        and set(runs) == set(accepted_ids)
        and set(runs.values()) == {1},
        detail=f"statuses {counts}, handler runs {sum(runs.values())} for {len(runs)} jobs, "
        f"more than once: {sum(1 for n in runs.values() if n > 1)}",
    )


def main() -> int:
    parser = common.parser_for(__doc__)
    parser.add_argument("--requests", type=int, help="concurrent POSTs [1000]")
    parser.add_argument("--users", type=int, help="users sending them [5]")
    parser.add_argument("--per-user", type=int, default=60, help="per-user limit per minute")
    parser.add_argument("--global-limit", type=int, default=500, help="global limit per minute")
    args, report = common.prepare(NAME, parser, full=FULL, quick=QUICK)
    with common.Scratch(NAME, keep=args.keep) as scratch:
        scratch.setup_django()
        users = [f"bench-burst-{n}" for n in range(1, args.users + 1)]
        tokens = {user: user_token(bench_user(user)) for user in users}
        runs_key = f"{scratch.redis_prefix}:runs"
        env = scratch.env(
            JOBOPS_RATE_LIMITS=json.dumps(
                {
                    "create_per_user": args.per_user,
                    # Its users share one organisation: its limit must not bind first.
                    "create_per_org": args.global_limit,
                    "create_global": args.global_limit,
                    "admin_dlq": 30,
                }
            ),
            JOBOPS_HANDLERS=json.dumps({JOB_TYPE: "bench._handlers.count_run"}),
            BENCH_RUNS_KEY=runs_key,
        )
        # The probe is a GET: it must not spend a token of the buckets under test.
        _web, base = common.start_gunicorn(
            bench=NAME,
            env=env,
            workers=4,
            probe="/api/v1/jobs",
            headers={"Authorization": f"Token {tokens[users[0]]}"},
        )
        dispatchers = common.start_dispatchers(bench=NAME, env=env)
        worker = common.start_worker(bench=NAME, env=env, queues=QUEUE)

        burst = [
            Sent(user=users[i % len(users)], key=uuid.uuid4().hex) for i in range(args.requests)
        ]
        started = time.monotonic()
        asyncio.run(post_all(base, burst, tokens))
        seconds = time.monotonic() - started
        statuses: dict[int, int] = {}
        for r in burst:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        refused = [r for r in burst if r.status == 429]
        report.figure("burst_seconds", round(seconds, 2), "s", f"{args.requests} concurrent POSTs")
        report.figure("accepted", statuses.get(201, 0), "201")
        report.figure("refused", statuses.get(429, 0), "429")
        report.extra("statuses", statuses)
        report.extra(
            "latency_ms",
            {
                str(code): common.latency_summary(
                    [(r.answered - r.sent) * 1000 for r in burst if r.status == code]
                )
                for code in statuses
            },
        )
        report.check(
            "only_201_429",
            label="every answer 201 or 429",
            ok=set(statuses) <= {201, 429},
            detail=str(statuses),
        )
        check_buckets(report, scratch, burst, users, (args.per_user, args.global_limit))
        report.check(
            "retry_after",
            label="every 429 has Retry-After >= 1",
            ok=all((r.retry_after or 0) >= 1 for r in refused),
            detail=f"Retry-After values {sorted({r.retry_after for r in refused}, key=str)}",
        )
        retries = retry_refused(base, burst, tokens)
        report.check(
            "retry_accepted",
            label="a retry after Retry-After is accepted",
            ok=all(r.status == 201 for r in retries),
            detail=f"{sum(r.status == 201 for r in retries)} of {len(retries)} retries got 201",
        )
        accepted = sum(1 for r in [*burst, *retries] if r.status == 201)
        wait_for_status(
            scratch,
            count=accepted,
            statuses=("succeeded", "failed", "cancelled"),
            timeout=900,
            what="the accepted jobs to finish",
            watch=[worker, *dispatchers.values()],
        )
        check_jobs(report, scratch, burst, retries, runs_key)
        report.write(scratch)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
