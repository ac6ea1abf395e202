"""Two hosts, no shared disk (docs/operations/scaling.md#two-hosts-no-shared-disk).

gunicorn on one "host", a worker group and a dispatcher on another: each in a working
directory of its own with a media root of its own, sharing only PostgreSQL, RabbitMQ,
Redis and the S3 server. A `report` the worker writes downloads through the web with
the right bytes and sha256, and neither host's disk holds it.
"""

from __future__ import annotations

import hashlib
import sys
import uuid
from pathlib import Path

import pytest
import requests
from rest_framework.authtoken.models import Token

from tests.factories import UserFactory
from tests.polling import wait_for
from tests.processes import (
    ROOT,
    Process,
    free_port,
    job_finished,
    subprocess_env,
)
from tests.queues import topology_declare_and_purge

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def _host_env(s3, host: Path, **overrides: str) -> dict[str, str]:
    """What a process on `host` gets: the deployment's settings module, the shared
    services, the S3 artefact storage, and a media root on its own disk."""
    env = subprocess_env(
        DJANGO_SETTINGS_MODULE="config.settings",
        DEBUG="true",
        JOBOPS_MEDIA_ROOT=str(host / "media"),
        **s3.env(),
        **overrides,
    )
    for name in ("PROMETHEUS_MULTIPROC_DIR", "JOBOPS_METRICS_PORT"):
        env.pop(name, None)
    return env


def _started(process: Process, ready, what: str) -> None:
    def up() -> bool:
        assert process.alive(), f"{process.name} exited:\n{process.log_text()[-3000:]}"
        return ready()

    try:
        wait_for(up, timeout=60, interval=0.2, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{process.log_text()[-3000:]}") from None


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:  # still booting
        return False


def test_a_report_written_on_the_worker_host_downloads_through_the_web_host(s3, tmp_path):
    web_host, worker_host = tmp_path / "web-host", tmp_path / "worker-host"
    web_host.mkdir()
    worker_host.mkdir()
    topology_declare_and_purge()
    token = Token.objects.create(user=UserFactory()).key
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    web = Process(
        [sys.executable, "-m", "gunicorn", "config.wsgi", "--config",
         "python:config.gunicorn_conf", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        _host_env(s3, web_host), "host-a-web", cwd=web_host,
    )  # fmt: skip
    worker_env = _host_env(s3, worker_host)
    worker = Process(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "report", "-c", "1",
         "-n", f"host-b-{uuid.uuid4().hex[:6]}@%h", "-l", "info", "--without-gossip",
         "--without-mingle"],
        worker_env, "host-b-worker", cwd=worker_host,
    )  # fmt: skip
    dispatcher = Process(
        [sys.executable, str(ROOT / "manage.py"), "run_dispatcher", "--interval", "0.2"],
        worker_env, "host-b-dispatcher", cwd=worker_host,
    )  # fmt: skip
    try:
        _started(web, lambda: _answers(f"{base}/healthz"), "web to answer /healthz")
        _started(worker, lambda: " ready." in worker.log_text(), "the worker to consume")
        _started(
            dispatcher,
            lambda: "dispatcher_started" in dispatcher.log_text(),
            "the dispatcher to loop",
        )
        auth = {"Authorization": f"Token {token}"}
        created = requests.post(
            f"{base}/api/v1/jobs",
            json={"type": "report", "params": {"limit": 20}},
            headers={**auth, "Idempotency-Key": uuid.uuid4().hex},
            timeout=10,
        )
        assert created.status_code == 201, created.text
        job = job_finished(created.json()["id"], timeout=60)
        assert job.status == "succeeded", job.last_error_message
        (listed,) = requests.get(f"{base}/api/v1/jobs/{job.id}", headers=auth, timeout=10).json()[
            "artefacts"
        ]
        download = requests.get(listed["url"], headers=auth, timeout=10)
    finally:
        for process in (dispatcher, worker, web):
            process.stop()
    assert download.status_code == 200, download.text
    assert hashlib.sha256(download.content).hexdigest() == listed["sha256"] == job.result["sha256"]
    assert len(download.content) == listed["size"] and str(job.id) in download.text
    assert s3.object_bytes(listed["s3_key"]) == download.content
    for host in (web_host, worker_host):
        assert not (host / "media").exists(), f"{host.name} wrote to its disk"
