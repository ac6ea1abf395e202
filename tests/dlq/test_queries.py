"""The dlq app's SQL (dlq/queries.sql, docs/architecture.md#layers): every statement is
named, described and used, and no module of the app runs SQL text of its own."""

from __future__ import annotations

import re

from dlq.queries import QUERIES
from tests.processes import ROOT

DLQ = ROOT / "dlq"


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for path in sorted(DLQ.rglob("*.py"))
        if "migrations" not in path.parts
    }


def test_every_statement_is_described_and_used_by_name():
    code = "\n".join(_sources().values())
    assert list(QUERIES) == ["claim_bulk_operation"]
    for name in QUERIES:
        assert QUERIES.query(name).description, name
        assert f'QUERIES["{name}"]' in code, f"{name} is never run"


def test_the_app_runs_no_sql_text_of_its_own():
    runs = re.compile(r"\.(?:execute|executemany|raw)\(\s*(?!QUERIES\[)")
    found = [
        f"{path}: {match.group(0)!r}"
        for path, text in _sources().items()
        for match in runs.finditer(text)
    ]
    assert found == []
