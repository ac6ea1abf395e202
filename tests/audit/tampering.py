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
        for table in audit_tables(cursor):
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        cursor.execute(sql, params)
        for table in audit_tables(cursor):
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


def audit_tables(cursor: Any) -> list[str]:
    """The audit tables and every partition of audit_logs (each has triggers of its own)."""
    cursor.execute(
        "SELECT inhrelid::regclass::text FROM pg_inherits "
        "WHERE inhparent = 'audit_logs'::regclass ORDER BY 1"
    )
    return [
        "audit_logs",
        "audit_checkpoints",
        "audit_tree_heads",
        *(r[0] for r in cursor.fetchall()),
    ]
