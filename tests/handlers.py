"""Test-only handlers, wired into worker subprocesses through JOBOPS_HANDLERS.

`scripted` does what its params say (`{"do": ..., ...}`), so one worker serves many
tests. Every run is recorded in Redis (`runs`) and holds a PostgreSQL session advisory
lock on its job while it runs: a second run of the same job at the same time cannot
take it and is recorded in `overlaps` (so tests can prove a job never ran twice at
once). `ScriptParams` is the params serializer tests put in place of a type's own
(see `scripted_types` in tests/e2e/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection
from rest_framework import serializers

from jobs.domain.errors import FatalError, JobValidationError, TransientExternalError

SCRIPTED = "tests.handlers.scripted"


class ScriptParams(serializers.Serializer):
    do = serializers.CharField()

    def to_internal_value(self, data: Any) -> Any:
        super().to_internal_value(data)
        return data  # keep every key: the script's arguments


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)


def key(job_id: Any, what: str) -> str:
    return f"jobops-test:{job_id}:{what}"


def runs(job_id: Any) -> list[dict[str, Any]]:
    return [json.loads(r) for r in redis_client().lrange(key(job_id, "runs"), 0, -1)]


def soft_limit_caught(job_id: Any) -> str | None:
    """The class name of the soft time limit a `catch_soft_limit` run caught, if any."""
    return redis_client().get(key(job_id, "soft_limit_caught"))


def overlaps(job_id: Any) -> int:
    return int(redis_client().get(key(job_id, "overlaps")) or 0)


def scripted(ctx: Any, params: dict[str, Any]) -> dict[str, Any] | None:
    r = redis_client()
    lock_id = int(ctx.job_id.int % (2**63))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [lock_id])
        exclusive = cursor.fetchone()[0]
    if not exclusive:
        r.incr(key(ctx.job_id, "overlaps"))
    r.rpush(
        key(ctx.job_id, "runs"),
        json.dumps({"pid": os.getpid(), "attempt": ctx.attempt, "t": time.time()}),
    )
    try:
        return _act(ctx, params, r)
    finally:
        if exclusive:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [lock_id])
            except Exception:  # the database went away (a test's doing); the session lock too
                pass


def _act(ctx: Any, params: dict[str, Any], r: redis.Redis) -> dict[str, Any] | None:
    do = params["do"]
    if do == "noop":
        return {"ok": True}
    if do == "count":  # one more run of this job in the hash params["counter"]
        r.hincrby(params["counter"], str(ctx.job_id), 1)
        return {"ok": True}
    if do == "fail_times":  # retryable failures on the first n attempts, then success
        if ctx.attempt <= int(params["n"]):
            raise TransientExternalError(f"planned failure {ctx.attempt}", code="PLANNED")
        return {"ok": True, "attempt": ctx.attempt}
    if do == "bad_result":  # a result that cannot be stored (NaN, deep, NUL, ...)
        value = {"nan": float("nan"), "nul": "a\x00b"}.get(params.get("kind", "nan"))
        if params.get("kind") == "deep":
            value = []
            for _ in range(100):
                value = [value]
        return {"value": value}
    if do == "crash":  # an unexpected exception: retryable by the taxonomy
        raise RuntimeError("unexpected")
    if do == "fatal":
        raise FatalError("planned fatal error", code="PLANNED_FATAL")
    if do == "nonretryable":
        raise JobValidationError("planned validation error", code="PLANNED_INVALID")
    if do == "kill":  # the worker process dies (kill -9) every time
        os.kill(os.getpid(), signal.SIGKILL)
    if do == "sleep_past_hard_limit":  # ignores the soft limit, so the hard one fires
        deadline = time.monotonic() + float(params.get("seconds", 60))
        while time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except SoftTimeLimitExceeded:
                continue
        return {"slept": True}
    if do == "catch_soft_limit":  # catches its soft time limit, records it, succeeds
        try:
            time.sleep(float(params.get("seconds", 60)))
        except SoftTimeLimitExceeded as exc:  # celery.exceptions', under both executors
            r.set(key(ctx.job_id, "soft_limit_caught"), type(exc).__name__)
            return {"caught": True}
        return {"caught": False}
    if do == "sleep":  # a soft time limit interrupts this
        time.sleep(float(params.get("seconds", 60)))
        return {"slept": True}
    if do == "steps":  # slow steps with progress and cancellation points
        steps = int(params.get("steps", 10))
        for step in range(1, steps + 1):
            ctx.check_cancel()
            r.set(key(ctx.job_id, "step"), step)
            time.sleep(float(params.get("step_seconds", 0.2)))
            ctx.progress(100 * step // steps, step=f"{step}/{steps}")
        return {"steps": steps}
    if do == "wait_then":  # block until the test sets the `go` key, then act on `then`
        while not r.get(key(ctx.job_id, "go")):
            time.sleep(0.05)
        return _act(ctx, {**params, "do": params["then"]}, r)
    if do == "wait_signal":  # report started, block until `go`, keep writing progress
        r.set(key(ctx.job_id, "started"), ctx.attempt)
        while not r.get(key(ctx.job_id, "go")):
            time.sleep(0.05)
        ctx.progress(50, step="after go")
        ctx.save_artefact("out", "a.txt", b"late")
        return {"ok": True}
    raise ValueError(f"unknown script {do!r}")
