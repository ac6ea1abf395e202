"""The flush after a transactional test (`transactional_db`, `django_db(transaction=True)`).

Django ends each TransactionTestCase with `manage.py flush`: one TRUNCATE of every table
(40 here), then post_migrate, whose receivers write back every content type and
permission the TRUNCATE removed (core.sqlfiles' receiver does nothing without a
migration plan). On two loaded cores that took 0.3 to 1.2 s a test, mostly the server's
TRUNCATE: new files for every table and index, made and synced at commit.

`flush` leaves the same state in one transaction, doing less:

- one statement finds the tables Django's flush would empty that hold rows (counted up
  to TRUNCATE_FROM_ROWS), another a digest of every row (ids included) of
  django_content_type and auth_permission;
- with `session_replication_role = replica` for the transaction (superuser only) no
  ordinary trigger fires, neither the append-only tables' guards (they refuse DELETE and
  TRUNCATE, as they must in production) nor the foreign keys' checks: a DELETE empties
  each table of a few rows, in any order, and one TRUNCATE ... CASCADE the large ones.
  TRUNCATE makes new files for every table and index and syncs them at commit (0.13 to
  0.35 s a test on a quiet machine, above a second on a loaded one); a DELETE of a few
  rows takes milliseconds. The large ones, and those whose heap has grown past a few
  pages, are truncated all the same so that no test leaves the next ones scanning (or
  planning around) dead rows. Nothing is altered, so the flush takes
  no exclusive lock but on a large table;
- django_content_type and auth_permission keep their rows and no post_migrate is sent:
  post_migrate's receivers would only write back the same rows, under new ids. That
  holds only while both tables are as the last full flush left them, which the digest
  checks: a test that added, removed or changed a content type or permission
  (tests/jobs/test_migrations.py migrates backwards and forwards) gets Django's own
  flush, post_migrate included, as does a session's first transactional test; the
  digest of what that flush made is the reference for the next ones.

Django's own flush still runs there, so its TRUNCATE keeps the same trigger wrapper
(`execute_sql_flush`). Both are retried on a deadlock (see `retry_on_deadlock`).
docs/development.md#the-test-database says the same for people.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql.operations import DatabaseOperations
from django.test import TransactionTestCase
from psycopg.errors import DeadlockDetected

APPEND_ONLY_TABLES = (
    "audit_logs",
    "audit_checkpoints",
    "audit_tree_heads",
    "audit_partition_archives",
)
# Static after migrate: post_migrate makes them, nothing in the product writes them.
KEPT_TABLES = ("django_content_type", "auth_permission")
FLUSH_ATTEMPTS = 5
# A table with this many rows or more, or whose heap has grown to this size (dead rows of
# earlier DELETEs that autovacuum has not reclaimed yet: the planner reads that size,
# and tests/jobs/test_large_table_plans.py once lost its index to it), is truncated;
# one with fewer rows in less room is emptied by DELETE.
TRUNCATE_FROM_ROWS = 1000
TRUNCATE_FROM_BYTES = 4 * 8192

T = TypeVar("T")

# Per database alias: the digest of KEPT_TABLES as the last full flush left them.
_reference: dict[str, str] = {}


def retry_on_deadlock(attempt: Callable[[], T]) -> T:
    """A module-scoped worker or dispatcher keeps polling the tables while the flush takes
    its exclusive locks one table at a time: PostgreSQL may break the resulting deadlock
    by aborting the flush. A flush is all-or-nothing (one transaction): try it again."""
    for _ in range(FLUSH_ATTEMPTS - 1):
        try:
            return attempt()
        except OperationalError as exc:
            if not isinstance(exc.__cause__, DeadlockDetected):
                raise
            time.sleep(0.2)
    return attempt()


def _triggers(action: str) -> list[str]:
    # audit_logs' partitions carry TRUNCATE triggers of their own (audit/sql/partitions.sql).
    partitions = (
        "DO $$ DECLARE r regclass; BEGIN FOR r IN SELECT inhrelid::regclass FROM pg_inherits "
        "WHERE inhparent = to_regclass('audit_logs') LOOP "
        f"EXECUTE format('ALTER TABLE %s {action} TRIGGER USER', r); END LOOP; END $$"
    )
    return [f"ALTER TABLE {table} {action} TRIGGER USER" for table in APPEND_ONLY_TABLES] + [
        partitions
    ]


def _digest_sql(connection: BaseDatabaseWrapper) -> str:
    """Every row of KEPT_TABLES, each as its row literal (all columns, id included)."""
    parts = [
        f"SELECT '{table}' AS t, k::text AS r FROM {connection.ops.quote_name(table)} k"
        for table in KEPT_TABLES
    ]
    rows = " UNION ALL ".join(parts)
    return f"SELECT md5(string_agg(t || r, E'\\n' ORDER BY t, r)) FROM ({rows}) s"


def _digest(connection: BaseDatabaseWrapper) -> str:
    with connection.cursor() as cursor:
        cursor.execute(_digest_sql(connection))
        return cursor.fetchone()[0]


def flush(connection: BaseDatabaseWrapper) -> bool:
    """Empty every table Django's flush would, but KEPT_TABLES; False (nothing done) when
    KEPT_TABLES are not as the last full flush left them: Django's flush is needed."""
    reference = _reference.get(connection.alias)
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    if reference is None or not set(KEPT_TABLES) <= set(tables):
        return False
    quote = connection.ops.quote_name
    # Each table's rows, counted up to TRUNCATE_FROM_ROWS (a LIMIT: a large table is not
    # counted through), and whether its heap (its partitions' for a partitioned table)
    # has grown to TRUNCATE_FROM_BYTES; only the tables holding rows come back.
    counts = " UNION ALL ".join(
        f"SELECT '{table}' AS t, (SELECT count(*) FROM (SELECT FROM {quote(table)} "
        f"LIMIT {TRUNCATE_FROM_ROWS}) s) AS n, pg_relation_size('{table}') + coalesce(("
        f"SELECT sum(pg_relation_size(inhrelid)) FROM pg_inherits "
        f"WHERE inhparent = '{table}'::regclass), 0) >= {TRUNCATE_FROM_BYTES} AS grown"
        for table in sorted(set(tables) - set(KEPT_TABLES))
    )
    probe = f"SELECT t, n >= {TRUNCATE_FROM_ROWS} OR grown FROM ({counts}) c WHERE n > 0"

    def attempt() -> bool:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(_digest_sql(connection))
            if cursor.fetchone()[0] != reference:
                return False
            cursor.execute(probe)
            holding = cursor.fetchall()
            if holding:
                # A test database need not survive a server crash: not waiting for the
                # WAL on disk saves a sync (its rows are seen by others at once anyway).
                cursor.execute("SET LOCAL synchronous_commit = off")
                # No ordinary trigger fires for this transaction (superuser only): neither
                # the append-only guards nor the foreign keys' checks, so the tables empty
                # in any order with no ALTER TABLE, whose exclusive locks a polling
                # worker deadlocked with.
                cursor.execute("SET LOCAL session_replication_role = replica")
                small = [quote(t) for t, large in holding if not large]
                large = [quote(t) for t, large in holding if large]
                for table in small:
                    cursor.execute(f"DELETE FROM {table}")
                if large:
                    cursor.execute(f"TRUNCATE {', '.join(large)} CASCADE")
        return True

    return retry_on_deadlock(attempt)


@contextmanager
def installed() -> Iterator[None]:
    """`flush` as TransactionTestCase's teardown, Django's flush behind it; Django's
    TRUNCATE with the append-only tables' triggers disabled around it."""
    original_teardown = TransactionTestCase._fixture_teardown
    original_execute = DatabaseOperations.execute_sql_flush

    def fixture_teardown(self: TransactionTestCase) -> None:
        # available_apps and serialized_rollback change what Django's flush does (a
        # subset, CASCADE, no post_migrate): no test here uses them; Django's handles them.
        if self.available_apps is not None or self.serialized_rollback:
            return original_teardown(self)
        aliases = self._databases_names(include_mirrors=False)
        if all(flush(connections[alias]) for alias in aliases):
            return None
        original_teardown(self)
        for alias in aliases:
            _reference[alias] = _digest(connections[alias])
        return None

    def execute_sql_flush(self: DatabaseOperations, sql_list: list[str]) -> Any:
        statements = [*_triggers("DISABLE"), *sql_list, *_triggers("ENABLE")]
        return retry_on_deadlock(lambda: original_execute(self, statements))

    TransactionTestCase._fixture_teardown = fixture_teardown  # type: ignore[method-assign]
    DatabaseOperations.execute_sql_flush = execute_sql_flush  # type: ignore[method-assign]
    try:
        yield
    finally:
        TransactionTestCase._fixture_teardown = original_teardown  # type: ignore[method-assign]
        DatabaseOperations.execute_sql_flush = original_execute  # type: ignore[method-assign]
