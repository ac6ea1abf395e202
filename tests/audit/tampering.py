"""Changing audit history as an attacker holding the database superuser role would."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction


def tamper(sql: str, params: Sequence[Any] = ()) -> None:
    """Run `sql` with the audit tables' user triggers off, for this transaction only.

    They are re-enabled before it commits, exactly as a superuser could do it.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_logs DISABLE TRIGGER USER")
        cursor.execute("ALTER TABLE audit_checkpoints DISABLE TRIGGER USER")
        cursor.execute("ALTER TABLE audit_tree_heads DISABLE TRIGGER USER")
        cursor.execute(sql, params)
        cursor.execute("ALTER TABLE audit_logs ENABLE TRIGGER USER")
        cursor.execute("ALTER TABLE audit_checkpoints ENABLE TRIGGER USER")
        cursor.execute("ALTER TABLE audit_tree_heads ENABLE TRIGGER USER")
