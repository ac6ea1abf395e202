"""Batch-created jobs end to end (docs/api.md#creating-jobs-in-a-batch): a real Celery
worker with a real dispatcher runs every job of a batch exactly once, as it runs a
single create's (the PostgreSQL executor's run_worker: test_batch_postgres_executor.py).
The helpers are shared with that module."""

from __future__ import annotations

import pytest

from jobs.models import Job
from tests import handlers
from tests.factories import UserFactory, client_for
from tests.processes import assert_chain_valid
from tests.processes import job_events as events
from tests.processes import job_finished as finished

pytestmark = [pytest.mark.django_db(transaction=True)]

JOBS = 12


def submit_batch(client, job_type: str, key: str) -> list[str]:
    body = {"jobs": [{"type": job_type, "params": {"do": "noop", "n": n}} for n in range(JOBS)]}
    response = client.post("/api/v1/jobs/batch", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["created"] * JOBS
    return [r["id"] for r in results]


def assert_each_ran_once(ids: list[str], *, published: bool) -> None:
    for job_id in ids:
        done = finished(job_id, timeout=60)
        assert (done.status, done.attempts) == ("succeeded", 1), done.last_error_message
        assert len(handlers.runs(job_id)) == 1 and handlers.overlaps(job_id) == 0
        trail = events(job_id)
        assert trail[0] == "created" and trail[-1] == "succeeded"
        assert trail.count("started") == 1
        assert ("queued" in trail) is published
        assert_chain_valid(job_id)


def retry_creates_nothing(client, job_type: str, key: str, ids: list[str]) -> None:
    body = {"jobs": [{"type": job_type, "params": {"do": "noop", "n": n}} for n in range(JOBS)]}
    again = client.post("/api/v1/jobs/batch", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert [r["id"] for r in again.json()["results"]] == ids
    assert {r["status"] for r in again.json()["results"]} == {"existing"}
    assert Job.objects.count() == JOBS


@pytest.mark.usefixtures("broker")
def test_a_celery_worker_runs_each_job_of_a_batch_once(shared_worker, scripted):
    client = client_for(UserFactory())
    ids = submit_batch(client, "ai", "celery-batch")
    assert_each_ran_once(ids, published=True)
    retry_creates_nothing(client, "ai", "celery-batch", ids)
    for job_id in ids:
        assert len(handlers.runs(job_id)) == 1
