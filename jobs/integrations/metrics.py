"""Prometheus metrics of docs/operations/observability.md#metrics, as module-level objects.

Counters and histograms are incremented where the work happens (services, workers,
DLQ tools, the relay); the gauges an on-call alert needs are derived from the database
by `metrics_refresh_gauges()`, which the `/metrics` view runs at each scrape (and the
dispatcher may run each loop). The job counters carry `job_type` and `queue` from the
types table (`jobs_labels`); the names they replace stay one release, deprecated
(DEPRECATED_NAMES). The S3 metrics are observed by the S3 artefact storage alone
(jobs/integrations/artefact_s3.py).

Worker processes: with `PROMETHEUS_MULTIPROC_DIR` set (one directory per process group,
made and pruned of earlier runs at start: core/metrics_dir.py), prometheus_client writes
each process' values to files there and `/metrics` aggregates them. Gauges therefore
declare how to combine processes (`multiprocess_mode`): `livesum` for
`job_in_progress` (each worker process adds its own running jobs), `mostrecent` for
the values set by whichever process refreshed them last.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import requests  # type: ignore[import-untyped]
import structlog
from django.conf import settings
from django.db import connection
from prometheus_client import Counter, Gauge, Histogram

from audit.partitions import AUDIT_FUTURE_PARTITIONS, future_months, list_partitions
from audit.verification_runs import audit_verification_successes
from jobs.domain.types import all_connectors, get_type, primary_queue_names
from jobs.integrations.liveness import live_processes, workers_of
from jobs.queries import QUERIES
from tenants.models import Organisation

log = structlog.get_logger("jobs.metrics")

# --- the tenant label (docs/tenancy.md#limits) ------------------------------------------
# No tenant label by default: an organisation per series would grow without bound. A
# deployment may list a few organisations (JOBOPS_METRICS_TENANT_LABELS); the job_create
# and job_finished counters then carry `org`: the slug if listed, else "other". Read
# once at import: a counter's label names are fixed when it is made.
TENANT_LABELS: tuple[str, ...] = tuple(settings.JOBOPS_METRICS_TENANT_LABELS)
_ORG_LABEL = ["org"] if TENANT_LABELS else []
# id -> slug of the listed organisations, read again at most once a minute (an
# organisation made later gets its label within a minute).
_ORG_SLUGS_TTL_SECONDS = 60.0
_org_slugs: tuple[float, dict[int, str]] = (float("-inf"), {})


def org_label(org_id: int | None) -> dict[str, str]:
    """The `org` label of a job of `org_id` for the counters that may carry one: {} when
    JOBOPS_METRICS_TENANT_LABELS is empty, else {"org": its slug if listed, or "other"}."""
    global _org_slugs
    if not TENANT_LABELS:
        return {}
    read_at, slugs = _org_slugs
    if time.monotonic() - read_at > _ORG_SLUGS_TTL_SECONDS:
        slugs = dict(Organisation.objects.filter(slug__in=TENANT_LABELS).values_list("id", "slug"))
        _org_slugs = (time.monotonic(), slugs)
    return {"org": slugs.get(org_id, "other") if org_id is not None else "other"}


# --- the error_code label ------------------------------------------------------------
# Error codes come from the taxonomy (jobs/domain/errors.py) and the handlers' own codes (ERP_503,
# ...), a small set; an unexpected exception's code names its class
# (UNEXPECTED_KeyError), which any library could multiply. Those share one label, and
# past MAX_ERROR_CODE_LABELS distinct codes in a process the rest count as OTHER: a label
# per new string would grow without bound. The job row and the log keep the full code.
MAX_ERROR_CODE_LABELS = 100
_error_codes_seen: set[str] = set()


def error_code_label(code: str | None) -> str:
    """The bounded `error_code` label of a job's error code ("" when it has none)."""
    if not code:
        return ""
    if code.startswith("UNEXPECTED_"):
        return "UNEXPECTED"
    if code not in _error_codes_seen:
        if len(_error_codes_seen) >= MAX_ERROR_CODE_LABELS:
            return "OTHER"
        _error_codes_seen.add(code)
    return code


# --- the job_type and queue labels ---------------------------------------------------
# From the types table, the one table of queues: a job's type names its queue there. A
# type no longer in the table (a job created before it was removed) counts as "other",
# so that neither label ever holds text from a row or a request.
OTHER = "other"


def jobs_labels(job_type: str) -> dict[str, str]:
    """The `job_type` and `queue` labels of a job of `job_type`."""
    spec = get_type(job_type)
    if spec is None:
        return {"job_type": OTHER, "queue": OTHER}
    return {"job_type": spec.name, "queue": spec.queue}


# --- calls to external systems ------------------------------------------------------
class ExternalCall:
    """One call timed by `external_call`; the caller records the HTTP status it got."""

    status: int | None = None


def _call_outcome(call: ExternalCall, exc: BaseException | None) -> str:
    if exc is not None:
        # ConnectTimeout is both a Timeout and a ConnectionError: a timeout here.
        if isinstance(exc, requests.Timeout | TimeoutError):
            return "timeout"
        if isinstance(exc, requests.ConnectionError | ConnectionError):
            return "connection_error"
        return "error"
    if call.status is None or call.status < 400:
        return "ok"
    return "client_error" if call.status < 500 else "server_error"


@contextmanager
def external_call(connector: str) -> Iterator[ExternalCall]:
    """Time a call to an external system into external_call_duration_seconds{connector,
    outcome}: the outcome is the exception's kind when the call raised, else by the HTTP
    status the caller set on the yielded ExternalCall (none set: ok). `connector` is a
    literal of the calling code (erp, erp_bridge): never a value from a request."""
    call = ExternalCall()
    started = time.monotonic()
    error: BaseException | None = None
    try:
        yield call
    except BaseException as exc:
        error = exc
        raise
    finally:
        EXTERNAL_CALL_DURATION.labels(
            connector=connector, outcome=_call_outcome(call, error)
        ).observe(time.monotonic() - started)


# --- counters and histograms (incremented by the code that does the work) -----------
JOB_CREATE = Counter(
    "job_create",
    "Job creation requests by type and outcome (created, existing, ...)",
    ["type", "status", *_ORG_LABEL],
)
JOB_FINISHED = Counter(
    "job_finished",
    "Jobs that ended, by type and final status (succeeded, failed, cancelled)",
    ["type", "status", *_ORG_LABEL],
)
JOB_IN_PROGRESS = Gauge(
    "job_in_progress",
    "Jobs running in this process, by type",
    ["type"],
    multiprocess_mode="livesum",
)
# An attempt's run time (up to the longest hard time limit) and a job's attempts.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900)
ATTEMPTS_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30)
JOB_DURATION = Histogram(
    "job_duration_seconds",
    "Run time of one attempt, by type and how it ended (succeeded, retrying, failed, "
    "cancelled, lost); deprecated: jobs_duration_seconds",
    ["type", "status"],
    buckets=DURATION_BUCKETS,
)
RETRIES = Counter("retries", "Attempts that ended in a retry", ["type", "error_code"])
QUEUE_DEPTH = Gauge(
    "queue_depth",
    "Messages ready in a primary queue (read by the dispatcher)",
    ["queue"],
    multiprocess_mode="mostrecent",
)
DLQ_DEPTH = Gauge(
    "dlq_depth",
    "Messages in a broker dead-letter queue",
    ["queue"],
    multiprocess_mode="mostrecent",
)
DLQ_REPLAY = Counter("dlq_replay", "Dead letters replayed")
CANCELLATION = Counter("cancellation", "Jobs cancelled")
# A worker's write refused by its fence: the job was reclaimed from under it (JobLost).
JOBS_LOST = Counter("jobs_lost", "Finished runs whose job was reclaimed meanwhile", ["type"])
PROGRESS_UPDATE = Counter("progress_update", "Progress values written to the database")
OUTBOX_RELAYED = Counter("outbox_relayed", "Outbox events published to events.jobs")
JOBS_PURGED = Counter(
    "jobs_purged", "Jobs the purge removed past their retention, by category", ["category"]
)
# A dispatcher step that raised (jobs/processes/step_failures.py). Labels: the step's name (from
# JOBOPS_DISPATCHER_STEPS) and the exception's class (bounded there), never its message.
DISPATCHER_STEP_FAILURES = Counter(
    "dispatcher_step_failures", "Dispatcher steps that raised, by step", ["step"]
)
DISPATCHER_STEP_LAST_FAILURE = Gauge(
    "dispatcher_step_last_failure_timestamp_seconds",
    "When the step last raised (Unix time)",
    ["step"],
    multiprocess_mode="mostrecent",
)
DISPATCHER_STEP_FAILING = Gauge(
    "dispatcher_step_failing",
    "1 while the step's last run raised this class of exception, else 0",
    ["step", "error"],
    multiprocess_mode="mostrecent",
)
# The loop turning (jobs/processes/dispatcher.py): a run of a step, raised or not, counts once it
# has ended, so that a reader (an operator, a test) knows that what the step does was
# done by then; a pass is one turn of the loop over the steps that were due.
DISPATCHER_STEP_RUNS = Counter(
    "dispatcher_step_runs", "Dispatcher step runs that ended (raised or not), by step", ["step"]
)
DISPATCHER_PASSES = Counter(
    "dispatcher_passes", "Passes of the dispatcher loop over the steps that were due"
)
# run_worker's claimer (jobs/processes/executor.py): a claim that took no job counts too, once it
# has committed; a flat line is a claimer that stopped looking.
WORKER_CLAIMS = Counter("worker_claims", "Claims run_worker's claimer ran, with or without jobs")
# Webhooks (docs/webhooks.md): over all endpoints (no endpoint label: the portal and
# GET /api/v1/webhooks/{id} show each endpoint's state).
WEBHOOK_ATTEMPTS = Counter(
    "webhook_delivery_attempts", "Webhook POSTs by outcome (delivered, failed)", ["outcome"]
)
WEBHOOK_LATENCY = Histogram(
    "webhook_delivery_duration_seconds",
    "Webhook POST durations, answered or not",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WEBHOOK_ENDPOINTS_DISABLED = Counter(
    "webhook_endpoints_disabled",
    "Webhook endpoints disabled by delivery after failing for JOBOPS_WEBHOOK_RETRY_WINDOW",
)
WEBHOOK_FANNED_OUT = Counter(
    "webhook_deliveries_created", "Deliveries the fan-out made from outbox events"
)

ERP_BRIDGE_DELIVERIES = Counter(
    "erp_bridge_deliveries", "ERP bridge outcomes (delivered, retried, parked)", ["outcome"]
)

# --- outcomes (incremented on commit of the transition that decides them) ------------
# JOB_FINISHED says the same by status; these carry what an alert or a dashboard splits
# on (the error code of a failure, the reason of a dead letter) under the names on-call
# dashboards share.
# jobs_succeeded_total and jobs_failed_total are both a name of this release's and one of
# the async jobs names below: one series set cannot be exported twice under one name, so
# each carries both label sets, the deprecated `type` (and `error_code`) beside
# `job_type`, `queue` (and `error_class`). A query of either set reads it; the
# deprecated labels go with the other deprecated names (docs/operations/upgrading.md).
JOBS_SUCCEEDED = Counter(
    "jobs_succeeded",
    "Jobs that ended succeeded, by job type and queue (`type`: deprecated, the job type)",
    ["type", "job_type", "queue"],
)
JOBS_FAILED = Counter(
    "jobs_failed",
    "Jobs that ended failed, by job type, queue and error class (`type`, `error_code`: deprecated)",
    ["type", "error_code", "job_type", "queue", "error_class"],
)
JOBS_DEAD_LETTERED = Counter(
    "jobs_dead_lettered",
    "Jobs failed with a dead letter, by type and reason (exhausted, fatal, ...); "
    "deprecated: deadletter_total",
    ["type", "reason"],
)
JOB_ATTEMPTS = Histogram(
    "job_attempts",
    "Attempts a job took, observed when it ends (succeeded, failed, cancelled); "
    "deprecated: jobs_attempts",
    ["type"],
    buckets=ATTEMPTS_BUCKETS,
)
JOB_QUEUE_LATENCY = Histogram(
    "job_queue_latency_seconds",
    "From a job's creation (or the time it was due: run_at, a retry's next_run_at) to "
    "the start of its attempt, observed at the claim",
    ["type"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
RATE_LIMITED = Counter(
    "rate_limited",
    "Job submissions refused with 429, by scope (user, organisation, global, backpressure)",
    ["scope"],
)
EXTERNAL_CALL_DURATION = Histogram(
    "external_call_duration_seconds",
    "Calls to external systems by connector and outcome (ok, client_error, server_error, "
    "timeout, connection_error, error)",
    ["connector", "outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

# --- the async jobs names (docs/operations/observability.md#metrics) -------------------
# Labelled by job type and queue, both from the types table (jobs_labels); they move at
# the same events as the names above they replace, which stay one release, deprecated
# (docs/operations/upgrading.md#metric-names): job_duration_seconds, job_attempts,
# jobs_dead_lettered_total. jobs_succeeded_total and jobs_failed_total above are both.
# jobs_enqueued_total counts what job_create_total{status="created"} counts; that one
# stays, for the refused and repeated creations no async jobs name counts.
#
# What they replace, and the release that stops exporting it (the upgrade notes say the
# same; tests/deploy/test_monitoring.py keeps deploy/ off them and holds the release to
# it): names as exported, and the labels of the two names both sets share.
DEPRECATED_REMOVED_IN = "0.2.0"
DEPRECATED_NAMES = ("job_duration_seconds", "job_attempts", "jobs_dead_lettered_total")
DEPRECATED_LABELS = {"jobs_succeeded_total": ("type",), "jobs_failed_total": ("type", "error_code")}
JOBS_ENQUEUED = Counter(
    "jobs_enqueued", "Jobs created (accepted into their queue)", ["job_type", "queue"]
)
JOBS_STARTED = Counter(
    "jobs_started", "Attempts started (each claim of a job)", ["job_type", "queue"]
)
JOBS_DURATION = Histogram(
    "jobs_duration_seconds",
    "Run time of one attempt, from its claim to its end",
    ["job_type", "queue"],
    buckets=DURATION_BUCKETS,
)
JOBS_ATTEMPTS = Histogram(
    "jobs_attempts",
    "Attempts a job took, observed when it ends (succeeded, failed, cancelled)",
    ["job_type", "queue"],
    buckets=ATTEMPTS_BUCKETS,
)
DEADLETTER = Counter("deadletter", "Jobs failed with a dead letter", ["job_type", "queue"])

# --- the artefact storage on S3 (jobs/integrations/artefact_s3.py) ---------------------
# Only the S3 backend observes these: the file system's storage emits none.
S3_OPERATION_DURATION = Histogram(
    "s3_operation_duration_seconds",
    "Calls of the artefact storage to S3, by operation (put, get, head, delete, list, "
    "multipart, presign, other), retries included",
    ["operation"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
S3_OPERATION_ERRORS = Counter(
    "s3_operation_errors",
    "Calls of the artefact storage to S3 that failed, by operation and kind (not_found, "
    "access_denied, client_error, server_error, timeout, connection_error, error)",
    ["operation", "kind"],
)

# --- gauges derived from the database (metrics_refresh_gauges) -----------------------
OLDEST_PENDING_AGE = Gauge(
    "job_oldest_pending_age_seconds",
    "Age of the oldest job still `pending` (0 when none)",
    multiprocess_mode="mostrecent",
)
STALE_LOCKS = Gauge(
    "job_stale_locks",
    "`running` jobs whose lock is older than JOBOPS_LOCK_TIMEOUT",
    multiprocess_mode="mostrecent",
)
OUTBOX_LAG = Gauge(
    "outbox_lag_seconds",
    "Age of the oldest unpublished outbox event (0 when none)",
    multiprocess_mode="mostrecent",
)
OUTBOX_UNPUBLISHED = Gauge(
    "outbox_unpublished", "Outbox events not yet relayed", multiprocess_mode="mostrecent"
)
ERP_EVENTS_PARKED = Gauge(
    "erp_events_parked",
    "ERP events the receiver refused for good, parked in the outbox for an operator "
    "(PostgreSQL alone; with a broker they wait on erp.events.parked)",
    multiprocess_mode="mostrecent",
)
CHECKPOINT_AGE = Gauge(
    "audit_checkpoint_age_seconds",
    "Age of the newest audit checkpoint (-1 when none was ever written)",
    multiprocess_mode="mostrecent",
)
AUDIT_VERIFIED_AT = Gauge(
    "audit_verification_last_success_timestamp_seconds",
    "Unix time of the newest recorded audit verification run that found the trail intact, "
    "by mode (full, incremental); 0 when none",
    ["mode"],
    multiprocess_mode="mostrecent",
)
DEAD_LETTERS_OPEN = Gauge(
    "dead_letters_open",
    "Open dead-letter rows in the database, by DLQ",
    ["queue"],
    multiprocess_mode="mostrecent",
)
QUEUE_PAUSED = Gauge(
    "queue_paused",
    "1 while an operator has paused the queue (docs/operator-controls.md), else 0",
    ["queue"],
    multiprocess_mode="mostrecent",
)
CONNECTOR_STATE = Gauge(
    "connector_state",
    "A connector's breaker (docs/connectors.md): 0 closed, 1 half-open, 2 open",
    ["connector"],
    multiprocess_mode="mostrecent",
)
# The gauge's value of each breaker state.
CONNECTOR_STATE_VALUES = {"closed": 0, "half_open": 1, "open": 2}

LIVE_WORKERS = Gauge(
    "live_workers",
    "Worker processes with a fresh liveness heartbeat, by queue they consume",
    ["queue"],
    multiprocess_mode="mostrecent",
)
LIVE_DISPATCHERS = Gauge(
    "live_dispatchers",
    "Dispatcher processes with a fresh liveness heartbeat",
    multiprocess_mode="mostrecent",
)


def metrics_refresh_gauges() -> dict[str, float]:
    """Recompute the database-derived gauges; returns the values it set.

    1. One statement reads the oldest pending job, the stale locks, the outbox lag and
       backlog, the newest checkpoint and the ERP events parked in the outbox.
    2. A second counts open dead letters per DLQ; queues that emptied drop to 0.
    3. A third lists the paused queues (queue_pauses): 1 for each, 0 for the others.
    4. A fourth reads the connector breakers: 0 closed (or no row), 1 half-open, 2 open.
    """
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["gauges"], {"stale_after": float(settings.JOBOPS_LOCK_TIMEOUT)})
        pending_age, stale, lag, unpublished, checkpoint_age, parked = cursor.fetchone()
        cursor.execute(QUERIES["dead_letters_open"])
        open_rows = dict(cursor.fetchall())
        cursor.execute(QUERIES["queues_paused"])
        paused = {row[0] for row in cursor.fetchall()}
        cursor.execute(QUERIES["connector_states"])
        breakers = dict(cursor.fetchall())
    values = {
        "oldest_pending_age": max(0.0, float(pending_age or 0)),
        "stale_locks": float(stale),
        "outbox_lag": max(0.0, float(lag or 0)),
        "outbox_unpublished": float(unpublished),
        "checkpoint_age": -1.0 if checkpoint_age is None else max(0.0, float(checkpoint_age)),
        "erp_events_parked": float(parked),
    }
    OLDEST_PENDING_AGE.set(values["oldest_pending_age"])
    STALE_LOCKS.set(values["stale_locks"])
    OUTBOX_LAG.set(values["outbox_lag"])
    OUTBOX_UNPUBLISHED.set(values["outbox_unpublished"])
    CHECKPOINT_AGE.set(values["checkpoint_age"])
    ERP_EVENTS_PARKED.set(values["erp_events_parked"])
    for queue in {f"{q}_dlq" for q in primary_queue_names()} | set(open_rows):
        DEAD_LETTERS_OPEN.labels(queue=queue).set(open_rows.get(queue, 0))
    for queue in set(primary_queue_names()) | paused:
        QUEUE_PAUSED.labels(queue=queue).set(1 if queue in paused else 0)
    values["queues_paused"] = float(len(paused))
    values["audit_future_partitions"] = float(future_months(list_partitions()))
    AUDIT_FUTURE_PARTITIONS.set(values["audit_future_partitions"])
    for connector in set(all_connectors()) | set(breakers):
        state = CONNECTOR_STATE_VALUES.get(breakers.get(connector, "closed"), 0)
        CONNECTOR_STATE.labels(connector=connector).set(state)
    for mode, at in audit_verification_successes().items():
        AUDIT_VERIFIED_AT.labels(mode=mode).set(at)
        values[f"audit_verified_{mode}"] = at
    metrics_refresh_liveness()
    return values


def metrics_refresh_liveness() -> dict[str, float]:
    """Live workers per queue and live dispatchers, from their heartbeats
    (jobs/integrations/liveness.py)."""
    try:
        found = live_processes()
    except Exception as exc:  # store down: say nothing rather than "nobody is alive"
        log.warning("liveness_refresh_failed", error=repr(exc))
        return {}
    per_queue = dict.fromkeys(primary_queue_names(), 0)
    for worker in workers_of(found):
        for queue in worker["queues"]:
            per_queue[queue] = per_queue.get(queue, 0) + 1
    for queue, count in per_queue.items():
        LIVE_WORKERS.labels(queue=queue).set(count)
    LIVE_DISPATCHERS.set(len(found.get("dispatcher", [])))
    return {"live_dispatchers": float(len(found.get("dispatcher", [])))} | {
        f"live_workers:{q}": float(c) for q, c in per_queue.items()
    }
