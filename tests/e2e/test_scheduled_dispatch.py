"""A scheduled job starts on time with a real dispatcher and worker, also when the
dispatcher restarts while it waits (docs/operator-controls.md#scheduled-jobs)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditLog
from audit.verification import audit_verify
from jobs.models import Job
from jobs.services.creation import job_create
from tests.factories import UserFactory
from tests.processes import (
    celery_worker,
    dispatcher_process,
    job_events,
    job_finished,
    together,
)
from tests.queues import topology_declare_and_purge

# A dispatcher restarted under a scheduled job, with a real worker: `heavy`
# (docs/development.md#the-test-budget). make test holds the step in process: due jobs
# move to pending, and the step says when to look again (tests/jobs/test_scheduling.py).
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("broker"),
    pytest.mark.heavy,
]

# The dispatchers' loop interval: long, so that only the scheduled step's wake-up (the
# next run_at) can start the job on time.
INTERVAL = 30


def test_a_scheduled_job_starts_on_time_across_a_dispatcher_restart():
    topology_declare_and_purge()
    # An hour ahead: however long the dispatchers take to start on a loaded machine,
    # each looks at the job before it is due (evidence, not a race with the clock).
    job, _ = job_create(
        owner=UserFactory(),
        job_type="sim",
        params={"steps": 1, "step_seconds": 0},
        run_at=timezone.now() + timedelta(hours=1),
    )
    assert job.status == "scheduled"
    with together(
        celery_worker(queues=["sim"], name="sched-worker"),
        dispatcher_process(interval=INTERVAL, name="sched-d1"),
    ) as (worker, first):
        # Its first pass, after the job was made, looked at it (a step's run counts
        # once it has ended) and left it for later: no early start.
        first.wait_for_runs("scheduled", 1)
        assert Job.objects.get(id=job.id).status == "scheduled"
        assert job_events(job.id) == ["created"]
        first.stop()  # the restart: the first dispatcher is gone before the second starts
        with dispatcher_process(interval=INTERVAL, name="sched-d2") as second:
            second.wait_for_runs("scheduled", 1)
            assert Job.objects.get(id=job.id).status == "scheduled"
            # The hour passes: the job is due in two seconds. The restarted dispatcher
            # knows only the table, which its step reads again at least once a second.
            run_at = timezone.now() + timedelta(seconds=2)
            Job.objects.filter(id=job.id).update(run_at=run_at)
            done = job_finished(job.id, timeout=40)
            worker.terminate()  # both shut down side by side
            second.terminate()
    assert done.status == "succeeded"
    started = AuditLog.objects.get(job_id=job.id, event_type="started").ts
    due = AuditLog.objects.get(job_id=job.id, event_type="due").ts
    assert due >= run_at
    print(f"run_at -> due {due - run_at}, -> started {started - run_at}")
    # What tells the wake-up from the loop is the interval: without it the dispatcher
    # would move the job at its next pass, 30 s later. A third of the interval separates
    # the two however loaded the machine is. Issue 29's "within 2 s" is a latency,
    # measured on a quiet machine (the print above, docs/operator-controls.md), which a
    # loaded one broke once in the worker's pick-up alone (2.56 s, the wake-up on time).
    assert due - run_at < timedelta(seconds=INTERVAL / 3), due - run_at
    assert started - run_at < timedelta(seconds=INTERVAL / 3), started - run_at
    assert audit_verify(job_ids=[job.id]).ok
