"""/healthz and /readyz answer probes cheaply, unauthenticated, and name what is down."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connection

from core import health
from tests.polling import wait_for
from tests.processes import free_port


@pytest.fixture(autouse=True)
def _fresh_answer(settings):
    settings.JOBOPS_READY_CACHE_SECONDS = 0
    health._cache = None


def test_healthz_answers_without_database_or_allowed_host(client):
    # No django_db mark: any query here would raise.
    response = client.get("/healthz", HTTP_HOST="10.9.8.7")  # an IP, not in ALLOWED_HOSTS
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"


@pytest.mark.django_db
def test_readyz_is_ready_when_every_service_answers(client):
    response = client.get("/readyz", HTTP_HOST="10.9.8.7")
    assert response.status_code == 200, response.content
    broker = urlsplit(settings.BROKER_URL)
    assert response.json()["checks"] == {
        "postgres": {"ok": True},
        # The node this process reached: on a cluster, which of BROKER_URL's nodes.
        "rabbitmq": {"ok": True, "node": f"{broker.hostname}:{broker.port}"},
        "redis": {"ok": True},
    }


@pytest.mark.django_db
def test_readyz_names_an_unreachable_broker_quickly(client, settings, caplog):
    settings.BROKER_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}//"
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = client.get("/readyz")
    assert time.monotonic() - started < 3
    assert response.status_code == 503
    body = response.json()
    assert body["error"]["code"] == "ERR-READY-503"
    assert body["error"]["message"] == "Not reachable: rabbitmq."
    assert body["error"]["details"]["rabbitmq"]["ok"] is False
    assert body["error"]["details"]["postgres"] == {"ok": True}
    # The probe says what is down itself; django.request does not log it again.
    assert not [r for r in caplog.records if r.name == "django.request"]


@pytest.mark.django_db
def test_readyz_names_redis_and_postgres_when_they_are_down(client, settings, monkeypatch):
    port = free_port()
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    monkeypatch.setitem(connection.settings_dict, "PORT", str(port))
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "Not reachable: postgres, redis."


@pytest.mark.django_db
def test_readyz_reuses_its_answer_within_the_cache_window(client, settings):
    settings.JOBOPS_READY_CACHE_SECONDS = 60
    assert client.get("/readyz").status_code == 200
    settings.BROKER_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}//"
    assert client.get("/readyz").status_code == 200  # cached: a probe storm costs one check
    health._cache = None
    assert client.get("/readyz").status_code == 503


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except OSError:  # not listening yet
        return False
    return True


def test_gunicorn_access_log_skips_probes(tmp_path):
    """The Procfile's gunicorn flags: probes leave no access-log line, API calls do."""
    port = free_port()
    log_file = tmp_path / "access.log"
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "config.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--access-logfile",
            str(log_file),
            "--logger-class",
            "config.gunicorn_logging.ProbeQuietLogger",
        ],
        cwd=settings.BASE_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), timeout=20, interval=0.2)
        for path in ("/healthz", "/readyz", "/api/v1/nope"):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
            except urllib.error.HTTPError:
                pass  # the 404 is logged all the same
    finally:
        server.terminate()
        server.wait(timeout=10)
    lines = log_file.read_text().splitlines()
    assert any("/api/v1/nope" in line for line in lines), lines
    assert not any("/healthz" in line or "/readyz" in line for line in lines), lines


@pytest.mark.django_db
def test_readyz_fails_over_to_the_next_broker_node_and_names_it(client, settings):
    """BROKER_URL listing a cluster's nodes: the first one down, the check reaches the
    next, as every connection of the process would, and says which."""
    live = urlsplit(settings.BROKER_URL)
    settings.BROKER_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}/x;{settings.BROKER_URL}"
    response = client.get("/readyz", HTTP_HOST="10.9.8.7")
    assert response.status_code == 200, response.content
    assert response.json()["checks"]["rabbitmq"] == {
        "ok": True,
        "node": f"{live.hostname}:{live.port}",
    }


@pytest.mark.django_db
def test_readyz_names_the_broker_node_of_each_live_worker_and_dispatcher(client):
    from jobs.integrations.liveness import beat, beat_end

    before = client.get("/readyz", HTTP_HOST="10.9.8.7").json()["broker_nodes"]
    beat("worker", ("sim",), "10.0.0.2:5672")
    health._cache = None
    try:
        after = client.get("/readyz", HTTP_HOST="10.9.8.7").json()["broker_nodes"]
    finally:
        beat_end("worker")
    (added,) = [p for p in after if p not in before]
    assert (added["kind"], added["node"]) == ("worker", "10.0.0.2:5672")
