"""A create that a real database conflict stops answers 409 ERR-JOB-409 in the envelope
(docs/api.md#errors): the client retries, and the retry hears what changed.

The conflict is PostgreSQL's own: another transaction deletes the project the create
names after the create resolved it. The create's INSERT then waits on the project row's
lock for its foreign-key check, and when the delete commits the key is violated.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection

from audit.models import AuditLog
from jobs.models import EventOutbox, Job
from tests.factories import OrganisationFactory, ProjectFactory, UserFactory, client_for
from tests.polling import wait_for

JOBS = "/api/v1/jobs"
BODY = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}, "project": "web"}


def _create_waits_on_a_lock(pid: int) -> bool:
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database() AND pid <> %s",
            [pid],
        ).fetchone()
        return bool(row and row[0])


@pytest.mark.django_db(transaction=True)
def test_a_create_whose_project_is_deleted_meanwhile_is_a_409_the_client_can_retry(broker):
    acme = OrganisationFactory(slug="acme")
    project = ProjectFactory(organisation=acme, slug="web")
    api = client_for(UserFactory(org=acme))
    answers: list = []

    with psycopg.connect(**connection.get_connection_params()) as deleter:
        # Another transaction deletes the project and holds the row until it commits.
        deleter.execute("DELETE FROM projects WHERE id = %s", [project.pk])

        def create() -> None:
            try:
                answers.append(api.post(JOBS, BODY, format="json"))
            finally:
                connection.close()

        creator = threading.Thread(target=create)
        creator.start()
        # The create read the project (the delete is not committed) and its INSERT now
        # waits for the row's lock to check its foreign key.
        pid = deleter.info.backend_pid
        wait_for(lambda: _create_waits_on_a_lock(pid), what="the create to wait on the project")
        deleter.commit()
        creator.join(timeout=20)

    assert not creator.is_alive()
    [response] = answers
    assert response.status_code == 409, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json() == {
        "error": {
            "code": "ERR-JOB-409",
            "message": "The job changed concurrently; retry the request.",
            "details": {},
        }
    }
    # Nothing half-made: no row, no `created` entry, no event.
    assert not Job.objects.exists()
    assert not AuditLog.objects.filter(event_type="created").exists()
    assert not EventOutbox.objects.exists()
    # The retry the 409 invites hears why: the project is gone.
    retry = api.post(JOBS, BODY, format="json")
    assert retry.status_code == 422 and retry.json()["error"]["code"] == "ERR-TENANT-422"
