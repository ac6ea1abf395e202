"""The Procfile as a deployer copies it: every process starts on its own and does its work.

`honcho start -f Procfile` runs in a fresh copy of the checkout that has no `var/` (only
`make run` used to create the metrics directories, and without them the dispatcher and
the publisher crash-looped), on the test database, vhost and Redis. The metrics port of
the dispatcher, the publisher and the light worker group is held by this test: metrics
must never stop the work, so each of them warns and works on.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authtoken.models import Token

from tests.factories import UserFactory
from tests.polling import wait_for
from tests.processes import ROOT, Process, free_port, job_finished, subprocess_env
from tests.queues import topology_declare_and_purge

# Every Procfile entry at once under honcho: `heavy` (docs/development.md#the-test-budget).
# make test starts each kind of process in smaller cases (tests.processes: the
# dispatcher, Celery workers, run_worker, gunicorn), and a dispatcher without its metrics
# directory (tests/core/test_metrics_dir.py).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

ROLES = ("web", "worker_long", "worker_light", "dispatcher", "publisher")


def _checkout_copy(target: Path) -> Path:
    """The working tree's files as git sees them (committed or not, ignored ones left
    out: no `var/`), with this run's virtualenv at `.venv`, where the Procfile looks."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is skipped
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return target


def _job_succeeds_through_web(base: str, token: str, body: dict) -> str:
    created = requests.post(
        f"{base}/api/v1/jobs",
        json=body,
        headers={"Authorization": f"Token {token}", "Idempotency-Key": uuid.uuid4().hex},
        timeout=10,
    )
    assert created.status_code == 201, created.text
    job = job_finished(created.json()["id"], timeout=60)
    assert job.status == "succeeded", (body, job.status, job.last_error_code)
    return str(job.id)


def _stream_ends_with_success(base: str, token: str, job_id: str) -> None:
    """The events process streams the ended job's events and closes after the last."""
    with requests.get(
        f"{base}/api/v1/jobs/{job_id}/events",
        headers={"Authorization": f"Token {token}"},
        stream=True,
        timeout=10,
    ) as response:
        assert response.status_code == 200, response.text
        lines = [line for line in response.iter_lines(decode_unicode=True) if line]
    assert lines[-2:] == ["event: job.status.changed", lines[-1]], lines
    assert '"status":"succeeded"' in lines[-1], lines


def _sample(port: int, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def _lines_of(log: str, role: str) -> list[str]:
    # honcho prefixes every line: "12:00:01 dispatcher.1   | ...".
    return [line for line in log.splitlines() if f" {role}.1 " in line]


def test_every_procfile_entry_starts_in_a_fresh_checkout_and_works(tmp_path):
    checkout = _checkout_copy(tmp_path / "checkout")
    assert not (checkout / "var").exists()
    topology_declare_and_purge()
    token = Token.objects.create(user=UserFactory()).key
    web_port, events_port, long_metrics = free_port(), free_port(), free_port()
    with socket.socket() as taken:  # another process holds this metrics port throughout
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = str(taken.getsockname()[1])
        env = subprocess_env(
            # The settings a deployment runs (with DEBUG's development secrets).
            DJANGO_SETTINGS_MODULE="config.settings",
            DEBUG="true",
            JOBOPS_BIND=f"127.0.0.1:{web_port}",
            JOBOPS_EVENTS_PORT=str(events_port),
            WEB_CONCURRENCY="1",
            WORKER_LONG_CONCURRENCY="1",
            WORKER_LIGHT_CONCURRENCY="1",
            WORKER_LONG_METRICS_PORT=str(long_metrics),
            WORKER_LIGHT_METRICS_PORT=held,
            DISPATCHER_METRICS_PORT=held,
            PUBLISHER_METRICS_PORT=held,
        )
        for name in ("PROMETHEUS_MULTIPROC_DIR", "JOBOPS_METRICS_PORT"):
            env.pop(name, None)  # each Procfile line sets its own
        honcho = Process(
            [str(checkout / ".venv" / "bin" / "honcho"), "start", "-f", "Procfile"],
            env,
            "procfile",
            cwd=checkout,
        )
        try:
            base = f"http://127.0.0.1:{web_port}"

            def healthy() -> bool:
                assert honcho.alive(), honcho.log_text()[-3000:]
                try:
                    return requests.get(f"{base}/healthz", timeout=2).status_code == 200
                except requests.RequestException:  # still booting
                    return False

            wait_for(healthy, timeout=60, interval=0.2, what="web to answer /healthz")
            # A long job (worker_long) and a light one (worker_light); only the
            # dispatcher and the publisher publish, and both have lost their port.
            sim = _job_succeeds_through_web(base, token, {"type": "sim", "params": {"steps": 2}})
            _job_succeeds_through_web(base, token, {"type": "ai", "params": {"text": "Go on."}})
            _stream_ends_with_success(f"http://127.0.0.1:{events_port}", token, sim)
            # The pool child's values reach the group's exporter through the directory
            # the process made for itself.
            wait_for(
                lambda: _sample(
                    long_metrics, "jobs_duration_seconds_count", job_type="sim", queue="sim"
                )
                == 1,
                timeout=10,
            )
            log = honcho.log_text()
        finally:
            honcho.stop()
    for role in ROLES:
        assert (checkout / "var" / "prometheus" / role).is_dir(), role
    for role in ("worker_light", "dispatcher", "publisher"):
        warned = [x for x in _lines_of(log, role) if "metrics_exporter_unavailable" in x]
        assert warned, f"{role} did not warn:\n" + "\n".join(_lines_of(log, role)[-20:])
    assert "Duplicated timeseries" not in log
    assert "respawn:" not in log, log  # no process exited and was started again
