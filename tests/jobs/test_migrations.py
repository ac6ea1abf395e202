"""Migrations that move things: what was granted before still holds after."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command

from tests.factories import StaffFactory

pytestmark = pytest.mark.django_db(transaction=True)


# Each case migrates the database back before the move and forward again (about 20 s
# of one core): make test runs "merged" (both content types exist: the migration merges
# them), make test-heavy "renamed" too (docs/development.md#the-test-budget).
@pytest.mark.parametrize(
    "jobs_type_exists",
    [pytest.param(False, id="renamed", marks=pytest.mark.heavy), pytest.param(True, id="merged")],
)
def test_a_replay_permission_granted_before_deadletter_moved_to_jobs_still_holds(
    jobs_type_exists,
):
    # The database as the release before the move left it: DeadLetter in the dlq app,
    # its permissions on a dlq content type, granted to an operator. ("merged": a
    # jobs content type for it exists too, e.g. made by a post_migrate in between.)
    call_command("migrate", "dlq", "0003", verbosity=0)
    call_command("migrate", "jobs", "0003", verbosity=0)
    if not jobs_type_exists:
        ContentType.objects.filter(app_label="jobs", model="deadletter").delete()
    old_type, _ = ContentType.objects.get_or_create(app_label="dlq", model="deadletter")
    replay, _ = Permission.objects.get_or_create(
        content_type=old_type, codename="replay_deadletter", name="Can replay dead letters"
    )
    operator = StaffFactory()
    operator.user_permissions.add(replay)

    call_command("migrate", verbosity=0)

    operator = type(operator).objects.get(pk=operator.pk)  # no cached permissions
    assert operator.has_perm("jobs.replay_deadletter")
    # (dlq keeps permissions of its own models, e.g. BulkOperation; none for dead letters.)
    assert not Permission.objects.filter(
        content_type__app_label="dlq", content_type__model="deadletter"
    ).exists()
