"""The tenants app's SQL statements (tenants/queries.sql), read once."""

from __future__ import annotations

from pathlib import Path

from core.queries import load

QUERIES = load(Path(__file__).with_name("queries.sql"))
