"""Batch-created jobs on the PostgreSQL executor (docs/postgres-executor.md): a real
`run_worker` (and a dispatcher for its housekeeping) runs every job of a batch exactly
once, never through the broker. In a module of its own: the Celery module's shared
worker would take the jobs of its queue."""

from __future__ import annotations

import pytest

from tests import handlers
from tests.e2e.test_batch_execution import assert_each_ran_once, retry_creates_nothing, submit_batch
from tests.factories import UserFactory, client_for
from tests.processes import dispatcher_process, run_worker_process, scripted_env

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_run_worker_runs_each_job_of_a_batch_once(scripted, settings):
    settings.JOBOPS_QUEUE_EXECUTORS = {**settings.JOBOPS_QUEUE_EXECUTORS, "model": "postgres"}
    env = {**scripted_env(), "JOBOPS_EXECUTOR_MODEL": "postgres"}
    client = client_for(UserFactory())
    with (
        run_worker_process(queues=["model"], env=env, name="batch-pg"),
        dispatcher_process(interval=0.2, env=env, name="batch-pg-dispatcher"),
    ):
        ids = submit_batch(client, "model", "pg-batch")
        assert_each_ran_once(ids, published=False)
        retry_creates_nothing(client, "model", "pg-batch", ids)
    for job_id in ids:
        assert len(handlers.runs(job_id)) == 1
