"""A live gunicorn serving the API on the test database, for contract and race tests.

Used by test_api_live.py: the server is a real subprocess (several workers), so only
committed rows are visible to it: tests that use it are transactional. It runs with the
Procfile's gunicorn settings (GUNICORN_CONFIG), so its request limits are production's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import requests

from tests.polling import wait_for
from tests.processes import Process, database_url, free_port

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
    """Start gunicorn on a free 127.0.0.1 port; yield its base URL; stop it as a process
    manager would (SIGTERM to the master, which stops its workers; then what is left of
    the group). Forked by the fork server where it can stand in (tests/forkserver.py):
    the master, and the workers it forks, start with Django's framework imported."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    args = [sys.executable, "-m", "gunicorn", "--config", GUNICORN_CONFIG, "config.wsgi"]
    args += ["--bind", f"127.0.0.1:{port}", "--workers", str(workers)]
    args += ["--threads", str(threads), "--worker-class", "gthread", "--timeout", "60"]
    process = Process(args, env, f"gunicorn-{port}")
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if not process.alive():
            raise RuntimeError(f"gunicorn exited: {process.log_text()[-3000:]}")
        try:
            return requests.get(f"{base}/api/v1/schema/", timeout=5).status_code == 200
        except requests.RequestException:  # not listening yet, or still booting
            return False

    try:
        what = f"gunicorn on {base} (log {process.log_path})"
        wait_for(answers, timeout=timeout, interval=0.1, what=what)
        yield base
    finally:
        process.stop(timeout=10)
