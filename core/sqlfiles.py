"""The current bodies of the SQL functions, installed from `<app>/sql/*.sql` after migrations.

A function's body lives in one file of the repository (e.g. `jobs/sql/transitions.sql`),
not in the migration that first made it: a file holds only idempotent
`CREATE OR REPLACE FUNCTION ...` (and trigger) statements, and `install` runs every
file after each `migrate`, as the connection that migrated (the owner role), in app
order (INSTALLED_APPS: core, audit, tenants, jobs, dlq) and file-name order. A change
of a body is a change of its file; the next deploy's `migrate` installs it.

Only after a migrate that left the schema at its newest state: a migrate to an older
target (or one that stopped short) installs nothing, so that a newer body never runs
against an older schema. A migration that needs a function at its own step carries a
frozen copy of the body it needs (docs/operations/upgrading.md).

`flush` (a TransactionTestCase between tests) sends post_migrate too, without a plan:
it empties tables and leaves functions alone, so nothing is installed then.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.apps import AppConfig, apps
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.executor import MigrationExecutor

# The repository: only its apps' files are installed, never a third-party app's.
ROOT = Path(__file__).resolve().parent.parent

# `CREATE OR REPLACE FUNCTION name(args) ... AS $tag$body$tag$`: the name and the body,
# as PostgreSQL keeps them (pg_proc.proname, pg_proc.prosrc).
FUNCTION = re.compile(
    r"CREATE\s+OR\s+REPLACE\s+FUNCTION\s+(?:public\.)?(?P<name>[a-z_][a-z0-9_]*)\s*\("
    r".*?\bAS\s+\$(?P<tag>[a-z_]*)\$(?P<body>.*?)\$(?P=tag)\$",
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True)
class Function:
    """One function a file defines: its name and its body (the text between the $$)."""

    name: str
    body: str
    source: Path


def app_files(app_configs: list[AppConfig] | None = None) -> list[Path]:
    """Every project app's `sql/*.sql`, in app order, then file-name order."""
    files: list[Path] = []
    for config in app_configs if app_configs is not None else apps.get_app_configs():
        directory = Path(config.path).resolve() / "sql"
        if directory.is_relative_to(ROOT) and directory.is_dir():
            files.extend(sorted(directory.glob("*.sql")))
    return files


def functions(files: list[Path] | None = None) -> list[Function]:
    """The functions the files define, in file order."""
    return [
        Function(match["name"].lower(), match["body"], path)
        for path in (files if files is not None else app_files())
        for match in FUNCTION.finditer(path.read_text(encoding="utf-8"))
    ]


def install(connection: BaseDatabaseWrapper, files: list[Path] | None = None) -> list[Path]:
    """Run each file (all of its statements at once: no parameters, so psycopg sends
    it as it is) on `connection`; returns the files run. Idempotent."""
    files = files if files is not None else app_files()
    with connection.cursor() as cursor:
        for path in files:
            cursor.execute(path.read_text(encoding="utf-8"))
    return files


def schema_is_current(connection: BaseDatabaseWrapper) -> bool:
    """Every migration of every app is applied (nothing left to migrate forwards)."""
    executor = MigrationExecutor(connection)
    return not executor.migration_plan(executor.loader.graph.leaf_nodes())


def install_after_migrate(
    sender: AppConfig, *, using: str = "default", plan: Any = None, **kwargs: Any
) -> None:
    """The post_migrate receiver (connected once, for the core app: post_migrate is sent
    once per app after all migrations ran). `plan` is None for `flush`."""
    if plan is None:
        return
    connection = connections[using]
    if not schema_is_current(connection):
        return
    install(connection)
