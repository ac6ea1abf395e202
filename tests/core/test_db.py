"""core/db.py: reads bounded in time."""

from __future__ import annotations

import pytest
from django.db import connection

from core.db import read_within
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
