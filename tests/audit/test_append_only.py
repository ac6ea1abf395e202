"""audit_logs, audit_checkpoints and audit_tree_heads are append-only: in PostgreSQL and in
the ORM."""

from __future__ import annotations

import subprocess
import uuid

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from audit.checkpoints import checkpoint_write
from audit.errors import AuditImmutableError
from audit.models import AuditCheckpoint, AuditLog
from audit.services import OPS_CHAIN, Actor, audit_append
from audit.verification import audit_verify
from tests.factories import job_in_state
from tests.processes import database_url

pytestmark = pytest.mark.django_db

REFUSALS = [
    "UPDATE audit_logs SET event_type = 'forged'",
    "DELETE FROM audit_logs",
    "TRUNCATE audit_logs",
    "UPDATE audit_checkpoints SET key_id = 'forged'",
    "DELETE FROM audit_checkpoints",
    "TRUNCATE audit_checkpoints",
    "UPDATE audit_tree_heads SET root_hash = 'forged'",
    "DELETE FROM audit_tree_heads",
    "TRUNCATE audit_tree_heads",
]


@pytest.mark.parametrize("sql", REFUSALS)
def test_triggers_refuse_change_even_for_the_table_owner(sql):
    job_in_state("succeeded")
    checkpoint_write()
    before = (AuditLog.objects.count(), AuditCheckpoint.objects.count())
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql)
    assert (AuditLog.objects.count(), AuditCheckpoint.objects.count()) == before
    assert not AuditLog.objects.filter(event_type="forged").exists()


def test_model_save_of_an_existing_row_raises():
    entry = job_in_state("succeeded").id and AuditLog.objects.first()
    entry.event_type = "forged"
    with pytest.raises(AuditImmutableError):
        entry.save()
    checkpoint = checkpoint_write()
    with pytest.raises(AuditImmutableError):
        checkpoint.save()
    assert not AuditLog.objects.filter(event_type="forged").exists()


def test_model_delete_raises():
    job_in_state("succeeded")
    with pytest.raises(AuditImmutableError):
        AuditLog.objects.first().delete()
    with pytest.raises(AuditImmutableError):
        checkpoint_write().delete()
    assert AuditLog.objects.count() == 4


def test_queryset_update_and_delete_raise():
    job_in_state("succeeded")
    checkpoint_write()
    for queryset in (AuditLog.objects.all(), AuditCheckpoint.objects.all()):
        with pytest.raises(AuditImmutableError):
            queryset.update(prev_hash="0" * 64)
        with pytest.raises(AuditImmutableError):
            queryset.delete()
    assert AuditLog.objects.count() == 4
    assert AuditCheckpoint.objects.count() == 1


@pytest.fixture
def app_role(transactional_db):
    """A login role like a deployment's app role: SELECT and INSERT only, no superuser."""
    name = f"jobops_app_{uuid.uuid4().hex[:10]}"
    job_in_state("succeeded")  # committed rows, so the row triggers would have something to see
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {name} LOGIN NOSUPERUSER")
        cursor.execute(
            f"GRANT SELECT, INSERT ON audit_logs, audit_checkpoints, audit_tree_heads TO {name}"
        )
        cursor.execute(
            "GRANT USAGE ON SEQUENCE audit_logs_id_seq, audit_checkpoints_id_seq, "
            f"audit_tree_heads_id_seq TO {name}"
        )
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP OWNED BY {name}")
            cursor.execute(f"DROP ROLE {name}")


def psql_as(role: str, sql: str) -> subprocess.CompletedProcess[str]:
    s = connection.settings_dict
    return subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-h", s["HOST"] or "127.0.0.1",
         "-p", str(s["PORT"] or 5432), "-U", role, "-d", s["NAME"], "-c", sql],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip


@pytest.mark.parametrize("sql", REFUSALS[:3])
def test_app_role_is_refused_update_delete_truncate_by_psql(app_role, sql):
    assert psql_as(app_role, "SELECT count(*) FROM audit_logs").returncode == 0
    refused = psql_as(app_role, sql)
    assert refused.returncode != 0
    assert "permission denied" in refused.stderr
    assert AuditLog.objects.count() == 4


def test_triggers_refuse_even_an_app_role_granted_update_and_delete(app_role):
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT UPDATE, DELETE, TRUNCATE ON audit_logs TO {app_role}")
    url = database_url(USER=app_role, PASSWORD="")
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in REFUSALS[:3]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                conn.execute(sql)
    assert AuditLog.objects.count() == 4


def test_app_role_without_update_grant_can_append_and_checkpoint(app_role):
    """The checkpoint's barrier is an advisory lock: no UPDATE grant (which LOCK TABLE
    would need) is required of the app role."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET ROLE {app_role}")
    try:
        with transaction.atomic():
            audit_append(chain=OPS_CHAIN, event_type="dlq_discarded", actor=Actor.system())
        checkpoint = checkpoint_write()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
    assert checkpoint is not None
    assert audit_verify().ok


@pytest.mark.parametrize(
    ("seq_delta", "prev"),
    [(1, "0" * 64), (2, None), (0, None), (-1, None)],
    ids=["wrong-prev-hash", "seq-gap", "seq-repeated", "seq-behind"],
)
def test_an_insert_that_does_not_continue_the_chain_is_refused(seq_delta, prev):
    job = job_in_state("succeeded")
    head = AuditLog.objects.filter(job_id=job.id).order_by("-seq").first()
    with (
        pytest.raises(DatabaseError, match="does not continue its chain"),
        transaction.atomic(),
        connection.cursor() as c,
    ):
        c.execute(
            "INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, actor_id, ts, "
            "payload, prev_hash, chain_hash, part) VALUES (%s, %s, %s, 'forged', 'system', 'x', "
            "now(), '{}', %s, %s, %s)",
            [
                head.chain,
                job.id,
                head.seq + seq_delta,
                prev or head.chain_hash,
                "f" * 64,
                head.part,
            ],
        )
    assert AuditLog.objects.filter(job_id=job.id).count() == head.seq
