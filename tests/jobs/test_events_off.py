"""JOBOPS_EVENTS_PUBLISH off (config/settings.py): no consumer of job events anywhere,
so the transitions write no outbox row (the session setting `jobops.events`, read by
jobs_events_on in jobs/sql/10_entries.sql), while each job still runs and its audit
chain is whole; a consumer configured beside it refuses to start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from jobs.models import EventOutbox
from jobs.processes.erp_bridge import erp_bridge_run
from tests.factories import UserFactory, job_in_state, make_job
from tests.processes import (
    assert_chain_valid,
    celery_worker,
    dispatcher_process,
    job_events,
    job_finished,
)


@pytest.fixture
def events_off() -> Iterator[None]:
    """This test's connection as a process with JOBOPS_EVENTS_PUBLISH off starts its
    own; reset after, since a transactional test's connection outlives it."""
    with connection.cursor() as cursor:
        cursor.execute("SET jobops.events = 'off'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET jobops.events")


@pytest.mark.django_db
def test_with_events_off_a_jobs_transitions_write_no_outbox_row(events_off):
    job = job_in_state("succeeded")
    assert job.status == "succeeded"
    assert job_events(job.id) == ["created", "queued", "started", "succeeded"]
    assert not EventOutbox.objects.filter(job_id=job.id).exists()
    assert_chain_valid(job.id)


@pytest.mark.django_db
def test_with_the_setting_reset_the_transitions_write_their_events_again(events_off):
    with connection.cursor() as cursor:
        cursor.execute("RESET jobops.events")
    job = job_in_state("succeeded")
    assert EventOutbox.objects.filter(job_id=job.id).count() == 4


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker", "events_off")
def test_a_job_runs_to_success_through_processes_with_events_off_and_leaves_no_event():
    """The worker and the dispatcher read JOBOPS_EVENTS_PUBLISH=off and start their
    connections with it; this process created the job as such a process would."""
    off = {"JOBOPS_EVENTS_PUBLISH": "off"}
    with (
        celery_worker(queues=["sim"], name="events-off", env=off) as worker,
        dispatcher_process(name="events-off-dispatcher", env=off),
    ):
        job = make_job(UserFactory(), params={"steps": 2, "step_seconds": 0})
        done = job_finished(job.id, timeout=30)
    assert done.status == "succeeded", worker.log_text()[-3000:]
    assert job_events(job.id) == ["created", "queued", "started", "progress", "succeeded"]
    assert not EventOutbox.objects.exists()
    assert_chain_valid(job.id)


def test_the_erp_bridge_refuses_to_start_with_events_off(settings):
    settings.JOBOPS_EVENTS_PUBLISH = False
    with pytest.raises(ImproperlyConfigured, match="JOBOPS_EVENTS_PUBLISH is off"):
        erp_bridge_run(url="http://127.0.0.1:9/erp/events", idle_timeout=0.1)
