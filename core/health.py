"""`/healthz` and `/readyz`, answered before any other middleware.

Probes come from load balancers and orchestrators: they carry no credentials, often
a Host header that is an IP (not in ALLOWED_HOSTS) and plain HTTP behind the TLS
proxy, and they arrive every few seconds. So `HealthMiddleware` sits first in
MIDDLEWARE and answers these two paths itself: no host check, no SSL redirect, no
request log line, no rate limit, no session.

- `/healthz`: the process answers; touches nothing.
- `/readyz`: PostgreSQL, RabbitMQ and Redis each reachable within
  JOBOPS_READY_TIMEOUT_SECONDS, checked side by side (so the probe takes at most
  about one timeout; per node of a broker cluster, tried in turn); 503 naming each one
  that is not. The RabbitMQ check names the node it reached (`checks.rabbitmq.node`).
  RabbitMQ and Redis are checked only where they are configured: with JOBOPS_BROKER or
  JOBOPS_REDIS off they are not, and the body lists them under `off`. The answer is
  kept for JOBOPS_READY_CACHE_SECONDS so a probe storm costs one check per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import psycopg
import redis
import structlog
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.module_loading import import_string

from core.broker import broker_connect, broker_connect_now, broker_node
from core.queries import QUERIES

log = structlog.get_logger("core.health")

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"


def _check_postgres(timeout: float) -> None:
    # A new connection, not Django's: a persistent one can look fine while the server
    # is unreachable for everyone else, and a blackholed host must fail in `timeout`.
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params["connect_timeout"] = max(1, round(timeout))  # libpq takes whole seconds
    with psycopg.connect(**params) as conn:
        conn.execute(QUERIES["ping"])


def _check_rabbitmq(timeout: float) -> dict[str, Any]:
    # Every node of BROKER_URL in turn, as the process's own connections fail over: ready
    # while one answers, and the detail names the node this process reaches.
    with broker_connect_now(broker_connect(timeout=timeout)) as conn:
        return {"node": broker_node(conn)}


def _check_redis(timeout: float) -> None:
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        client.ping()
    finally:
        client.close()


# Each raises when its service is unreachable; a dict it returns joins its detail.
CHECKS: dict[str, Callable[[float], dict[str, Any] | None]] = {
    "postgres": _check_postgres,
    "rabbitmq": _check_rabbitmq,
    "redis": _check_redis,
}


def configured_checks() -> tuple[dict[str, Callable[[float], dict[str, Any] | None]], list[str]]:
    """The checks this deployment needs, and the services it runs without."""
    off = [
        name
        for name, enabled in (
            ("rabbitmq", settings.JOBOPS_BROKER),
            ("redis", settings.JOBOPS_REDIS),
        )
        if not enabled
    ]
    return {name: check for name, check in CHECKS.items() if name not in off}, off


_pool = ThreadPoolExecutor(max_workers=len(CHECKS), thread_name_prefix="readyz")
_cache_lock = threading.Lock()
_cache: tuple[float, dict[str, Any]] | None = None


def readiness() -> dict[str, Any]:
    """Check each configured dependency side by side; `{"ready": bool, "checks": {name:
    {...}}, "off": [names]}` (`off` only when a service is turned off)."""
    timeout = settings.JOBOPS_READY_TIMEOUT_SECONDS
    started = time.monotonic()
    checks_to_run, off = configured_checks()
    futures = {name: _pool.submit(check, timeout) for name, check in checks_to_run.items()}
    checks: dict[str, dict[str, Any]] = {}
    for name, future in futures.items():
        remaining = max(0.0, timeout + 0.5 - (time.monotonic() - started))
        try:
            checks[name] = {"ok": True, **(future.result(timeout=remaining) or {})}
        except FutureTimeout:
            checks[name] = {"ok": False, "error": f"no answer within {timeout:g}s"}
        except Exception as exc:  # any failure to reach it is the answer, not a 500
            checks[name] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    result: dict[str, Any] = {"ready": all(c["ok"] for c in checks.values()), "checks": checks}
    if off:
        result["off"] = off
    if checks["postgres"]["ok"]:
        result.update(_detail())
    return result


def _detail() -> dict[str, Any]:
    """The apps' additions to the detail (JOBOPS_READY_DETAIL: e.g. the paused queues);
    one that fails is logged and left out: detail never decides readiness."""
    detail: dict[str, Any] = {}
    for path in settings.JOBOPS_READY_DETAIL:
        try:
            detail.update(import_string(path)())
        except Exception as exc:
            log.warning("ready_detail_failed", source=path, error=repr(exc))
    return detail


def cached_readiness() -> dict[str, Any]:
    global _cache
    now = time.monotonic()
    with _cache_lock:
        if _cache and now - _cache[0] < settings.JOBOPS_READY_CACHE_SECONDS:
            return _cache[1]
    result = readiness()
    with _cache_lock:
        _cache = (time.monotonic(), result)
    return result


def _json(body: dict[str, Any], status: int) -> JsonResponse:
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"
    # Django logs every 4xx/5xx on `django.request`; a failing probe every few seconds
    # would drown the log, and `not_ready` below already says what is down.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class HealthMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path == HEALTH_PATH:
            return _json({"status": "ok"}, 200)
        if request.path == READY_PATH:
            result = cached_readiness()
            if not result["ready"]:
                failing = sorted(n for n, c in result["checks"].items() if not c["ok"])
                log.warning("not_ready", failing=failing)
                return _json(
                    {
                        "status": "unavailable",
                        "error": {
                            "code": "ERR-READY-503",
                            "message": f"Not reachable: {', '.join(failing)}.",
                            "details": result["checks"],
                        },
                    },
                    503,
                )
            detail = {k: v for k, v in result.items() if k not in ("ready", "checks")}
            return _json({"status": "ok", "checks": result["checks"], **detail}, 200)
        return self.get_response(request)
