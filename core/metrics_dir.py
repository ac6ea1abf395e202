"""The directory of prometheus_client's multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`).

prometheus_client decides once, when `prometheus_client.values` is first imported,
whether values live in memory or in per-process files in that directory; every metric
created afterwards opens its file there. A directory that did not exist made the first
metric of `jobs/integrations/metrics.py` raise FileNotFoundError halfway through the module, and
Django's next import of it failed with "Duplicated timeseries in CollectorRegistry": a
process started outside `make run` (a systemd unit, `honcho start`) crash-looped.

So `multiprocess_dir_ready()` runs first in every process, from `config/__init__.py`,
which the web server, the Celery workers and every `manage.py` command import before
anything that imports prometheus_client. This module must not import prometheus_client.

Files of earlier runs: prometheus_client adds up every file of the directory, whether
its process lives or not. Each process group therefore drops the files of other pids
when it starts (`multiprocess_dir_prune`: the worker group's main process, the
dispatcher, gunicorn's master), which is safe only while a directory belongs to one
process group; a per-boot directory (systemd's `RuntimeDirectory=`, a tmpfs) is just
as good.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

ENV = "PROMETHEUS_MULTIPROC_DIR"

log = structlog.get_logger("core.metrics")


def multiprocess_dir_ready() -> str | None:
    """Create PROMETHEUS_MULTIPROC_DIR (and its parents) if it is missing; return it.

    Metrics never stop the work: a directory that cannot be created or written is
    logged and the variable removed, so the process runs on with in-process metrics
    (each process then exports only its own values). An empty value counts as unset,
    as every setting's does (prometheus_client would write its files to the working
    directory). Call before prometheus_client is imported.
    """
    directory = os.environ.get(ENV)
    if directory is None:
        return None
    if not directory.strip():
        del os.environ[ENV]
        return None
    try:
        os.makedirs(directory, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(f"{directory} is not writable")
    except OSError as exc:
        del os.environ[ENV]
        # Logging is not configured yet (settings load later): structlog's default
        # console renderer still writes the event to stdout.
        log.warning(
            "metrics_multiproc_dir_unusable",
            path=directory,
            error=repr(exc),
            consequence="metrics are kept per process, not aggregated",
        )
        return None
    return directory


def multiprocess_dir_prune() -> None:
    """Drop the value files of processes that are gone (a previous run of this group):
    prometheus_client would otherwise add their counts to ours."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    mine = f"_{os.getpid()}.db"
    for path in Path(directory).glob("*.db"):
        if not path.name.endswith(mine):
            path.unlink(missing_ok=True)
