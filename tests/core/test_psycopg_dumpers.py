"""psycopg resolves a dumper registered by class name on first use, in a dict its
connections share, and two threads doing it at once can fail a query (psycopg#1230):
every process resolves them at start-up (core.db.resolve_psycopg_dumpers)."""

from __future__ import annotations

from tests.processes import run_python

CHECK = """
import django; django.setup()
import uuid, datetime, decimal
from psycopg import adapters
from psycopg.adapt import PyFormat
for format in PyFormat:
    dumpers = adapters._dumpers[format]
    for cls in (uuid.UUID, datetime.datetime, datetime.date, decimal.Decimal):
        name = cls.__module__ + "." + cls.__qualname__
        print(format.name, name, cls in dumpers, name in dumpers)
"""


def test_a_fresh_process_has_its_dumpers_resolved_before_any_query():
    result = run_python(CHECK)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")[:-1]
    assert len(lines) == 12, result.stdout + result.stderr
    # Each by its class, none left by its name for a thread to replace.
    assert all(line.endswith("True False") for line in lines), result.stdout
