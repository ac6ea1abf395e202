"""A Celery claim wakes the dispatcher (NOTIFY jobs_pending) only when the place it
frees in its queue's broker window has a backlog to take (jobs_claim_delivered,
jobs/sql/20_transitions.sql), and a backlog behind a full window still drains at the
pace of the claims, not of the dispatcher's clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection

from jobs.queries import PENDING_CHANNEL
from jobs.services.worker import job_claim
from tests.factories import UserFactory, job_in_state, make_job
from tests.processes import celery_worker, dispatcher_process, job_finished

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def listening() -> Iterator[psycopg.Connection[Any]]:
    """A connection of its own LISTENing on jobs_pending from now on (the creations
    before it committed their notifications already)."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as conn:
        conn.execute(f"LISTEN {PENDING_CHANNEL}")
        yield conn


def first_payload(conn: psycopg.Connection[Any]) -> str | None:
    return next((n.payload for n in conn.notifies(timeout=5, stop_after=1)), None)


def claim_then_mark(conn: psycopg.Connection[Any], job_id: Any) -> str | None:
    """Claim the job (committed), then send a marker: the first notification the
    listener reads is the claim's ('') if it sent one, else the marker."""
    assert job_claim(job_id=job_id, locked_by="w1") is not None
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as sender:
        sender.execute(f"NOTIFY {PENDING_CHANNEL}, 'marker'")
    return first_payload(conn)


def test_a_claim_with_a_backlog_behind_its_queues_window_notifies():
    owner = UserFactory()
    queued = job_in_state("queued", owner=owner)
    make_job(owner)  # pending in the same queue: what the freed place takes
    with listening() as conn:
        assert claim_then_mark(conn, queued.id) == ""


def test_a_claim_without_a_backlog_in_its_queue_does_not_notify():
    owner = UserFactory()
    queued = job_in_state("queued", owner=owner)
    make_job(owner, job_type="report", params={})  # another queue's backlog: not this one's
    with listening() as conn:
        assert claim_then_mark(conn, queued.id) == "marker"


def test_a_claim_of_the_last_pending_job_of_its_queue_does_not_notify():
    """The claimed job itself was the backlog (a message for a `pending` job)."""
    pending = make_job(UserFactory())
    with listening() as conn:
        assert claim_then_mark(conn, pending.id) == "marker"


# A real worker and dispatcher for 20 s: in `make test-heavy` (docs/development.md#the-test-budget).
@pytest.mark.heavy
def test_a_backlog_five_times_the_window_drains_on_the_claims_notifications():
    """Window 2, ten jobs, a dispatcher whose clock runs its steps once a minute: only
    the claims' notifications can refill the window in time."""
    owner = UserFactory()
    params = {"steps": 1, "step_seconds": 0}
    with (
        celery_worker(queues=["sim"], name="claim-notify-e2e", concurrency=1) as worker,
        dispatcher_process(
            interval=60, name="claim-notify-dispatcher", env={"JOBOPS_BROKER_WINDOW": "2"}
        ),
    ):
        jobs = [make_job(owner, params=params) for _ in range(10)]
        done = [job_finished(j.id, timeout=20) for j in jobs]
    assert [j.status for j in done] == ["succeeded"] * 10, worker.log_text()[-3000:]
