"""The operator dashboard's figures: is the system healthy, and if not, where?

One read for the whole page, computed at most every JOBOPS_DASHBOARD_CACHE_SECONDS and
shared by every viewer (the page refreshes itself every few seconds, on every open
laptop). Its cost does not grow with the jobs table: two statements over partial or
time-bounded indexes for the jobs, one for the health gauges, two over dead letters,
one broker channel for the depths, one Redis scan for the live processes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import structlog
from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from core.broker import queue_depths
from dlq.broker import BROKER_ERRORS
from dlq.selectors import open_counts_by_queue
from jobs.liveness import live_processes, missing_processes
from jobs.models import DeadLetter
from jobs.selectors import job_counts_by_queue, job_health_gauges
from jobs.topology import dlq_name
from jobs.types import primary_queue_names

log = structlog.get_logger("dlq.dashboard")

CACHE_KEY = "portal:dashboard:v1"
FAILURE_WINDOW_HOURS = 24
UNFINISHED = ("pending", "queued", "running", "retrying")
FINISHED = ("succeeded", "failed", "cancelled")
# Thresholds at which the dashboard calls something a problem (seconds).
OUTBOX_LAG_WARN = 60.0
PENDING_AGE_WARN = 60.0


def dashboard_overview(*, use_cache: bool = True) -> dict[str, Any]:
    """The dashboard's figures, from the cache when fresh (see the module docstring)."""
    seconds = float(settings.JOBOPS_DASHBOARD_CACHE_SECONDS)
    if use_cache and seconds > 0:
        try:
            cached = cache.get(CACHE_KEY)
        except Exception:  # Redis away: compute it, the page must show
            cached = None
        if cached is not None:
            return cached
    overview = _compute()
    if use_cache and seconds > 0:
        try:
            cache.set(CACHE_KEY, overview, seconds)
        except Exception as exc:
            log.warning("dashboard_not_cached", error=repr(exc))
    return overview


def _compute() -> dict[str, Any]:
    """1. Per-queue job counts; 2. health gauges; 3. dead letters: open per queue and
    the last 24 hours' failures by cause; 4. broker depths; 5. live processes;
    6. the problems worth a look, in words."""
    counts = job_counts_by_queue(finished_hours=FAILURE_WINDOW_HOURS)
    health = job_health_gauges()
    open_rows = open_counts_by_queue()
    depths, broker_error = _depths()
    processes, liveness_error = _liveness()
    queues = []
    for name in primary_queue_names():
        row = counts.get(name, {})
        unfinished = row.get("unfinished", {})
        queues.append(
            {
                "queue": name,
                "dlq": dlq_name(name),
                "unfinished": {s: unfinished.get(s, 0) for s in UNFINISHED},
                "finished": {s: row.get("finished", {}).get(s, 0) for s in FINISHED},
                "oldest_pending_seconds": row.get("oldest_pending_seconds"),
                "stale_locks": row.get("stale_locks", 0),
                "retries_waiting": unfinished.get("retrying", 0),
                "retries_due": row.get("retries_due", 0),
                "depth": depths.get(name),
                "dlq_depth": depths.get(dlq_name(name)),
                "open_dead_letters": open_rows.get(dlq_name(name), 0),
                "workers": _workers_for(name, processes),
            }
        )
    overview = {
        "generated_at": timezone.now(),
        "queues": queues,
        "health": {
            **health,
            "broker_error": broker_error,
            "liveness_error": liveness_error,
            "dispatchers": None if processes is None else len(processes.get("dispatcher", [])),
            "open_dead_letters": sum(open_rows.values()),
        },
        "failures": failures_by_cause(hours=FAILURE_WINDOW_HOURS),
    }
    overview["problems"] = _problems(overview, processes)
    return overview


def failures_by_cause(*, hours: int = FAILURE_WINDOW_HOURS) -> list[dict[str, Any]]:
    """Dead letters recorded in the last `hours`, by queue, error code and reason, the
    biggest cause first ("47 x TRANSIENT_EXTERNAL in erp_dlq since 02:10")."""
    since = timezone.now() - timedelta(hours=hours)
    groups = (
        DeadLetter.objects.filter(created_at__gte=since)
        .values("queue", "error_code", "reason")
        .annotate(
            count=Count("id"),
            open=Count("id", filter=Q(state="open")),
            first_at=Min("created_at"),
            last_at=Max("created_at"),
        )
        .order_by("-count", "queue", "error_code")
    )
    return [{**g, "since": since} for g in groups[:20]]


def _depths() -> tuple[dict[str, int | None], str | None]:
    names = primary_queue_names()
    try:
        return queue_depths([*names, *(dlq_name(n) for n in names)]), None
    except BROKER_ERRORS as exc:  # the page must render with the broker down
        log.warning("dashboard_depths_unavailable", error=repr(exc))
        return {}, f"RabbitMQ unreachable: {exc}"


Processes = dict[str, list[dict[str, Any]]]


def _liveness() -> tuple[Processes | None, str | None]:
    try:
        return live_processes(), None
    except Exception as exc:  # Redis away: say we do not know, not "nobody is alive"
        return None, f"Redis unreachable: {exc}"


def _workers_for(queue: str, processes: Processes | None) -> int | None:
    if processes is None:
        return None
    return sum(1 for w in processes.get("worker", []) if queue in w.get("queues", []))


def _problems(overview: dict[str, Any], processes: Processes | None) -> list[str]:
    """What an operator should look at first, in plain words, worst first."""
    health = overview["health"]
    problems = []
    if health["broker_error"]:
        problems.append(health["broker_error"])
    if processes is None:
        problems.append(health["liveness_error"])
    else:
        missing = missing_processes(processes)
        if "dispatcher" in missing:
            problems.append("No live dispatcher: nothing is published, reaped or relayed.")
        queues = [m.removeprefix("worker for queue ") for m in missing if m != "dispatcher"]
        if queues:
            problems.append(
                f"No live worker for queue{'s' if len(queues) > 1 else ''} {', '.join(queues)}."
            )
    stale = sum(q["stale_locks"] for q in overview["queues"])
    if stale:
        problems.append(f"{stale} running job(s) with a stale lock (their worker stopped).")
    if health["outbox_lag_seconds"] > OUTBOX_LAG_WARN:
        problems.append(f"Event outbox lags {health['outbox_lag_seconds']:.0f} s.")
    if health["oldest_pending_seconds"] > PENDING_AGE_WARN:
        problems.append(f"A job has waited {health['oldest_pending_seconds']:.0f} s to publish.")
    checkpoint_age = health["checkpoint_age_seconds"]
    if checkpoint_age is not None and checkpoint_age > 3 * settings.AUDIT_CHECKPOINT_SECONDS:
        problems.append(f"The last audit checkpoint is {checkpoint_age:.0f} s old.")
    if health["open_dead_letters"]:
        problems.append(f"{health['open_dead_letters']} open dead letter(s) wait for a decision.")
    return problems
