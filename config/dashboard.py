"""The operator dashboard's figures: is the system healthy, and if not, where?

It reads jobs, dead letters, the broker and the live processes at once, so it sits in
the top layer, beside the admin site whose index it is (config/admin_site.py).

One read for the whole page, computed at most every JOBOPS_DASHBOARD_CACHE_SECONDS and
shared by every viewer (the page refreshes itself every few seconds, on every open
laptop). Its cost does not grow with the jobs table: two statements over partial or
time-bounded indexes for the jobs, one for the health gauges, two over dead letters,
one broker channel for the depths, one scan of the key-value store for the live
processes. Without a broker (JOBOPS_BROKER off) there are no broker depths: the page
shows the jobs' own counts, and no broker trouble.

The shared snapshot (in the cache: Redis, or core/kv.py's table with JOBOPS_REDIS off;
read by every web process on every host) holds only what
is the same wherever it is read: the database's figures, the live processes, and the
broker depths when they were read. Whether RabbitMQ answers is not such a fact: a web
process with a wrong BROKER_URL (or a host cut off from the broker) would otherwise show
its own trouble on every healthy node's dashboard. So each process checks the broker
itself, at most every JOBOPS_DASHBOARD_CACHE_SECONDS, and the page says which host saw
what (`node`).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from core.broker import queue_depths
from dlq.broker import BROKER_ERRORS
from dlq.selectors import dead_letters_in_orgs, open_counts_by_queue
from jobs.domain.types import POSTGRES, primary_queue_names, queue_executor
from jobs.integrations.liveness import live_processes, missing_processes, workers_of
from jobs.integrations.topology import dlq_name
from jobs.models import DeadLetter
from jobs.processes.step_failures import step_failures
from jobs.selectors import job_counts_by_queue, job_health_gauges, purge_last
from jobs.selectors.stragglers import audit_stragglers, straggler_lines
from jobs.services.purge import kept_lines

# The name it logged under in dlq/: log queries and alerts keep matching its lines.
log = structlog.get_logger("dlq.dashboard")

# v2: the snapshot no longer carries one node's broker status (see the module docstring).
CACHE_KEY = "portal:dashboard:v2"
FAILURE_WINDOW_HOURS = 24
UNFINISHED = ("pending", "queued", "running", "retrying")
FINISHED = ("succeeded", "failed", "cancelled")
# Thresholds at which the dashboard calls something a problem (seconds).
OUTBOX_LAG_WARN = 60.0
PENDING_AGE_WARN = 60.0


def dashboard_overview(
    *, use_cache: bool = True, org_ids: tuple[int, ...] | None = None
) -> dict[str, Any]:
    """The dashboard's figures as this web process sees them: the shared snapshot (from
    the cache when fresh) with this node's own view of the broker laid over it.

    `org_ids`: the figures of those organisations only (the dashboard's organisation
    filter, and a limited operator's view); None: all of them. A filtered snapshot has
    no broker depths (a queue's depth counts every tenant's messages) and is cached
    under its own key, per set of organisations."""
    seconds = float(settings.JOBOPS_DASHBOARD_CACHE_SECONDS)
    caching = use_cache and seconds > 0
    key = CACHE_KEY if org_ids is None else f"{CACHE_KEY}:orgs:{','.join(map(str, org_ids))}"
    shared = None
    if caching:
        try:
            shared = cache.get(key)
        except Exception:  # cache away: compute it, the page must show
            shared = None
    if shared is not None:
        return _with_node_view(shared, _node_broker_view(max_age=seconds))
    shared, seen = _compute(org_ids=org_ids)
    _remember_broker_view(seen)
    if caching:
        try:
            cache.set(key, shared, seconds)
        except Exception as exc:
            log.warning("dashboard_not_cached", error=repr(exc))
    return _with_node_view(shared, seen)


@dataclass(frozen=True)
class BrokerView:
    """What one web process saw of RabbitMQ: the depths it read, or why it could not."""

    broker_url: str
    host: str
    checked_at: float  # time.monotonic() of this process
    depths: dict[str, int | None] | None
    error: str | None


_views_lock = threading.Lock()
# This process's last look at each broker URL (the URL: a test, or a reconfigured
# process, pointing elsewhere must not reuse the old answer).
_views: dict[str, BrokerView] = {}


def _node_broker_view(*, max_age: float) -> BrokerView:
    """This process's view of the broker, read again when older than `max_age`."""
    with _views_lock:
        view = _views.get(settings.BROKER_URL)
    if view is None or time.monotonic() - view.checked_at >= max_age:
        view = _read_broker()
        _remember_broker_view(view)
    return view


def _remember_broker_view(view: BrokerView) -> None:
    with _views_lock:
        _views[view.broker_url] = view


def _read_broker() -> BrokerView:
    names = primary_queue_names()
    depths: dict[str, int | None] | None = None
    error = None
    if not settings.JOBOPS_BROKER:  # nothing to read, and nothing wrong
        return BrokerView(settings.BROKER_URL, socket.gethostname(), time.monotonic(), None, None)
    try:
        depths = queue_depths([*names, *(dlq_name(n) for n in names)])
    except BROKER_ERRORS as exc:  # the page must render with the broker down
        log.warning("dashboard_depths_unavailable", error=repr(exc))
        error = str(exc) or type(exc).__name__
    return BrokerView(
        broker_url=settings.BROKER_URL,
        host=socket.gethostname(),
        checked_at=time.monotonic(),
        depths=depths,
        error=error,
    )


def _with_node_view(shared: dict[str, Any], view: BrokerView) -> dict[str, Any]:
    """The page's figures: the shared snapshot, its missing depths filled from this
    node's own read, and this node's broker trouble named as this node's (a snapshot
    filtered by organisation shows no depths: they count every tenant's messages)."""
    depths = shared["depths"] if shared["depths"] is not None else view.depths
    if shared.get("org_ids") is not None:
        depths = None
    broker_error = None
    if view.error is not None:
        broker_error = f"RabbitMQ unreachable from web node {view.host}: {view.error}"
    queues = [
        {
            **q,
            "depth": None if depths is None else depths.get(q["queue"]),
            "dlq_depth": None if depths is None else depths.get(q["dlq"]),
        }
        for q in shared["queues"]
    ]
    problems = [broker_error] if broker_error else []
    return {
        **shared,
        "queues": queues,
        "health": {**shared["health"], "broker_error": broker_error},
        "node": {"host": view.host, "broker_error": broker_error},
        "problems": problems + shared["problems"],
    }


def _compute(*, org_ids: tuple[int, ...] | None = None) -> tuple[dict[str, Any], BrokerView]:
    """The shared snapshot, and this node's broker view read on the way.

    1. Per-queue job counts; 2. health gauges; 3. dead letters: open per queue and the
    last 24 hours' failures by cause; 4. broker depths (kept only when read); 5. live
    processes; 6. the problems worth a look, in words (the broker's are added per node).
    With `org_ids`, 1 and 3 count those organisations' jobs only, and the gauges that
    count jobs (oldest pending, stale locks) come from their queues' figures; the
    system's own (outbox, checkpoint, live processes) stay as they are.
    """
    counts = job_counts_by_queue(finished_hours=FAILURE_WINDOW_HOURS, org_ids=org_ids)
    health = job_health_gauges()
    open_rows = open_counts_by_queue(org_ids=org_ids)
    seen = _read_broker()
    processes, liveness_error = _liveness()
    failing = _failing_steps()
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
                "open_dead_letters": open_rows.get(dlq_name(name), 0),
                "workers": _workers_for(name, processes),
                # Its jobs never go through the broker (docs/postgres-executor.md): no
                # broker depths to show, rather than unknown ones.
                "on_postgres": queue_executor(name) == POSTGRES,
            }
        )
    if org_ids is not None:
        pending = [q["oldest_pending_seconds"] or 0.0 for q in queues]
        health["oldest_pending_seconds"] = max(pending, default=0.0)
        health["stale_locks"] = float(sum(q["stale_locks"] for q in queues))
    overview: dict[str, Any] = {
        "generated_at": timezone.now(),
        "org_ids": org_ids,
        "broker": settings.JOBOPS_BROKER,  # off: the page has no broker columns at all
        "queues": queues,
        # The same for every node that reads the same broker; None when not read (or
        # filtered by organisation).
        "depths": seen.depths if org_ids is None else None,
        "health": {
            **health,
            "liveness_error": liveness_error,
            "dispatchers": None if processes is None else len(processes.get("dispatcher", [])),
            "open_dead_letters": sum(open_rows.values()),
        },
        "failures": failures_by_cause(hours=FAILURE_WINDOW_HOURS, org_ids=org_ids),
        # When the purge last looked, and what its last run removed (one row; its
        # counts are every tenant's, so a filtered view leaves it out).
        "purge": purge_last() if org_ids is None else None,
        # Jobs that hold an audit partition past its retention (jobs/selectors/
        # stragglers.py), for an operator's decision; every tenant's, as the purge's.
        "audit_stragglers": audit_stragglers() if org_ids is None else None,
        # Dispatcher steps failing now (jobs/processes/step_failures.py): the system's own, shown
        # in every view; the purge's also on its tile.
        "failing_steps": failing,
        "purge_failure": next((f for f in failing if f["step"] == "purge"), None),
    }
    overview["problems"] = _problems(overview, processes)
    return overview, seen


def _failing_steps() -> list[dict[str, Any]]:
    """The failing dispatcher steps, their times as datetimes; [] when the key-value
    store does not answer (the liveness line already says so)."""
    try:
        found = step_failures()
    except Exception as exc:
        log.warning("dashboard_step_failures_unavailable", error=repr(exc))
        return []
    return [
        f
        | {
            "since": datetime.fromtimestamp(f["since"], tz=UTC),
            "at": datetime.fromtimestamp(f["at"], tz=UTC),
        }
        for f in found
    ]


def failures_by_cause(
    *, hours: int = FAILURE_WINDOW_HOURS, org_ids: tuple[int, ...] | None = None
) -> list[dict[str, Any]]:
    """Dead letters recorded in the last `hours`, by queue, error code and reason, the
    biggest cause first ("47 x TRANSIENT_EXTERNAL in erp_dlq since 02:10"); of the
    organisations `org_ids` only, when given."""
    since = timezone.now() - timedelta(hours=hours)
    recent = DeadLetter.objects.filter(created_at__gte=since)
    groups = (
        dead_letters_in_orgs(recent, org_ids=org_ids)
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


Processes = dict[str, list[dict[str, Any]]]


def _liveness() -> tuple[Processes | None, str | None]:
    try:
        return live_processes(), None
    except Exception as exc:  # store away: say we do not know, not "nobody is alive"
        store = "Redis" if settings.JOBOPS_REDIS else "The key-value store"
        return None, f"{store} unreachable: {exc}"


def _workers_for(queue: str, processes: Processes | None) -> int | None:
    if processes is None:
        return None
    return sum(1 for w in workers_of(processes) if queue in w.get("queues", []))


def _problems(overview: dict[str, Any], processes: Processes | None) -> list[str]:
    """What an operator should look at first, in plain words, worst first (a node's
    broker trouble goes before these, added by `_with_node_view`)."""
    health = overview["health"]
    problems = []
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
    for f in overview["failing_steps"]:
        times = "once" if f["count"] == 1 else f"{f['count']} times"
        problems.append(
            f"Dispatcher step {f['step']} is failing: {f['error']}: {f['message']} "
            f"({times} since {f['since']:%H:%M:%S} UTC, last {f['at']:%H:%M:%S} UTC, "
            f"on {', '.join(f['hosts'])})."
        )
    kept = (overview["purge"] or {}).get("kept") or {}
    for line in kept_lines(kept):
        problems.append(f"Purge {line}.")
    for line in straggler_lines(overview.get("audit_stragglers") or {"total": 0, "stragglers": []}):
        problems.append(f"Audit straggler: {line}.")
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
    if health["erp_events_parked"]:
        problems.append(
            f"{health['erp_events_parked']} ERP event(s) the receiver refused are parked: "
            "manage.py erp_parked list."
        )
    return problems
