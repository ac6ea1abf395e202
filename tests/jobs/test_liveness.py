"""Workers and dispatchers leave a heartbeat that `manage.py liveness` and /metrics read."""

from __future__ import annotations

import json
import subprocess
from io import StringIO
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from jobs.domain.types import primary_queue_names
from jobs.integrations.liveness import missing_processes
from jobs.integrations.metrics import metrics_refresh_liveness
from jobs.integrations.redis_client import redis_client, redis_key
from tests.polling import wait_for
from tests.processes import Process, celery_worker, dispatcher_process

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"JOBOPS_PROCESS_HEARTBEAT_SECONDS": "0.5"}


@pytest.fixture(autouse=True)
def _no_heartbeats_of_earlier_tests():
    # Workers SIGKILLed by earlier tests leave keys until their time-to-live runs out.
    client = redis_client()
    for key in client.scan_iter(match=redis_key("heartbeat", "*")):
        client.delete(key)


def _liveness() -> tuple[int, dict]:
    out = StringIO()
    try:
        call_command("liveness", "--json", stdout=out)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, json.loads(out.getvalue())


def test_liveness_names_what_runs_and_what_is_missing(settings):
    settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS = 0.5
    with celery_worker(queues=("default", "erp"), env=FAST, name="live-light"):
        with dispatcher_process(env=FAST, name="live-dispatcher") as dispatcher:
            wait_for(lambda: "dispatcher" not in _liveness()[1]["missing"], timeout=10)
            code, body = _liveness()
            assert code == 1  # model, cam, sim, report have no worker
            assert body["missing"] == [
                f"worker for queue {q}" for q in ("model", "cam", "sim", "report")
            ]
            (worker,) = body["processes"]["worker"]
            assert worker["queues"] == ["default", "erp"]
            assert body["processes"]["dispatcher"][0]["pid"] == dispatcher.pid
            gauges = metrics_refresh_liveness()
            assert gauges["live_dispatchers"] == 1
            assert gauges["live_workers:erp"] == 1
            assert gauges["live_workers:cam"] == 0
            # A dispatcher killed outright stops beating and drops out within 3 intervals.
            dispatcher.kill()
            wait_for(lambda: "dispatcher" in _liveness()[1]["missing"], timeout=10)
        # A worker stopped cleanly removes its key at once.
    code, body = _liveness()
    assert "worker" not in body["processes"]
    assert "worker for queue default" in body["missing"]
    assert metrics_refresh_liveness()["live_workers:default"] == 0


def test_a_queue_served_by_run_worker_is_not_missing():
    found = {
        "dispatcher": [{"queues": []}],
        "run_worker": [{"queues": ["sim"]}],
        "worker": [{"queues": [q for q in primary_queue_names() if q != "sim"]}],
    }
    assert missing_processes(found) == []
    del found["run_worker"]
    assert missing_processes(found) == ["worker for queue sim"]


def _close_broker_connections_of(process: Process) -> int:
    """Close the process's connections to the broker (as a broker node's loss does to
    its clients). Only its own: the test process's cached connections, and those of
    other tests on this vhost, are left alone."""
    ports = process.local_ports()
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "peer_port", "--no-table-headers"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    rows = (line.split("\t") for line in listed.stdout.splitlines())
    pids = [pid for pid, port in rows if int(port) in ports]
    for pid in pids:
        subprocess.run(
            ["rabbitmqctl", "-q", "close_connection", pid, "test: broker connection lost"],
            capture_output=True,
            check=True,
            timeout=60,
        )
    return len(pids)


@pytest.fixture(scope="class")
def worker(django_db_setup, django_db_blocker):
    """One worker on every queue, for the tests that need nothing else of it. Class-scoped:
    it must be gone before the tests that count the queues no worker serves."""
    with django_db_blocker.unblock(), celery_worker(env=FAST, name="live-all") as worker:
        yield worker


class TestWithAWorkerOnEveryQueue:
    """Tests that share one worker (`worker`)."""

    def test_liveness_passes_when_everything_has_a_process(self, settings, worker):
        settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS = 0.5
        with dispatcher_process(env=FAST, name="live-d"):
            wait_for(lambda: _liveness()[0] == 0, timeout=15)
            out = StringIO()
            call_command("liveness", stdout=out)
            assert "dispatcher" in out.getvalue() and "queues=cam," in out.getvalue()

    def test_a_worker_goes_on_beating_with_its_node_after_its_broker_connection_is_lost(
        self, settings, worker
    ):
        """Celery clears the consumer's timer when its connection is lost: the beat must
        start again with the consumer, or the worker vanishes from liveness."""
        settings.JOBOPS_PROCESS_HEARTBEAT_SECONDS = 0.5
        broker = urlsplit(settings.BROKER_URL)
        wait_for(lambda: _liveness()[1]["processes"].get("worker"), timeout=10)
        (before,) = _liveness()[1]["processes"]["worker"]
        assert before["broker"] == f"{broker.hostname}:{broker.port}"
        assert _close_broker_connections_of(worker) >= 1
        wait_for(lambda: "Connection to broker lost" in worker.log_text(), timeout=15)
        client = redis_client()
        for key in client.scan_iter(match=redis_key("heartbeat", "*")):
            client.delete(key)  # only a beat written after the loss counts now
        (after,) = wait_for(lambda: _liveness()[1]["processes"].get("worker"), timeout=15)
        assert after["pid"] == before["pid"] and after["broker"] == before["broker"]
