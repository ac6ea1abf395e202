"""The partitioned audit log (docs/architecture.md#partitions): where entries land, what
verification catches in a job partition and in an ops partition, what the app role may
not do to any partition, the dispatcher's step, and a chain across the migration."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, date, datetime

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from audit import partitions
from audit.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from audit.checkpoints import checkpoint_write
from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor, audit_append, job_chain
from audit.verification import audit_verify
from jobs.integrations.metrics import AUDIT_FUTURE_PARTITIONS
from jobs.models import Job
from jobs.services import job_cancel
from tests.audit.tampering import tamper
from tests.audit.test_db_roles import _as, roles  # noqa: F401  (the fixture)
from tests.factories import job_in_state

pytestmark = pytest.mark.django_db


def _month_ahead(months: int) -> datetime:
    """The 15th of the UTC month `months` after this one, noon: a partition exists for
    it (audit_create_partitions keeps three ahead)."""
    now = datetime.now(UTC)
    year, month = divmod(now.month - 1 + months, 12)
    return datetime(now.year + year, month + 1, 15, 12, tzinfo=UTC)


def _where(chain: str) -> list[tuple[int, str, date]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, tableoid::regclass::text, part FROM audit_logs WHERE chain = %s "
            "ORDER BY seq",
            [chain],
        )
        return cursor.fetchall()


def _ops_across_months(monkeypatch) -> tuple[datetime, list[AuditLog]]:
    """Three ops entries this month, then three two months later (the clock moved)."""
    later = _month_ahead(2)
    with transaction.atomic():
        for _ in range(3):
            audit_append(chain=OPS_CHAIN, event_type="queue_paused", actor=Actor.system())
    monkeypatch.setattr(timezone, "now", lambda: later)
    with transaction.atomic():
        for _ in range(3):
            audit_append(chain=OPS_CHAIN, event_type="queue_resumed", actor=Actor.system())
    monkeypatch.undo()
    return later, list(AuditLog.objects.filter(chain=OPS_CHAIN).order_by("seq"))


def test_a_job_chain_stays_in_the_partition_of_the_jobs_month_when_written_later(monkeypatch):
    job = job_in_state("pending")
    assert job.audit_part == partitions.part_for_job(job.created_at)
    later = _month_ahead(3)
    monkeypatch.setattr(timezone, "now", lambda: later)
    job_cancel(job_id=job.id, actor=Actor.system())
    monkeypatch.undo()

    entries = list(AuditLog.objects.filter(chain=job_chain(job.id)).order_by("seq"))
    assert entries[-1].ts == later  # written "three months later"
    home = partitions.partition_name(job.audit_part)
    assert {(table, part) for _, table, part in _where(job_chain(job.id))} == {
        (home, job.audit_part)
    }
    assert audit_verify(job_ids=[job.id]).ok


def test_ops_entries_land_in_their_months_ops_partition_and_verify_as_one_chain(monkeypatch):
    later, entries = _ops_across_months(monkeypatch)
    now = datetime.now(UTC)
    assert [table for _, table, _ in _where(OPS_CHAIN)] == [f"audit_logs_ops_{now:%Y_%m}"] * 3 + [
        f"audit_logs_ops_{later:%Y_%m}"
    ] * 3
    assert [e.part for e in entries] == [partitions.part_for_other(now)] * 3 + [
        partitions.part_for_other(later)
    ] * 3
    # The head lookup found the head in the earlier month: one chain, no fork.
    assert [e.seq for e in entries] == [1, 2, 3, 4, 5, 6]
    assert entries[3].prev_hash == entries[2].chain_hash
    report = audit_verify()
    assert report.ok, report.problems


def test_the_head_of_the_ops_chain_is_read_in_its_months_partition_first():
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "
            "(SELECT seq FROM audit_logs WHERE chain = 'ops' AND part = "
            "audit_part_for_other(now()) ORDER BY seq DESC LIMIT 1)"
        )
        plan = "\n".join(r[0] for r in cursor.fetchall())
    # Pruned to the one ops partition of this month at plan time.
    assert f"audit_logs_ops_{datetime.now(UTC):%Y_%m}" in plan
    assert "audit_logs_job_" not in plan and "audit_logs_legacy" not in plan


@pytest.mark.parametrize("through", ["audit_logs", "the partition"])
def test_an_entry_that_does_not_continue_its_chain_is_refused_in_any_partition(through):
    """The parent's statement trigger sees rows routed to any partition; a partition's
    own sees a statement run on it directly (the parent's does not fire then)."""
    job = job_in_state("succeeded")
    head = AuditLog.objects.filter(chain=job_chain(job.id)).order_by("-seq").first()
    table = "audit_logs" if through == "audit_logs" else partitions.partition_name(head.part)
    with (
        pytest.raises(Exception, match="does not continue its chain"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            f"INSERT INTO {table} (id, chain, job_id, seq, event_type, actor_type, actor_id, "
            "ts, payload, prev_hash, chain_hash, part) VALUES ("
            "nextval(pg_get_serial_sequence('audit_logs', 'id')), %s, %s, %s, 'forged', "
            "'system', 'x', now(), '{}', %s, %s, %s)",
            [head.chain, job.id, head.seq + 2, head.chain_hash, "f" * 64, head.part],
        )


# --- tampering, in a job partition and in an ops partition -----------------------------
# (chain, seq of the row to touch) -> (seq named, words of the problem)
def _payload(chain: str, seq: int):
    tamper(
        "UPDATE audit_logs SET payload = replace(payload, '\"event_type\"', '\"event_typo\"') "
        "WHERE chain = %s AND seq = %s",
        [chain, seq],
    )
    return seq, "does not match sha256(prev_hash + payload)"


def _hash(chain: str, seq: int):
    tamper(
        "UPDATE audit_logs SET chain_hash = %s WHERE chain = %s AND seq = %s",
        [hashlib.sha256(b"forged").hexdigest(), chain, seq],
    )
    return seq, "does not match sha256(prev_hash + payload)"


def _middle_row(chain: str, seq: int):
    tamper("DELETE FROM audit_logs WHERE chain = %s AND seq = %s", [chain, seq])
    return seq + 1, f"sequence gap: expected seq {seq}, found {seq + 1}"


def _tail(chain: str, seq: int):
    checkpoint_write()
    tamper("DELETE FROM audit_logs WHERE chain = %s AND seq > %s", [chain, seq])
    return None, "recorded by the checkpoint is missing"


def _whole_chain(chain: str, seq: int):
    checkpoint_write()
    tamper("DELETE FROM audit_logs WHERE chain = %s", [chain])
    return None, "recorded by the checkpoint is missing"


def _forged_row(chain: str, seq: int):
    """A well-formed entry appended after the head, hashed right, with the triggers off
    and no checkpoint naming it: its hash links, its payload disagrees with its columns."""
    checkpoint_write()
    head = AuditLog.objects.filter(chain=chain).order_by("-seq").first()
    payload = json.loads(head.payload) | {"seq": head.seq + 1}
    text = canonical_bytes(payload)
    tamper(
        "INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, actor_id, ts, "
        "payload, prev_hash, chain_hash, part) VALUES (%s, %s, %s, 'forged', %s, %s, %s, %s, "
        "%s, %s, %s)",
        [
            chain,
            head.job_id,
            head.seq + 1,
            head.actor_type,
            head.actor_id,
            head.ts,
            text.decode(),
            head.chain_hash,
            chain_hash(head.chain_hash, text),
            head.part,
        ],
    )
    return head.seq + 1, "disagrees with the row's columns on event_type"


def _rewritten_chain(chain: str, seq: int):
    """Every entry re-hashed after one changed payload: consistent, but not what the
    signed checkpoint recorded."""
    checkpoint_write()
    rows = list(AuditLog.objects.filter(chain=chain).order_by("seq"))
    prev, updates = GENESIS_HASH, []
    for row in rows:
        payload = json.loads(row.payload)
        if row.seq == seq:
            payload["data"] = {**payload.get("data", {}), "rewritten": True}
        text = canonical_bytes(payload).decode()
        digest = chain_hash(prev, text.encode())
        updates.append((text, prev, digest, row.id, row.part))
        prev = digest
    statements = "; ".join(
        "UPDATE audit_logs SET payload = %s, prev_hash = %s, chain_hash = %s "
        "WHERE id = %s AND part = %s"
        for _ in updates
    )
    tamper(statements, [value for update in updates for value in update])
    return None, "the checkpoint recorded"


TAMPERS = [_payload, _hash, _middle_row, _tail, _whole_chain, _forged_row, _rewritten_chain]


def _caught(chain: str, seq: int | None, what: str) -> None:
    report = audit_verify()
    assert not report.ok
    assert any(
        p.chain == chain and (seq is None or p.seq == seq) and what in p.message
        for p in report.problems
    ), report.problems


@pytest.mark.parametrize("do_tamper", TAMPERS, ids=lambda f: f.__name__.strip("_"))
def test_tamper_in_a_job_partition_is_caught(do_tamper):
    job = job_in_state("succeeded")
    chain = job_chain(job.id)
    assert {table for _, table, _ in _where(chain)} == {partitions.partition_name(job.audit_part)}
    seq, what = do_tamper(chain, 2)
    _caught(chain, seq, what)


@pytest.mark.parametrize("do_tamper", TAMPERS, ids=lambda f: f.__name__.strip("_"))
def test_tamper_in_an_ops_partition_is_caught(do_tamper, monkeypatch):
    later, _ = _ops_across_months(monkeypatch)
    # Seq 5: in the later month's ops partition (4 opens it, 6 closes it).
    assert _where(OPS_CHAIN)[4][1] == f"audit_logs_ops_{later:%Y_%m}"
    seq, what = do_tamper(OPS_CHAIN, 5)
    _caught(OPS_CHAIN, seq, what)


# --- the app role and the partitions --------------------------------------------------
def _partitions() -> list[str]:
    return [p.name for p in partitions.list_partitions()]


@pytest.mark.django_db(transaction=True)
def test_the_app_role_can_neither_change_nor_detach_nor_drop_any_partition(roles):  # noqa: F811
    owner, app = roles
    newest = max(_partitions())  # ops of the third month ahead
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {newest}")  # as if that month had never been made
    # The app role may create the missing partition, and nothing else about it.
    with _as(app) as conn:
        assert conn.execute("SELECT audit_create_partitions()").fetchone()[0] == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'audit_logs'::regclass"
        )
        assert cursor.fetchall() == [(owner,)]
    assert newest in _partitions()
    for table in _partitions():
        for statement in (
            f"UPDATE {table} SET event_type = 'forged'",
            f"DELETE FROM {table}",
            f"TRUNCATE {table}",
            f"ALTER TABLE audit_logs DETACH PARTITION {table}",
            f"DROP TABLE {table}",
            f"ALTER TABLE {table} DISABLE TRIGGER USER",
            f"INSERT INTO {table} SELECT * FROM audit_logs LIMIT 0",
        ):
            with (
                _as(app) as conn,
                pytest.raises(psycopg.errors.InsufficientPrivilege),
            ):
                conn.execute(statement)
    assert _partitions().count(newest) == 1
    with _as(app) as conn:
        owned = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relowner = current_user::regrole"
        ).fetchone()[0]
    assert owned == 0


def test_the_dispatcher_step_creates_missing_partitions_and_sets_the_gauge(monkeypatch):
    newest = max(_partitions())
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {newest}")
    monkeypatch.setattr(partitions, "_last_run", None)
    AUDIT_FUTURE_PARTITIONS.set(-1)
    assert partitions.future_months(partitions.list_partitions()) == partitions.MONTHS_AHEAD - 1

    assert partitions.partitions_step() == 1
    assert newest in _partitions()
    assert AUDIT_FUTURE_PARTITIONS._value.get() == partitions.MONTHS_AHEAD
    # Not again within the hour.
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {newest}")
    assert partitions.partitions_step() == 0
    assert newest not in _partitions()


def test_partition_names_and_parts():
    created = datetime(2026, 11, 30, 23, 59, tzinfo=UTC)
    assert partitions.part_for_job(created) == date(2026, 11, 1)
    assert partitions.part_for_other(created) == date(2026, 11, 2)
    assert partitions.partition_name(date(2026, 11, 1)) == "audit_logs_job_2026_11"
    assert partitions.partition_name(date(2026, 11, 2)) == "audit_logs_ops_2026_11"
    assert partitions.partition_name(partitions.LEGACY_PART) == "audit_logs_legacy"
    with pytest.raises(ValueError):
        partitions.partition_name(date(2026, 11, 3))


# --- a chain across the migration ------------------------------------------------------
@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_job_chain_that_spans_the_migration_verifies():
    """A job with entries before the partitioned log and after it: the migration back
    (every row into one table again, jobs.audit_part gone) and forward again (the table
    attached as audit_logs_legacy, the job's part 1970-01-01): its next entries follow
    it into the legacy partition, and the whole chain verifies."""
    job = job_in_state("pending")
    try:
        call_command("migrate", "audit", "0009_annotated", verbosity=0)
        call_command("migrate", "jobs", "0028_webhooks", verbosity=0)
    finally:
        call_command("migrate", verbosity=0)
    job.refresh_from_db()
    assert job.audit_part == partitions.LEGACY_PART
    before = _where(job_chain(job.id))
    assert {table for _, table, _ in before} == {"audit_logs_legacy"}

    job_cancel(job_id=job.id, actor=Actor.system())
    after = _where(job_chain(job.id))
    assert len(after) > len(before)
    assert {table for _, table, _ in after} == {"audit_logs_legacy"}
    fresh = job_in_state("pending")
    assert {table for _, table, _ in _where(job_chain(fresh.id))} == {
        partitions.partition_name(partitions.part_for_job(fresh.created_at))
    }
    checkpoint_write()
    report = audit_verify()
    assert report.ok, report.problems
    assert Job.objects.get(id=job.id).status == "cancelled"
