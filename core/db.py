"""Running the hot, hand-written statements (jobs/sql.py) with server-side binding.

Django's psycopg backend binds parameters on the client: each execute renders the whole
statement as text, escaping every value in Python, and PostgreSQL parses and plans it
anew. For the few statements every job runs (create, claim, finish) that cost more than
the work itself. Here the parameters travel separately and the statement is prepared on
first use per connection (psycopg keeps the prepared statements of its connection), so
later executions send only the values.

Errors come out as Django's database exceptions (IntegrityError, OperationalError...),
exactly as from `connection.cursor()`, and the statement joins the caller's transaction
(it runs on Django's own connection).
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connection


def execute_prepared(statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Execute `statement` with server-side binding, prepared; returns its rows."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(statement, params, prepare=True)  # type: ignore[call-overload]
            return cursor.fetchall() if cursor.description else []
