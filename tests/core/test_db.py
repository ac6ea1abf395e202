"""core/db.py: reads bounded in time; prepared statements longer than psycopg caches."""

from __future__ import annotations

import pytest
from django.db import connection

from core.db import _converted, execute_prepared, read_within
from jobs.models import Job

pytestmark = pytest.mark.django_db


def _statement_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        return cursor.fetchone()[0]


def _sleep(seconds: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])


def test_read_within_gives_up_on_a_slow_read_and_the_transaction_goes_on():
    before = _statement_timeout()
    assert read_within(0.05, lambda: _sleep(2)) is None
    assert read_within(2, lambda: Job.objects.count()) == 0  # the transaction is still usable
    assert _statement_timeout() == before  # the enclosing transaction keeps its own


def test_read_within_passes_other_database_errors_on():
    from django.db import ProgrammingError

    def broken() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")

    with pytest.raises(ProgrammingError):
        read_within(1, broken)
    assert Job.objects.count() == 0


def test_a_long_statement_is_converted_once_and_binds_each_executions_values():
    # Over psycopg's own 4 KB cache bound, as long statements are: a placeholder repeated, the
    # values given in another order the second time.
    padding = " " * 5000
    statement = f"SELECT %(a)s::int AS a, %(b)s::text AS b{padding}, %(a)s::int + 1 AS c"
    _converted.cache_clear()
    first = execute_prepared(statement, {"a": 1, "b": "x"})
    second = execute_prepared(statement, {"b": "y", "a": 2})
    assert (list(first), first.columns) == ([(1, "x", 2)], ("a", "b", "c"))
    assert list(second) == [(2, "y", 3)]
    info = _converted.cache_info()
    assert (info.misses, info.hits) == (1, 1)
