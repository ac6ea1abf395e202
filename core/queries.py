"""Named SQL statements, each written once as literal text in its app's `queries.sql`.

A file holds blocks such as

    -- name: claim_job
    -- Claims the job for a worker (what it does and why, as comment lines).
    UPDATE jobs SET ... WHERE ...;

The statement is the text after the name and description lines up to the next
`-- name:`, without its trailing semicolon. Variants are separate named statements or
parameters: nothing is assembled from fragments at run time, so the SQL a reader finds
in the file is the SQL PostgreSQL runs. A file is read once, when its module loads; a
duplicate, empty or malformed block fails that load, not a request.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

NAME_LINE = re.compile(r"^-- name: (?P<name>[a-z_][a-z0-9_]*)\s*$")


class QueryFileError(ValueError):
    """A queries.sql file that does not parse: the message names the file and block."""


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: str


class Queries(Mapping[str, str]):
    """The statements of one queries.sql, by name: `QUERIES["claim_job"]` is its SQL."""

    def __init__(self, queries: dict[str, Query], source: Path) -> None:
        self._queries = queries
        self.source = source

    def __getitem__(self, name: str) -> str:
        try:
            return self._queries[name].sql
        except KeyError:
            raise KeyError(f"{self.source.name} has no statement named {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._queries)

    def __len__(self) -> int:
        return len(self._queries)

    def query(self, name: str) -> Query:
        """The statement with its description."""
        self[name]  # the same KeyError as a lookup
        return self._queries[name]


def parse(text: str, source: Path) -> Queries:
    """The named statements of a queries.sql text."""
    queries: dict[str, Query] = {}
    name: str | None = None
    lines: list[str] = []

    def close() -> None:
        if name is None:
            if any(line.strip() and not line.startswith("--") for line in lines):
                raise QueryFileError(f"{source}: SQL before the first '-- name:' line")
            return
        description = []
        body = list(lines)
        while body and body[0].startswith("--"):
            description.append(body.pop(0).removeprefix("--").strip())
        sql = "\n".join(body).strip().removesuffix(";").strip()
        if not sql:
            raise QueryFileError(f"{source}: statement {name!r} is empty")
        if name in queries:
            raise QueryFileError(f"{source}: statement {name!r} is defined twice")
        queries[name] = Query(name=name, description=" ".join(description), sql=sql)

    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("-- name:"):
            match = NAME_LINE.match(line)
            if match is None:
                raise QueryFileError(f"{source}:{number}: malformed name line {line!r}")
            close()
            name, lines = match["name"], []
        else:
            lines.append(line)
    close()
    return Queries(queries, source)


def load(path: Path) -> Queries:
    """The named statements of the queries.sql at `path` (read once, by the caller's
    module-level constant)."""
    return parse(path.read_text(encoding="utf-8"), path)


# The core app's own statements (core/queries.sql).
QUERIES = load(Path(__file__).with_name("queries.sql"))
