"""A thousand concurrent creates under the real rate limits (Task 6.10; the `burst`
benchmark, bench/burst.py, measures the same with a worker running the jobs).

A live gunicorn (4 workers, 8 threads each) under docs/api.md#rate-limits' limits (60 a
minute per user, 500 overall). 1,000 `POST /api/v1/jobs` are sent at once, one
connection each: 5 users, 200 requests each, every idempotency key twice. Then:

- every answer is 201, 200 (a repeat) or 429; every 429 is `ERR-JOB-RATE-LIMIT` with a
  `Retry-After` of at least 1 second, and each user's bucket let through its allowance
  (60, plus what refilled while the burst lasted), no more;
- one job per key: every 201 and 200 names a job that exists, owned by its sender, under
  its key; both answers of one key name one job; there are exactly as many jobs as
  accepted keys and as 201s, and no key refused both times made a job: nothing lost,
  nothing doubled.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from dataclasses import dataclass

import httpx
import pytest
from rest_framework.authtoken.models import Token

from jobs.models import Job
from tests.e2e.live_api import gunicorn_server
from tests.factories import UserFactory

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_redis"),
]

USERS, PER_USER_REQUESTS = 5, 200
PER_USER, GLOBAL = 60, 500  # docs/api.md#rate-limits
BODY = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}


@dataclass
class Sent:
    user: int
    key: str
    status: int = 0
    job_id: str | None = None
    retry_after: str | None = None
    error: dict | None = None


async def _post_all(base: str, sent: list[Sent], tokens: dict[int, str]) -> None:
    limits = httpx.Limits(max_connections=len(sent), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as client:

        async def one(request: Sent) -> None:
            response = await client.post(
                "/api/v1/jobs",
                json={**BODY, "idempotency_key": request.key},
                headers={"Authorization": f"Token {tokens[request.user]}"},
            )
            request.status = response.status_code
            body = response.json()
            if response.status_code in (200, 201):
                request.job_id = body["id"]
            else:
                request.error = body.get("error")
                request.retry_after = response.headers.get("Retry-After")

        await asyncio.gather(*(one(r) for r in sent))


def test_a_thousand_concurrent_creates_make_one_job_per_key_under_the_limits():
    users = [UserFactory() for _ in range(USERS)]
    tokens = {user.pk: Token.objects.create(user=user).key for user in users}
    # Each key twice, the second copy sent with the rest at once: a repeat races its first.
    keys = {user.pk: [uuid.uuid4().hex for _ in range(PER_USER_REQUESTS // 2)] for user in users}
    sent = [Sent(user=pk, key=key) for pk in keys for key in keys[pk] * 2]
    limits = {"create_per_user": PER_USER, "create_per_org": GLOBAL, "create_global": GLOBAL}
    env = {"JOBOPS_TEST_RATE_LIMITS": json.dumps(limits)}

    with gunicorn_server(workers=4, threads=8, env=env) as base:
        started = time.monotonic()
        asyncio.run(_post_all(base, sent, tokens))
        seconds = time.monotonic() - started

    statuses = {s.status for s in sent}
    assert statuses <= {200, 201, 429}, sorted(statuses)
    refused = [s for s in sent if s.status == 429]
    for refusal in refused:
        assert refusal.error and refusal.error["code"] == "ERR-JOB-RATE-LIMIT", refusal
        assert refusal.retry_after and int(refusal.retry_after) >= 1, refusal
    # Every POST counts, repeats included (docs/api.md#rate-limits): each user's bucket
    # let through 60 and what refilled (one a second) while the burst lasted, and no
    # more; 200 requests each is far over that, so every user was refused some.
    most = PER_USER + math.ceil(seconds * PER_USER / 60) + 1
    for pk in keys:
        answered = [s for s in sent if s.user == pk and s.status in (200, 201)]
        assert PER_USER <= len(answered) <= most, (pk, len(answered), most, seconds)
        assert any(s.user == pk for s in refused)

    accepted = [s for s in sent if s.status in (200, 201)]
    accepted_keys = {(s.user, s.key) for s in accepted}
    jobs = {
        str(job_id): (owner, key)
        for job_id, owner, key in Job.objects.filter(owner__in=users).values_list(
            "id", "owner_id", "idempotency_key"
        )
    }
    # Nothing lost: every accepted answer names a job made by its sender under its key.
    for answer in accepted:
        assert jobs.get(str(answer.job_id)) == (answer.user, answer.key), answer
    # One job per key: both answers of a key name one job, and no key has two rows.
    named = {(s.user, s.key): set() for s in accepted}
    for answer in accepted:
        named[(answer.user, answer.key)].add(answer.job_id)
    assert all(len(ids) == 1 for ids in named.values())
    assert len(set(jobs.values())) == len(jobs)
    # Exactly as many jobs as accepted keys and as 201s; a key refused twice made none.
    assert len(jobs) == len(accepted_keys) == sum(s.status == 201 for s in sent)
    assert set(jobs.values()) == accepted_keys
