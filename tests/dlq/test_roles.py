"""Roles (docs/security.md#who-is-who): viewer reads, operator also cancels, replays and discards,
superusers manage users and devices. Pages hide what a role cannot do; the server
refuses it (403) when tried anyway."""

from __future__ import annotations

import importlib

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.test import Client

from dlq.bulk import bulk_operation_start
from jobs.models import DeadLetter, Job
from tests.factories import make_job, otp_login, role_user, worker_lost

pytestmark = pytest.mark.django_db
MIGRATION = importlib.import_module("dlq.migrations.0006_roles")
ROLES = MIGRATION.ROLES


def _perms(group: Group) -> set[tuple[str, str]]:
    return set(group.permissions.values_list("content_type__app_label", "codename"))


def test_the_migration_makes_the_viewer_and_operator_groups():
    # The migration's own function on the models of its point in history, as `migrate`
    # runs it: the groups the test database was migrated with may be gone, emptied by
    # the flush of a transactional test that ran earlier on this xdist worker.
    state = MigrationLoader(connection).project_state(("dlq", "0006_roles"))
    MIGRATION.create_roles(state.apps, None)
    viewer, operator = Group.objects.get(name="viewer"), Group.objects.get(name="operator")
    assert _perms(viewer) == set(ROLES["viewer"])
    assert _perms(operator) - _perms(viewer) == {
        ("jobs", "cancel_job"),
        ("jobs", "replay_deadletter"),
        ("jobs", "discard_deadletter"),
    }
    assert not any(app in ("auth", "otp_totp", "otp_static") for app, _ in _perms(operator))


@pytest.fixture
def pages(broker):
    job = worker_lost()
    row = DeadLetter.objects.get(job=job)
    operation = bulk_operation_start(
        action="discard", actor_user=role_user("operator"), justification="x"
    )
    return job, row, operation


def _client(role: str) -> Client:
    return otp_login(Client(), role_user(role))


def test_a_viewer_reads_every_portal_page(pages):
    job, row, operation = pages
    viewer = _client("viewer")
    for url in (
        "/admin/",
        "/admin/dashboard/panel/",
        "/admin/jobs/job/",
        f"/admin/jobs/job/{job.id}/change/",
        "/admin/jobs/deadletter/?state=open",
        f"/admin/jobs/deadletter/{row.id}/change/",
        "/admin/jobs/deadletter/queues/",
        "/admin/jobs/deadletter/queues/panel/",
        "/admin/jobs/deadletter/peek/sim_dlq/",
        "/admin/dlq/bulkoperation/",
        f"/admin/dlq/bulkoperation/{operation.id}/change/",
        "/admin/audit/auditlog/",
        "/admin/audit/auditlog/verify/",
        "/admin/django_celery_results/taskresult/",
    ):
        assert viewer.get(url).status_code == 200, url


def test_pages_hide_from_a_viewer_what_only_an_operator_may_do(pages):
    job, _, operation = pages
    viewer, operator = _client("viewer"), _client("operator")
    for url, marker in (
        (f"/admin/jobs/job/{job.id}/change/", b'id="replay-job"'),
        ("/admin/jobs/deadletter/?state=open", b'id="replay-matching"'),
        ("/admin/jobs/deadletter/?state=open", b"discard_selected"),
        ("/admin/jobs/deadletter/queues/", b"Replay\xe2\x80\xa6"),
        (f"/admin/dlq/bulkoperation/{operation.id}/change/", b'id="stop-operation"'),
    ):
        assert marker not in viewer.get(url).content, url
        assert marker in operator.get(url).content, url
    running = make_job()
    Job.objects.filter(id=running.id).update(
        status="running", locked_by="w", locked_at=job.created_at
    )
    assert b'id="cancel-job"' not in viewer.get(f"/admin/jobs/job/{running.id}/change/").content
    assert b'id="cancel-job"' in operator.get(f"/admin/jobs/job/{running.id}/change/").content


def test_a_viewer_is_refused_every_write_even_by_hand(pages):
    _, row, operation = pages
    pending = make_job()
    viewer = _client("viewer")
    for method, url, data in (
        ("get", "/admin/jobs/deadletter/replay/run/?queue=sim_dlq", {}),
        ("post", "/admin/jobs/deadletter/replay/run/", {"justification": "x"}),
        ("post", "/admin/jobs/deadletter/discard/run/", {"justification": "x"}),
        ("get", f"/admin/jobs/job/{pending.id}/cancel/", {}),
        ("post", f"/admin/jobs/job/{pending.id}/cancel/", {}),
        ("post", f"/admin/dlq/bulkoperation/{operation.id}/stop/", {}),
    ):
        assert getattr(viewer, method)(url, data).status_code == 403, url
    viewer.post(
        "/admin/jobs/job/",
        {"action": "cancel_jobs", "_selected_action": [str(pending.id)], "confirm": "yes"},
    )
    assert Job.objects.get(id=pending.id).status == "pending"
    assert DeadLetter.objects.get(id=row.id).state == "open"
    operation.refresh_from_db()
    assert operation.state == "queued" and not operation.stop_requested


def test_users_and_devices_are_for_superusers_only(pages):
    operator = _client("operator")
    for url in ("/admin/auth/user/", "/admin/auth/group/", "/admin/otp_totp/totpdevice/"):
        assert operator.get(url).status_code == 403, url
    superuser = role_user("operator", is_superuser=True)
    client = otp_login(Client(), superuser)
    assert client.get("/admin/auth/user/").status_code == 200
    assert client.get("/admin/otp_totp/totpdevice/").status_code == 200
