"""Database roles that keep the application from rewriting its own audit trail.

Triggers make audit rows append-only, but the owner of a table may disable its
triggers and a superuser may set `session_replication_role = replica`: an app that
connects as either can rewrite history. So a deployment runs two roles:

- the *owner* role owns every table and runs `manage.py migrate`;
- the *app* role (web, workers, dispatcher) may read and write the job tables, but only
  SELECT and INSERT the audit tables, owns nothing and is no superuser.

`manage.py setup_db_roles` prints (or applies) the SQL; with DEBUG off, web, workers
and the dispatcher refuse to start on a privileged connection
(`refuse_privileged_database_role`) unless JOBOPS_DB_ALLOW_PRIVILEGED says otherwise.
"""

from __future__ import annotations

from typing import Any

import structlog
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError, connection
from psycopg import sql

from audit.queries import QUERIES

logger = structlog.get_logger(__name__)

AUDIT_TABLES = ("audit_logs", "audit_checkpoints", "audit_tree_heads", "audit_partition_archives")


def role_setup_sql(*, owner: str, app: str, database: str) -> list[sql.Composed]:
    """The statements that make `owner` own everything and `app` only what it needs."""
    o, a, db = sql.Identifier(owner), sql.Identifier(app), sql.Identifier(database)
    audit = sql.SQL(", ").join(sql.Identifier(t) for t in AUDIT_TABLES)
    statements = [
        sql.SQL(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {o_lit}) THEN "
            "CREATE ROLE {o} LOGIN NOSUPERUSER NOCREATEROLE; END IF; END $$"
        ),
        sql.SQL(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {a_lit}) THEN "
            "CREATE ROLE {a} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE; END IF; END $$"
        ),
        sql.SQL("GRANT CONNECT ON DATABASE {db} TO {o}, {a}"),
        sql.SQL("GRANT USAGE, CREATE ON SCHEMA public TO {o}"),
        sql.SQL("GRANT USAGE ON SCHEMA public TO {a}"),
        # Every existing table (its identity sequences follow it) now belongs to owner.
        sql.SQL(
            "DO $$ DECLARE t record; BEGIN FOR t IN SELECT tablename FROM pg_tables "
            "WHERE schemaname = 'public' LOOP EXECUTE format("
            "'ALTER TABLE public.%I OWNER TO %I', t.tablename, {o_lit}); END LOOP; END $$"
        ),
        # And the functions migrations created (the audit triggers'), so that later
        # migrations, run as owner, can replace or drop them. Extensions keep theirs.
        sql.SQL(
            "DO $$ DECLARE f record; BEGIN FOR f IN SELECT p.oid::regprocedure AS sig "
            "FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND NOT EXISTS "
            "(SELECT FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e') LOOP "
            "EXECUTE format('ALTER FUNCTION %s OWNER TO %I', f.sig, {o_lit}); END LOOP; END $$"
        ),
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {a}"),
        sql.SQL("REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON {audit} FROM {a}"),
        sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {a}"),
        # The partitions of audit_logs: SELECT only (appends go through audit_logs, whose
        # grants decide); the ALL TABLES grant above gave them UPDATE and DELETE.
        sql.SQL(
            "DO $$ DECLARE r record; BEGIN FOR r IN SELECT inhrelid::regclass AS t "
            "FROM pg_inherits WHERE inhparent = to_regclass('public.audit_logs') LOOP "
            "EXECUTE format('REVOKE ALL ON %s FROM %I', r.t, {a_lit}); "
            "EXECUTE format('GRANT SELECT ON %s TO %I', r.t, {a_lit}); END LOOP; END $$"
        ),
        # The one thing about partitions the app may do: create the next months'
        # (SECURITY DEFINER, owned by owner, audit/sql/partitions.sql).
        sql.SQL(
            "DO $$ BEGIN IF to_regprocedure('public.audit_create_partitions()') IS NOT NULL "
            "THEN REVOKE ALL ON FUNCTION public.audit_create_partitions() FROM PUBLIC; "
            "EXECUTE format('GRANT EXECUTE ON FUNCTION public.audit_create_partitions() "
            "TO %I', {a_lit}); END IF; END $$"
        ),
        # Tables later migrations create (as owner) get the same grants. Not so a
        # partition of audit_logs: the same owner creates it (audit_create_partitions),
        # and the function revokes what these default privileges grant before it
        # attaches it, in one transaction, so no partition is ever writable by the app
        # (database_role_problems checks it).
        sql.SQL(
            "ALTER DEFAULT PRIVILEGES FOR ROLE {o} IN SCHEMA public "
            "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {a}"
        ),
        sql.SQL(
            "ALTER DEFAULT PRIVILEGES FOR ROLE {o} IN SCHEMA public "
            "GRANT USAGE, SELECT ON SEQUENCES TO {a}"
        ),
    ]
    names: dict[str, Any] = {
        "o": o,
        "a": a,
        "db": db,
        "audit": audit,
        "o_lit": sql.Literal(owner),
        "a_lit": sql.Literal(app),
    }
    return [s.format(**names) for s in statements]


def database_role_problems() -> list[str]:
    """Why the current connection could rewrite audit history, if it could."""
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["role_problems"])
        superuser, owner, user = cursor.fetchone()
    problems = []
    if superuser:
        problems.append(f"the database role {user!r} is a superuser")
    if owner:
        problems.append(f"the database role {user!r} owns audit_logs (or is a member of its owner)")
    if problems:  # a superuser or the owner may do anything to a partition anyway
        return problems
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["writable_partitions"])
        problems.extend(
            f"the database role {user!r} may {privilege} the audit partition {table}"
            for table, privilege in cursor.fetchall()
        )
    return problems


def refuse_privileged_database_role() -> None:
    """With DEBUG off, refuse to run web, workers or the dispatcher as a role that could
    disable the audit triggers (see `manage.py setup_db_roles`)."""
    if settings.DEBUG or settings.JOBOPS_DB_ALLOW_PRIVILEGED:
        return
    try:
        problems = database_role_problems()
    except (OperationalError, InterfaceError) as exc:
        # A database outage at boot must not keep web from starting (the API answers
        # 503 meanwhile) nor make workers crash-loop; every new process (the next
        # gunicorn worker, a respawned dispatcher) checks again.
        logger.warning(
            "could not check the database role (database unreachable); checked at the next start",
            error=str(exc),
        )
        return
    finally:
        connection.close()  # opened at boot, before any fork
    if problems:
        raise ImproperlyConfigured(
            "Refusing to start with DEBUG off: "
            + "; ".join(problems)
            + ". Connect as the app role of `manage.py setup_db_roles`, or set "
            "JOBOPS_DB_ALLOW_PRIVILEGED=true to accept that the app can rewrite its audit trail."
        )
