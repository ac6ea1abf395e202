"""The SQL-file installer (core/sqlfiles.py): the functions PostgreSQL runs are the files'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from core import sqlfiles

pytestmark = pytest.mark.django_db


def _installed_bodies(name: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proname = %s",
            [name],
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("function", sqlfiles.functions(), ids=lambda f: f.name)
def test_every_function_of_the_files_is_installed_with_the_files_body(function):
    assert function.body in _installed_bodies(function.name), (
        f"{function.name} ({function.source.relative_to(sqlfiles.ROOT)}): the database runs "
        "another body than the file's; migrate installs the files (core/sqlfiles.py)"
    )


def test_files_hold_only_create_or_replace_statements():
    for path in sqlfiles.app_files():
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"\$([a-z_]*)\$.*?\$\1\$", "$$", text, flags=re.DOTALL | re.IGNORECASE)
        text = re.sub(r"--[^\n]*", "", text)
        for statement in filter(None, (s.strip() for s in text.split(";"))):
            assert re.match(
                r"CREATE\s+OR\s+REPLACE\s+(FUNCTION|TRIGGER)\b", statement, re.IGNORECASE
            ), f"{path}: not idempotent: {statement[:60]!r}"


def test_files_run_in_app_order_then_file_name_order():
    files = sqlfiles.app_files()
    labels = [config.name for config in apps.get_app_configs()]
    order = [(labels.index(path.parent.parent.name), path.name) for path in files]
    assert order == sorted(order)
    assert [
        a for a in settings.INSTALLED_APPS if a in ("core", "audit", "tenants", "jobs", "dlq")
    ] == [
        "core",
        "audit",
        "tenants",
        "jobs",
        "dlq",
    ]


def _replace_probe(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "probe.sql"
    path.write_text(
        "-- a probe\nCREATE OR REPLACE FUNCTION jobops_sqlfiles_probe() RETURNS text\n"
        f"LANGUAGE sql IMMUTABLE AS $$SELECT '{body}'::text$$;\n",
        encoding="utf-8",
    )
    return path


def test_migrate_installs_the_files_again_over_a_changed_body(tmp_path, monkeypatch):
    (tmp_path / "by_hand").mkdir()
    sqlfiles.install(connection, [_replace_probe(tmp_path / "by_hand", "changed by hand")])
    probe = _replace_probe(tmp_path, "from the file")
    monkeypatch.setattr(sqlfiles, "app_files", lambda *a: [probe])
    assert _installed_bodies("jobops_sqlfiles_probe") == ["SELECT 'changed by hand'::text"]

    call_command("migrate", verbosity=0)

    assert _installed_bodies("jobops_sqlfiles_probe") == ["SELECT 'from the file'::text"]
    # Idempotent: once more changes nothing and fails nothing.
    call_command("migrate", verbosity=0)
    assert _installed_bodies("jobops_sqlfiles_probe") == ["SELECT 'from the file'::text"]


def test_flush_installs_nothing(tmp_path, monkeypatch):
    probe = _replace_probe(tmp_path, "from the file")
    monkeypatch.setattr(sqlfiles, "app_files", lambda *a: [probe])
    sqlfiles.install_after_migrate(apps.get_app_config("core"), using="default", plan=None)
    assert _installed_bodies("jobops_sqlfiles_probe") == []
    sqlfiles.install_after_migrate(apps.get_app_config("core"), using="default", plan=[])
    assert _installed_bodies("jobops_sqlfiles_probe") == ["SELECT 'from the file'::text"]


def test_a_migrate_to_an_older_state_installs_nothing(tmp_path, monkeypatch):
    probe = _replace_probe(tmp_path, "from the file")
    monkeypatch.setattr(sqlfiles, "app_files", lambda *a: [probe])
    monkeypatch.setattr(sqlfiles, "schema_is_current", lambda connection: False)
    sqlfiles.install_after_migrate(apps.get_app_config("core"), using="default", plan=[])
    assert _installed_bodies("jobops_sqlfiles_probe") == []
