"""Queue controls with a real worker and dispatcher (docs/operator-controls.md): a paused
queue's jobs wait pending and a message that reaches a worker anyway is held without
spending an attempt; resume publishes the backlog; a priority 9 job created behind a
backlog of priority 3 starts before the backlog drains (the broker window)."""

from __future__ import annotations

import pytest

from audit.services import Actor
from jobs.models import Job
from jobs.services import job_create, job_publish
from jobs.services.queues import queue_pause, queue_resume
from tests.factories import StaffFactory, UserFactory, make_job
from tests.polling import wait_for
from tests.processes import celery_worker, dispatcher_process, job_events, job_finished, together
from tests.queues import topology_declare_and_purge

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]

SIM = {"steps": 1, "step_seconds": 0}
OPERATOR = Actor.system("test-operator")


@pytest.fixture(scope="module")
def processes(django_db_setup, django_db_blocker):
    """One worker on `sim` (one process, prefetch 1) and one dispatcher with a broker
    window of 2, started side by side, for both tests: neither needs them fresh (the
    pause, the backlog and the priorities are rows, read at each pass and claim)."""
    with django_db_blocker.unblock():
        topology_declare_and_purge()
        with together(
            celery_worker(queues=["sim"], name="queues-e2e", concurrency=1),
            dispatcher_process(
                interval=0.2, name="queues-e2e-dispatcher", env={"JOBOPS_BROKER_WINDOW": "2"}
            ),
        ) as started:
            yield started


def test_a_paused_queue_waits_holds_a_stray_message_and_runs_its_backlog_on_resume(processes):
    worker, dispatcher = processes
    queue_pause(queue="sim", reason="incident", actor=OPERATOR)
    owner = UserFactory()
    backlog = [make_job(owner=owner, params=SIM) for _ in range(3)]
    # Two more runs than now: the second began after the creations, and passed them by.
    runs = dispatcher.metric("dispatcher_step_runs_total", step="publish")
    dispatcher.wait_for_runs("publish", runs + 2)
    assert {Job.objects.get(id=j.id).status for j in backlog} == {"pending"}
    # Never published (a worker would hold a published one: pending again).
    assert all(job_events(j.id) == ["created"] for j in backlog)
    # A message published before the pause (here: an operator's publish) reaches
    # the worker: it holds the job and acks, no attempt spent.
    assert job_publish(job_id=backlog[0].id)
    wait_for(lambda: "held" in job_events(backlog[0].id), timeout=30, what="the hold")
    held = Job.objects.get(id=backlog[0].id)
    assert (held.status, held.attempts) == ("pending", 0), worker.log_text()[-3000:]
    queue_resume(queue="sim", reason="over", actor=OPERATOR)
    done = [job_finished(j.id, timeout=30) for j in backlog]
    assert [(j.status, j.attempts) for j in done] == [("succeeded", 1)] * 3
    assert job_events(backlog[0].id)[:4] == ["created", "queued", "held", "queued"]


def test_a_priority_9_job_created_last_starts_before_a_priority_3_backlog_drains(processes):
    worker, _ = processes
    owner, staff = UserFactory(), StaffFactory()
    slow = {"steps": 1, "step_seconds": 0.25}
    backlog = [
        job_create(owner=owner, job_type="sim", params=slow, priority=3)[0] for _ in range(12)
    ]
    wait_for(
        lambda: Job.objects.filter(id__in=[j.id for j in backlog], status="succeeded").exists(),
        timeout=30,
        what="the backlog under way",
    )
    urgent, _ = job_create(owner=staff, job_type="sim", params=slow, priority=9, staff=True)
    urgent = job_finished(urgent.id, timeout=30)
    waiting = Job.objects.filter(
        id__in=[j.id for j in backlog], status__in=["pending", "queued"]
    ).count()
    # Within the window: at most the two messages already in the broker and the
    # one the worker holds went before it; the rest of the backlog still waits.
    assert urgent.status == "succeeded", worker.log_text()[-3000:]
    assert waiting >= 5, waiting
