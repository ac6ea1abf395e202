"""/healthz and /readyz answer probes cheaply, unauthenticated, and name what is down."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from core import health


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens


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
    assert response.json()["checks"] == {
        "postgres": {"ok": True},
        "rabbitmq": {"ok": True},
        "redis": {"ok": True},
    }


@pytest.mark.django_db
def test_readyz_names_an_unreachable_broker_quickly(client, settings, caplog):
    settings.BROKER_URL = f"amqp://guest:guest@127.0.0.1:{_closed_port()}//"
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
    port = _closed_port()
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    monkeypatch.setitem(connection.settings_dict, "PORT", str(port))
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "Not reachable: postgres, redis."


@pytest.mark.django_db
def test_readyz_reuses_its_answer_within_the_cache_window(client, settings):
    settings.JOBOPS_READY_CACHE_SECONDS = 60
    assert client.get("/readyz").status_code == 200
    settings.BROKER_URL = f"amqp://guest:guest@127.0.0.1:{_closed_port()}//"
    assert client.get("/readyz").status_code == 200  # cached: a probe storm costs one check
    health._cache = None
    assert client.get("/readyz").status_code == 503


def test_gunicorn_access_log_skips_probes(tmp_path):
    """The Procfile's gunicorn flags: probes leave no access-log line, API calls do."""
    port = _closed_port()
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
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
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
