"""gunicorn's settings and hooks for the web process: the Procfile's `web:` line and the
tests' live server (tests/e2e/live_api.py) both start gunicorn with
`--config python:config.gunicorn_conf`.

Request limits. They sit above Django's own (core.middleware.RequestLimitsMiddleware),
so that an oversized request line or header reaches Django and is answered in the API's
error envelope (414 ERR-HTTP-414, 431 ERR-HTTP-431). Only what is beyond these limits
gunicorn answers itself, with its own short HTML page. They read the same variables as
config/settings.py, so raising a Django limit raises gunicorn's with it.

Metrics. Its workers write their metrics to PROMETHEUS_MULTIPROC_DIR, one set of files
per pid, and `/metrics` adds up every file there (core/metrics_dir.py):

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


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


# gunicorn's maximum: the longest URI Django then sees is JOBOPS_MAX_URI_CHARS (4096,
# at most 8000) plus room for the method and the protocol.
limit_request_line = 8190
# Twice Django's limits: a header of 16 KiB (a long session cookie is normal) to 32 KiB,
# or 101 to 200 headers, is refused by Django in the envelope, not by gunicorn.
limit_request_field_size = 2 * _env_int("JOBOPS_MAX_HEADER_BYTES", 16 * 1024)
limit_request_fields = 2 * _env_int("JOBOPS_MAX_HEADERS", 100)


def on_starting(server: Any) -> None:
    multiprocess_dir_prune()


def child_exit(server: Any, worker: Any) -> None:
    if os.environ.get(ENV):
        multiprocess.mark_process_dead(worker.pid)
