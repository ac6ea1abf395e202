"""The flush after a transactional test (tests/flush.py): every row the test made is gone,
the append-only tables' triggers are back, content types and permissions are kept (their
ids too) unless the test changed them, and then made again as Django's flush makes them.

Each test calls the teardown pytest-django runs after a transactional test
(TransactionTestCase._fixture_teardown, which tests/flush.py replaced) itself, so that it
can look at the database after it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, connection, transaction
from django.test import TransactionTestCase

from audit.checkpoints import checkpoint_write
from audit.models import AuditCheckpoint, AuditLog
from tests.factories import OrganisationFactory, UserFactory, job_in_state
from tests.flush import KEPT_TABLES, TRUNCATE_FROM_ROWS

pytestmark = pytest.mark.django_db(transaction=True)


def _teardown() -> None:
    """What pytest-django runs after a transactional test (its test case subclasses this)."""
    TransactionTestCase()._fixture_teardown()


def _tables_holding_rows() -> set[str]:
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        cursor.execute(
            " UNION ALL ".join(f"SELECT '{t}' WHERE EXISTS (SELECT 1 FROM {t})" for t in tables)
        )
        return {row[0] for row in cursor.fetchall()}


def _kept_rows() -> tuple[list[Any], list[Any]]:
    """Every content type and permission, ids included."""
    return (
        list(ContentType.objects.order_by("id").values_list()),
        list(Permission.objects.order_by("id").values_list()),
    )


def _fill() -> None:
    """Rows in many tables: jobs with their audit entries, a checkpoint, users, an
    organisation, a group granted a permission, a user granted one directly."""
    job_in_state("scheduled")
    job_in_state("scheduled", owner=UserFactory(org=OrganisationFactory()))
    assert checkpoint_write() is not None
    group = Group.objects.create(name="flush-test")
    group.permissions.add(Permission.objects.get(codename="view_job"))
    user = UserFactory()
    user.groups.add(group)
    user.user_permissions.add(Permission.objects.get(codename="cancel_job"))


def test_the_flush_empties_every_table_but_content_types_and_permissions_which_keep_their_ids():
    _teardown()  # a session's first flush is Django's own: the reference for the next ones
    kept = _kept_rows()
    _fill()
    assert {
        "jobs",
        "audit_logs",
        "audit_checkpoints",
        "audit_tree_heads",
        "auth_user",
        "organisations",
        "memberships",
        "auth_group",
        "auth_group_permissions",
        "auth_user_groups",
        "auth_user_user_permissions",
    } <= _tables_holding_rows()

    _teardown()

    assert _tables_holding_rows() == set(KEPT_TABLES)
    assert _kept_rows() == kept  # not made again: Django's flush would give new ids


def _relfilenode(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relfilenode FROM pg_class WHERE oid = %s::regclass", [table])
        return cursor.fetchone()[0]


def test_a_large_table_is_truncated_and_the_others_emptied_row_by_row():
    """DELETE is the cheap way to empty a few rows (TRUNCATE makes new files for every
    table and index); a table of TRUNCATE_FROM_ROWS rows or more is truncated, so that
    no test leaves the next ones scanning its dead rows. TRUNCATE gives a table new
    storage (relfilenode); DELETE does not."""
    _teardown()
    Group.objects.bulk_create(Group(name=f"g{i}") for i in range(TRUNCATE_FROM_ROWS))
    job_in_state("scheduled")
    before = {table: _relfilenode(table) for table in ("auth_group", "jobs")}

    _teardown()

    assert _tables_holding_rows() == set(KEPT_TABLES)
    assert _relfilenode("auth_group") != before["auth_group"]
    assert _relfilenode("jobs") == before["jobs"]


def test_a_table_grown_by_dead_rows_is_truncated_though_it_holds_few():
    """A heap that DELETEs left large (autovacuum not yet by) is truncated: the planner
    reads a table's size, so dead rows would steer the plans of the tests after it."""
    _teardown()
    Group.objects.bulk_create(Group(name=f"{i:04}" + "x" * 140) for i in range(500))
    Group.objects.exclude(name__startswith="0000").delete()
    assert Group.objects.count() == 1 < TRUNCATE_FROM_ROWS
    before = _relfilenode("auth_group")

    _teardown()

    assert _tables_holding_rows() == set(KEPT_TABLES)
    assert _relfilenode("auth_group") != before


def test_the_append_only_triggers_are_enabled_again_after_the_flush():
    job_in_state("scheduled")
    _teardown()
    job_in_state("scheduled")
    checkpoint_write()
    for sql in (
        "UPDATE audit_logs SET event_type = 'forged'",
        "TRUNCATE audit_logs",
        "DELETE FROM audit_checkpoints",
        "DELETE FROM audit_tree_heads",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(sql)
    assert AuditLog.objects.count() == 1
    assert AuditCheckpoint.objects.count() == 1


def test_a_test_that_changed_permissions_gets_djangos_flush_and_the_permissions_made_again():
    _teardown()
    types = set(ContentType.objects.values_list("app_label", "model"))
    permissions = set(Permission.objects.values_list("content_type__app_label", "codename", "name"))
    ghost = ContentType.objects.create(app_label="flushtest", model="ghost")
    Permission.objects.create(content_type=ghost, codename="haunt_ghost", name="Can haunt")
    Permission.objects.filter(codename="view_artefact").delete()
    _fill()

    _teardown()

    assert _tables_holding_rows() == set(KEPT_TABLES)
    assert set(ContentType.objects.values_list("app_label", "model")) == types
    assert (
        set(Permission.objects.values_list("content_type__app_label", "codename", "name"))
        == permissions
    )
    # What Django's flush made is the reference now: the next flush keeps it.
    kept = _kept_rows()
    _fill()
    _teardown()
    assert _kept_rows() == kept
    assert _tables_holding_rows() == set(KEPT_TABLES)
