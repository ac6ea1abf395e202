"""Fixtures for end-to-end execution tests: real workers and dispatchers as subprocesses."""

from __future__ import annotations

import pytest

from tests.processes import (
    FAST_ENV,
    celery_worker,
    dispatcher_process,
    scripted_env,
    scripted_table,
)
from tests.queues import topology_declare_and_purge


@pytest.fixture
def scripted(settings):
    """The test process accepts script params for tests.processes.SCRIPTED_TYPES and uses
    the fast timings the subprocesses use."""
    scripted_table(settings)
    settings.JOBOPS_LOCK_TIMEOUT = int(FAST_ENV["JOBOPS_LOCK_TIMEOUT"])
    settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS = 0.0
    return settings


@pytest.fixture(scope="module")
def shared_worker(django_db_setup, django_db_blocker):
    """One worker on every queue (scripted handlers for ai/model/cam) and one dispatcher,
    for the tests of a module that need nothing special of them."""
    with django_db_blocker.unblock():
        topology_declare_and_purge()
        with celery_worker(concurrency=2, env=scripted_env(), name="shared") as worker:
            with dispatcher_process(interval=0.2, name="shared-dispatcher") as dispatcher:
                yield worker, dispatcher
