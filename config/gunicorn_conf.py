"""Gunicorn's hooks for the Procfile's `web` (`--config python:config.gunicorn_conf`).

Its workers write their metrics to PROMETHEUS_MULTIPROC_DIR, one set of files per pid,
and `/metrics` adds up every file there (core/metrics_dir.py):

- at start, in the master before any worker exists, the files of an earlier run are
  dropped: their counters would be added to this run's, and each of their gauges shown
  as one more series;
- when a worker exits (a crash, a timeout, a restart), its live gauges stop counting.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import multiprocess

from core.metrics_dir import ENV, multiprocess_dir_prune


def on_starting(server: Any) -> None:
    multiprocess_dir_prune()


def child_exit(server: Any, worker: Any) -> None:
    if os.environ.get(ENV):
        multiprocess.mark_process_dead(worker.pid)
