"""run_worker's host (jobs.processes.executor.Host) in this process, with thread runners: it claims
ahead of its runners in batches into a short buffer, runs every job once, stops with
nothing lost, beats for the jobs it buffers and counts an end whose job was reclaimed as
lost by its type, without a query per job (docs/postgres-executor.md)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client import REGISTRY

from audit.models import AuditLog
from jobs.domain.states import Status
from jobs.models import Job
from jobs.processes.executor import Host
from jobs.services import Finish
from tests.factories import backdate, make_job
from tests.metric_samples import Moved
from tests.polling import wait_for
from tests.processes import assert_chain_valid, job_events

pytestmark = pytest.mark.django_db
# The tests that run a host need its threads to see the jobs: committed data.
committed = pytest.mark.django_db(transaction=True)

QUICK = {"steps": 1, "step_seconds": 0}


@pytest.fixture(autouse=True)
def sim_on_postgres(settings):
    settings.JOBOPS_QUEUE_EXECUTORS = {**settings.JOBOPS_QUEUE_EXECUTORS, "sim": "postgres"}


@contextmanager
def running(host: Host) -> Iterator[Host]:
    """The host's loop on a thread of its own until the block ends (its SIGTERM)."""
    stop = threading.Event()
    thread = threading.Thread(target=host.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield host
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive()


def _transitions(job_id: object) -> list[str]:
    return [event for event in job_events(job_id) if event != "progress"]


def _statuses(jobs: list[Job]) -> Counter[str]:
    return Counter(Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True))


@committed
def test_a_host_claims_ahead_of_its_runners_in_batches_and_runs_every_job_once():
    jobs = [make_job(params=QUICK) for _ in range(24)]
    host = Host(queues=["sim"], concurrency=2, pool="threads", prefetch=8)
    # Runs known to be short, as a host that has run no-ops measures them: how far ahead
    # it claims then is the horizon rule's (tested above), not this machine's speed
    # under load (a sim job also writes its result artefact).
    host.run_time = 0.001
    with running(host):
        wait_for(lambda: _statuses(jobs) == {"succeeded": 24}, timeout=60)
    for job in jobs:
        assert _transitions(job.id) == ["created", "started", "succeeded"]
    assert set(
        Job.objects.filter(id__in=[j.id for j in jobs]).values_list("attempts", flat=True)
    ) == {1}
    assert_chain_valid(jobs[-1].id)
    # One claim writes its jobs' `started` entries in one statement, with one timestamp:
    # some claim took more jobs than the host has runners (it claimed ahead).
    started = AuditLog.objects.filter(job_id__in=[j.id for j in jobs], event_type="started")
    per_claim = Counter(started.values_list("ts", flat=True))
    assert max(per_claim.values()) > 2


def test_a_host_claims_ahead_only_what_its_runners_start_soon():
    host = Host(queues=["sim"], concurrency=2, pool="threads", prefetch=8)
    assert host._room() == 2  # no run time known yet: only for its runners
    host.run_time = 0.001  # no-op runs: up to concurrency x prefetch in hand
    assert host._room() == 16
    host.in_hand = 5
    assert host._room() == 11
    host.run_time, host.in_hand = 1.0, 0  # runs of a second: nothing waits in the buffer
    assert host._room() == 2
    host.run_time = 0.02  # 2 runners x 50 ms / 20 ms: 5 ahead
    assert host._room() == 7


@committed
def test_a_stopped_host_ends_what_it_claimed_and_leaves_the_rest_pending():
    jobs = [make_job(params={"steps": 1, "step_seconds": 0.1}) for _ in range(12)]
    with running(Host(queues=["sim"], concurrency=1, pool="threads", prefetch=4)):
        wait_for(lambda: _statuses(jobs)["succeeded"] >= 2, timeout=30)
    statuses = _statuses(jobs)
    assert set(statuses) == {"succeeded", "pending"} and statuses["pending"] > 0
    for job in Job.objects.filter(id__in=[j.id for j in jobs]):
        expected = ["created"] if job.status == "pending" else ["created", "started", "succeeded"]
        assert _transitions(job.id) == expected


def test_the_heartbeat_refreshes_buffered_jobs_and_finds_a_reclaimed_one_lost():
    kept, taken = make_job(), make_job()
    host = Host(queues=["sim"], concurrency=1, pool="threads", prefetch=2)
    host.run_time = 0.001  # claim ahead: both wait in the buffer, no runner started
    assert host._claim(2) == 2 and len(host.buffer) == 2
    backdate(kept, locked_at=30)
    Job.objects.filter(id=taken.id).update(locked_by="another-host")  # reclaimed meanwhile
    host._beat()
    refreshed = Job.objects.values_list("locked_at", flat=True).get(id=kept.id)
    assert time.time() - refreshed.timestamp() < 10
    assert host.held[taken.id].lost and not host.held[kept.id].lost


def _lost_total(job_type: str) -> float:
    return REGISTRY.get_sample_value("jobs_lost_total", {"type": job_type}) or 0.0


def test_an_end_whose_job_was_reclaimed_is_lost_by_its_type_without_a_query_per_job(
    django_assert_num_queries,
):
    jobs = [make_job() for _ in range(3)]
    host = Host(queues=["sim"], concurrency=3, pool="threads", prefetch=1)
    assert host._claim(3) == 3
    held = list(host.buffer)
    Job.objects.filter(id=jobs[0].id).update(locked_by="another-host")
    before = _lost_total("sim")
    window = [(0.0, h, Finish(h.job.id, h.fence.attempt, Status.SUCCEEDED)) for h in held]
    with django_assert_num_queries(1):  # one statement for the window's successes
        host._write(window)
    assert _lost_total("sim") == before + 1
    assert _statuses(jobs) == {"running": 1, "succeeded": 2}
    assert host.held == {}


@committed
def test_a_host_claims_no_job_of_an_open_connector_and_claims_it_once_the_breaker_closes(
    settings,
):
    """docs/connectors.md: run_worker's claim skips the types whose connector's breaker is
    open (connectors.blocked_types), so their jobs wait `pending` without a `started`
    entry or a spent attempt; closing the breaker lets the next claim take them."""
    from audit.services import Actor
    from jobs.services.connectors import breakers_forget, connector_close, connector_open

    settings.JOBOPS_QUEUE_EXECUTORS = {**settings.JOBOPS_QUEUE_EXECUTORS, "erp": "postgres"}
    settings.JOBOPS_CONNECTOR_CACHE_SECONDS = 0
    operator = Actor.system("test-operator")
    connector_open(name="erp", reason="INC-7: ERP maintenance", actor=operator)
    breakers_forget()
    job = make_job(job_type="erp", params={"event": "order.created"})
    claims = Moved()
    with running(Host(queues=["erp"], concurrency=1, pool="threads", prefetch=4)):
        # Several claims, all begun after the job was made (a claim counts once it has
        # committed), passed it by.
        wait_for(lambda: claims("worker_claims_total") >= 2, timeout=15, what="two claims")
        assert Job.objects.get(id=job.id).status == Status.PENDING
        assert "started" not in job_events(job.id)
        connector_close(name="erp", reason="INC-7: ERP back", actor=operator)
        breakers_forget()
        wait_for(lambda: Job.objects.get(id=job.id).status != Status.PENDING, timeout=15)
    assert "started" in job_events(job.id)
    assert Job.objects.get(id=job.id).attempts == 1
