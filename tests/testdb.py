"""The test database: migrated once into a template, cloned for each session.

Migrating an empty database (every app's migrations, then the SQL functions and
triggers of core/sqlfiles.py) takes tens of seconds; four xdist workers each doing it
at once on two cores took most of a minute before the first test ran. Instead:

- the template `<TEST_DATABASE_NAME>_tpl_<hash>` is built once, by the first session
  that needs it (migrate, post_migrate and its SQL installer included), and kept for
  the next runs. `<hash>` covers what decides its contents: every migration, every
  `<app>/sql/*.sql`, the apps' `apps.py` (post_migrate receivers), core/sqlfiles.py,
  INSTALLED_APPS and constraints.txt (the third-party apps' migrations). A change to
  any of them names another template; building it drops the older ones of this name.
- the build is serialised by a PostgreSQL advisory lock: the first xdist worker builds,
  the others wait for it and then clone. A template is made under a scratch name and
  renamed when complete, so one that exists is whole (a killed build leaves only the
  scratch database, dropped by the next build).
- each session's own database (`<TEST_DATABASE_NAME>_gwN`, or `<TEST_DATABASE_NAME>`
  without xdist) is `CREATE DATABASE ... TEMPLATE` of it: a file copy, a second or two,
  and dropped when the session ends (unless `--reuse-db`).

docs/development.md#the-test-database says the same for people.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
# What decides the template's contents, beside INSTALLED_APPS (relative to ROOT).
TEMPLATE_INPUTS = ("*/migrations/*.py", "*/sql/*.sql", "*/apps.py", "core/sqlfiles.py")
TEMPLATE_INPUT_FILES = ("constraints.txt",)
BUILD_LOCK_TIMEOUT_SECONDS = 600


def template_hash(installed_apps: list[str]) -> str:
    """A digest of every file that decides what a migrated database holds."""
    digest = hashlib.sha256("\n".join(installed_apps).encode())
    files = {p for pattern in TEMPLATE_INPUTS for p in ROOT.glob(pattern)}
    files |= {ROOT / name for name in TEMPLATE_INPUT_FILES if (ROOT / name).exists()}
    for path in sorted(files):
        if ".venv" in path.parts:
            continue
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def template_name(base: str, installed_apps: list[str]) -> str:
    return f"{base}_tpl_{template_hash(installed_apps)}"


def _maintenance(settings_dict: dict[str, Any]) -> psycopg.Connection[Any]:
    """An autocommit connection to the server's `postgres` database (CREATE/DROP
    DATABASE cannot run inside a transaction, nor connected to the database itself)."""
    return psycopg.connect(
        dbname="postgres",
        user=settings_dict.get("USER") or None,
        password=settings_dict.get("PASSWORD") or None,
        host=settings_dict.get("HOST") or None,
        port=settings_dict.get("PORT") or None,
        autocommit=True,
    )


def _exists(conn: psycopg.Connection[Any], name: str) -> bool:
    row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    return row is not None


def _drop(conn: psycopg.Connection[Any], name: str) -> None:
    # WITH (FORCE): a session a killed run left connected does not block the drop.
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def _build_lock(conn: psycopg.Connection[Any], name: str) -> Iterator[None]:
    """A session-level advisory lock named after the template: one builder at a time."""
    key = zlib.crc32(f"jobops-test-template:{name}".encode())
    conn.execute("SELECT set_config('lock_timeout', %s, false)", [f"{BUILD_LOCK_TIMEOUT_SECONDS}s"])
    conn.execute("SELECT pg_advisory_lock(%s)", [key])
    try:
        yield
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", [key])


def _migrate_into(connection: Any, name: str, verbosity: int) -> None:
    """Run every migration on database `name` through Django's own connection (its
    NAME swapped for the build), post_migrate and the SQL installer included."""
    from django.core.management import call_command

    original = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = name
    try:
        call_command("migrate", verbosity=verbosity, interactive=False, run_syncdb=True)
    finally:
        connection.close()  # no session may stay on a template that is cloned
        connection.settings_dict["NAME"] = original


def ensure_template(connection: Any, base: str, verbosity: int = 0) -> str:
    """The template's name, built first if no complete one exists."""
    from django.conf import settings

    name = template_name(base, list(settings.INSTALLED_APPS))
    with _maintenance(connection.settings_dict) as conn:
        if _exists(conn, name):
            return name
        with _build_lock(conn, name):
            if _exists(conn, name):  # another worker built it while this one waited
                return name
            started = time.monotonic()
            scratch = f"{name}_new"
            _drop(conn, scratch)
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(scratch)))
            _migrate_into(connection, scratch, verbosity)
            conn.execute(
                sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                    sql.Identifier(scratch), sql.Identifier(name)
                )
            )
            # Older templates of this base (other migrations): no longer cloned.
            stale = conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s",
                [base.replace("_", r"\_") + r"\_tpl\_%", name],
            ).fetchall()
            for (old,) in stale:
                _drop(conn, old)
            if verbosity:
                print(f"test template {name} built in {time.monotonic() - started:.1f}s")
    return name


def create_from_template(connection: Any, name: str, template: str, *, keepdb: bool) -> None:
    """The session's database `name` as a copy of `template` (an existing one dropped
    first unless `keepdb`), then Django's connection pointed at it."""
    from django.conf import settings

    with _maintenance(connection.settings_dict) as conn:
        if not (keepdb and _exists(conn, name)):
            _drop(conn, name)
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
    connection.close()
    settings.DATABASES[connection.alias]["NAME"] = name
    connection.settings_dict["NAME"] = name


def destroy(connection: Any, name: str, original: str) -> None:
    """Drop the session's database and point the connection back at `original`."""
    from django.conf import settings

    connection.close()
    settings.DATABASES[connection.alias]["NAME"] = original
    connection.settings_dict["NAME"] = original
    with _maintenance(connection.settings_dict) as conn:
        _drop(conn, name)
