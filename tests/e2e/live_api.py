"""A live gunicorn serving the API on the test database, for contract and race tests.

Used by test_api_live.py: the server is a real subprocess (several workers), so only
committed rows are visible to it: tests that use it are transactional. It runs with the
Procfile's gunicorn settings (GUNICORN_CONFIG), so its request limits are production's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import requests

from tests.polling import wait_for
from tests.processes import ROOT, database_url, free_port

# The config the Procfile's `web:` line passes to gunicorn with --config.
GUNICORN_CONFIG = "python:config.gunicorn_conf"


@contextmanager
def gunicorn_server(
    *,
    workers: int = 3,
    threads: int = 4,
    timeout: float = 30,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Start gunicorn on a free 127.0.0.1 port; yield its base URL; stop it (its group)."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    (ROOT / "var").mkdir(exist_ok=True)  # a fresh clone has none
    log = open(ROOT / "var" / f"gunicorn-test-{port}.log", "wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--config",
            GUNICORN_CONFIG,
            "config.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--worker-class",
            "gthread",
            "--timeout",
            "60",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {process.returncode}; see {log.name}")
        try:
            return requests.get(f"{base}/api/v1/schema/", timeout=5).status_code == 200
        except requests.RequestException:  # not listening yet, or still booting
            return False

    try:
        wait_for(
            answers, timeout=timeout, interval=0.1, what=f"gunicorn on {base} (log {log.name})"
        )
        yield base
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()
