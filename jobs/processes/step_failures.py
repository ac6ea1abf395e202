"""Dispatcher steps that fail, made visible (docs/operations/observability.md).

The loop (jobs/processes/dispatcher.py) runs on when a step raises; before this, the failure was
a log line only, and a step could fail every second for weeks (a purge stopped by a
foreign key, issue 37) while the dashboard said "All clear". Now each failure:

- counts in `dispatcher_step_failures_total{step}` and sets
  `dispatcher_step_last_failure_timestamp_seconds{step}` and
  `dispatcher_step_failing{step, error}` (1 for the class of the last failure, 0 once
  the step succeeds again) on the dispatcher's own /metrics: the alert
  JobopsDispatcherStepFailing reads them. The labels are the step's name and the
  exception's class name (at most MAX_ERROR_CLASSES per process), never its message;
- is written to the key-value store (core/kv.py), per step and process, with the
  message, so that the dashboard (a web process, not the dispatcher) can name the step
  and its error. A success of the step in that process deletes the entry; an entry of
  a process that stopped expires after ENTRY_TTL_SECONDS, so the list does not lie.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from typing import Any

import structlog

from core.kv import kv_key, kv_store
from jobs.integrations import metrics

log = structlog.get_logger("jobs.dispatcher")

PREFIX = "step-failure"
# A failing step writes its entry at every run (each interval at least), so a live
# failure never expires; one whose process is gone does within this time.
ENTRY_TTL_SECONDS = 300
# The message as the dashboard shows it: one line, this long at most.
MAX_MESSAGE = 400
# Distinct exception classes labelled per process; the rest count as "other".
MAX_ERROR_CLASSES = 30

# This process's failing steps: name -> its entry (the error class labelled, since when,
# how many times in a row).
_failing: dict[str, dict[str, Any]] = {}
_classes_seen: set[str] = set()


def _key(step: str) -> str:
    return kv_key(PREFIX, step, socket.gethostname(), os.getpid())


def _error_label(exc: BaseException) -> str:
    name = type(exc).__name__
    if name not in _classes_seen:
        if len(_classes_seen) >= MAX_ERROR_CLASSES:
            return "other"
        _classes_seen.add(name)
    return name


def _message(exc: BaseException) -> str:
    text = re.sub(r"\s+", " ", str(exc)).strip() or type(exc).__name__
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def step_failed(step: str, exc: BaseException) -> None:
    """Record that `step` raised `exc`: metrics, then the shared entry (a store that
    does not answer is logged: the loop must go on)."""
    now = time.time()
    error = _error_label(exc)
    metrics.DISPATCHER_STEP_FAILURES.labels(step=step).inc()
    metrics.DISPATCHER_STEP_LAST_FAILURE.labels(step=step).set(now)
    previous = _failing.get(step)
    if previous is not None and previous["error"] != error:
        metrics.DISPATCHER_STEP_FAILING.labels(step=step, error=previous["error"]).set(0)
    metrics.DISPATCHER_STEP_FAILING.labels(step=step, error=error).set(1)
    entry = {
        "step": step,
        "error": type(exc).__name__,
        "message": _message(exc),
        "since": previous["since"] if previous is not None else now,
        "at": now,
        "count": (previous["count"] if previous is not None else 0) + 1,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    _failing[step] = entry | {"error": error}
    try:
        kv_store().set_many({_key(step): json.dumps(entry)}, ttl=ENTRY_TTL_SECONDS)
    except Exception as exc_store:
        log.warning("dispatcher_step_failure_not_shared", step=step, error=repr(exc_store))


def step_succeeded(step: str) -> None:
    """`step` ran without raising: if it was failing in this process, it no longer is."""
    previous = _failing.pop(step, None)
    if previous is None:
        return
    metrics.DISPATCHER_STEP_FAILING.labels(step=step, error=previous["error"]).set(0)
    log.info("dispatcher_step_recovered", step=step, failures=previous["count"])
    try:
        kv_store().delete(_key(step))
    except Exception as exc:  # the entry expires by itself
        log.warning("dispatcher_step_failure_not_cleared", step=step, error=repr(exc))


def step_failures() -> list[dict[str, Any]]:
    """The steps failing now in any dispatcher, one per step (the entries of several
    processes merged: the latest error and message, the earliest `since`, the counts
    added up, the hosts), by step name. Raises core.kv.KvUnavailable when the store
    does not answer."""
    merged: dict[str, dict[str, Any]] = {}
    for value in kv_store().scan(kv_key(PREFIX, "")).values():
        entry = json.loads(value)
        found = merged.get(entry["step"])
        if found is None:
            merged[entry["step"]] = entry | {"hosts": [entry["host"]]}
            continue
        latest = entry if entry["at"] > found["at"] else found
        merged[entry["step"]] = latest | {
            "since": min(entry["since"], found["since"]),
            "count": entry["count"] + found["count"],
            "hosts": sorted({*found["hosts"], entry["host"]}),
        }
    return [merged[step] for step in sorted(merged)]


def step_failures_forget() -> None:
    """Forget every step failure, shared and of this process (tests)."""
    for step, entry in list(_failing.items()):
        metrics.DISPATCHER_STEP_FAILING.labels(step=step, error=entry["error"]).set(0)
    _failing.clear()
    store = kv_store()
    keys = list(store.scan(kv_key(PREFIX, "")))
    if keys:
        store.delete(*keys)
