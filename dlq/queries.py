"""The dlq app's SQL statements, read once from `dlq/queries.sql` (core/queries.py).

Callers run `QUERIES["name"]` with their parameters; no statement is written anywhere
else in the app, and none is assembled at run time.
"""

from __future__ import annotations

from pathlib import Path

from core.queries import Queries, load

QUERIES: Queries = load(Path(__file__).with_name("queries.sql"))
