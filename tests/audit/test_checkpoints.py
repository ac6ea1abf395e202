"""Signed checkpoints: written only on change, chained, HMAC-signed, keys rotate."""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from audit import checkpoints
from audit.checkpoints import checkpoint_write, checkpoint_write_if_due
from audit.models import AuditCheckpoint, AuditLog
from audit.services import Actor, audit_append, job_chain
from audit.tree import checkpoint_heads
from audit.verification import audit_verify
from jobs.services import job_claim
from tests.audit.tampering import tamper
from tests.factories import job_in_state, make_job
from tests.polling import wait_for

GENESIS = "0" * 64


def heads(checkpoint):
    checkpoint.refresh_from_db()
    return checkpoint_heads(checkpoint.payload, checkpoint.heads)


def head_of(job):
    row = AuditLog.objects.filter(job_id=job.id).order_by("-seq").first()
    return (row.chain, row.seq, row.chain_hash)


@pytest.mark.django_db
def test_nothing_is_written_when_no_chain_changed():
    assert checkpoint_write() is None
    job_in_state("succeeded")
    assert checkpoint_write() is not None
    assert checkpoint_write() is None
    assert AuditCheckpoint.objects.count() == 1


@pytest.mark.django_db
def test_checkpoint_records_changed_heads_chained_and_signed(settings):
    first_job, second_job = job_in_state("succeeded"), make_job()
    first = checkpoint_write()
    assert sorted(heads(first)) == sorted([head_of(first_job), head_of(second_job)])
    assert first.prev_hash == GENESIS
    assert first.last_audit_id == AuditLog.objects.order_by("-id").first().id
    assert first.key_id == settings.AUDIT_SIGNING_KEY_ID
    key = settings.AUDIT_SIGNING_KEYS[first.key_id].encode()
    assert (
        first.checkpoint_hash
        == hashlib.sha256(bytes.fromhex(first.prev_hash) + first.payload.encode()).hexdigest()
    )
    assert (
        first.signature
        == hmac.new(key, bytes.fromhex(first.checkpoint_hash), hashlib.sha256).hexdigest()
    )

    # Only the chain that changed since is in the next one, chained to the first.
    job_claim(job_id=second_job.id, locked_by="w1")
    second = checkpoint_write()
    assert heads(second) == [head_of(second_job)]
    assert second.prev_hash == first.checkpoint_hash
    report = audit_verify()
    assert report.ok, report.problems
    assert (report.checkpoints_checked, report.heads_checked) == (2, 3)


@pytest.mark.django_db
def test_many_changed_chains_split_into_chained_checkpoints(monkeypatch):
    monkeypatch.setattr(checkpoints, "MAX_HEADS", 2)
    jobs = [make_job() for _ in range(5)]
    last = checkpoint_write()
    written = list(AuditCheckpoint.objects.order_by("id"))
    assert len(written) == 3 and last == written[-1]
    assert [c.prev_hash for c in written[1:]] == [c.checkpoint_hash for c in written[:-1]]
    assert sorted(h for c in written for h in heads(c)) == sorted(head_of(j) for j in jobs)
    assert {c.last_audit_id for c in written} == {AuditLog.objects.order_by("-id").first().id}
    assert audit_verify().ok


@pytest.mark.django_db
def test_write_if_due_honours_the_interval(settings):
    settings.AUDIT_CHECKPOINT_SECONDS = 60
    now = timezone.now()
    job = make_job()
    assert checkpoint_write_if_due(now=now) is not None
    job_claim(job_id=job.id, locked_by="w1")
    assert checkpoint_write_if_due(now=now + timedelta(seconds=30)) is None
    later = checkpoint_write_if_due(now=now + timedelta(seconds=61))
    assert later is not None and heads(later) == [head_of(job)]


@pytest.mark.django_db
def test_rotated_key_still_verifies_while_kept_and_fails_once_dropped(settings):
    settings.AUDIT_SIGNING_KEY_ID = "k1"
    settings.AUDIT_SIGNING_KEYS = {"k1": "first-secret-key-for-tests"}
    make_job()
    old = checkpoint_write()
    settings.AUDIT_SIGNING_KEY_ID = "k2"
    settings.AUDIT_SIGNING_KEYS = {"k1": "first-secret-key-for-tests", "k2": "second-secret"}
    make_job()
    new = checkpoint_write()
    assert (old.key_id, new.key_id) == ("k1", "k2")
    assert audit_verify().ok

    settings.AUDIT_SIGNING_KEYS = {"k2": "second-secret"}
    report = audit_verify()
    assert not report.ok
    assert [(p.checkpoint_id, p.kind) for p in report.problems] == [(old.id, "checkpoint_broken")]
    assert "unknown key id 'k1'" in report.problems[0].message

    settings.AUDIT_SIGNING_KEYS = {"k1": "not-the-same-secret", "k2": "second-secret"}
    report = audit_verify()
    assert "HMAC signature does not verify" in report.problems[0].message


@pytest.mark.django_db
def test_forged_checkpoint_columns_fail_verification():
    make_job()
    checkpoint = checkpoint_write()
    # Lowering last_audit_id would make the next checkpoint re-cover old rows; the
    # signed payload still says the truth, so the columns give themselves away.
    tamper("UPDATE audit_checkpoints SET last_audit_id = 0 WHERE id = %s", [checkpoint.id])
    report = audit_verify()
    assert not report.ok
    assert "columns disagree with the signed payload" in report.problems[0].message


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("signature", "é" * 64),  # crashed verification with TypeError before
        ("signature", ""),
        ("checkpoint_hash", "zz" * 32),  # not hex
        ("checkpoint_hash", "ab"),  # wrong length
        ("prev_hash", "é"),
    ],
)
@pytest.mark.django_db
def test_malformed_checkpoint_values_are_reported_not_a_crash(column, value):
    make_job()
    checkpoint = checkpoint_write()
    tamper(f"UPDATE audit_checkpoints SET {column} = %s WHERE id = %s", [value, checkpoint.id])
    report = audit_verify()
    assert not report.ok
    assert report.problems and report.problems[0].kind


def _hold_open_append(job_id, appended: threading.Event, release: threading.Event) -> None:
    try:
        with transaction.atomic():
            audit_append(
                chain=job_chain(job_id), event_type="progress", actor=Actor.system(), job_id=job_id
            )
            appended.set()
            release.wait(timeout=10)
    finally:
        connection.close()


@contextmanager
def _append_in_flight(job_id) -> Iterator[None]:
    """An audit append held open in another session: it holds the checkpoint barrier."""
    appended, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_open_append, args=(job_id, appended, release))
    holder.start()
    try:
        assert appended.wait(timeout=10), "the append never started"
        yield
    finally:
        release.set()
        holder.join(timeout=10)


def _a_session_waits_for_a_lock() -> bool:
    """Whether a session of this database waits for an advisory lock (the barrier)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE NOT l.granted AND l.locktype = 'advisory' AND d.datname = current_database())"
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_checkpoint_waits_for_in_flight_appends_so_none_is_skipped():
    """An append whose id is below the checkpoint's last_audit_id but which commits
    after it would never be covered; the checkpoint waits for it instead."""
    job = make_job()
    appended, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_open_append, args=(job.id, appended, release))
    holder.start()
    assert appended.wait(timeout=10)
    result = {}

    def write() -> None:
        try:
            result["cp"] = checkpoint_write()
        finally:
            connection.close()

    writer = threading.Thread(target=write)
    writer.start()
    # Evidence that it reached the barrier and waits there (not merely slow to start).
    wait_for(_a_session_waits_for_a_lock, timeout=4, what="the checkpoint to wait for a lock")
    assert writer.is_alive()  # blocked behind the uncommitted append
    release.set()
    holder.join(timeout=10)
    writer.join(timeout=10)
    assert heads(result["cp"]) == [head_of(job)]
    # The head it recorded is the append it waited for.
    assert AuditLog.objects.filter(job_id=job.id).order_by("-seq").first().event_type == "progress"


@pytest.mark.django_db(transaction=True)
def test_checkpoint_is_skipped_when_appends_do_not_drain(monkeypatch):
    monkeypatch.setattr(checkpoints, "LOCK_TIMEOUT", "100ms")
    job = make_job()
    with _append_in_flight(job.id):
        assert checkpoint_write() is None
    assert heads(checkpoint_write()) == [head_of(job)]


@pytest.mark.django_db(transaction=True)
def test_write_if_due_takes_no_lock_when_nothing_changed(settings, monkeypatch, caplog):
    """The dispatcher calls it every loop; with nothing new it must not queue on the
    barrier (which would hold every append meanwhile)."""
    settings.AUDIT_CHECKPOINT_SECONDS = 0
    monkeypatch.setattr(checkpoints, "LOCK_TIMEOUT", "100ms")
    skipped = "audit checkpoint skipped"
    job = make_job()
    assert checkpoint_write() is not None

    # Nothing committed since: no lock is asked for, so the open append does not matter.
    with _append_in_flight(job.id):
        assert checkpoint_write_if_due() is None
    assert skipped not in caplog.text
    # That append committed: now it queues on the barrier behind the next open one...
    with _append_in_flight(job.id):
        assert checkpoint_write_if_due() is None
    assert skipped in caplog.text
    # ... and writes once nothing holds it.
    assert heads(checkpoint_write_if_due()) == [head_of(job)]


@pytest.mark.django_db
def test_each_committed_checkpoint_hash_goes_to_the_structured_log(tmp_path, settings):
    from django.test import TestCase
    from structlog.testing import capture_logs

    settings.AUDIT_CHECKPOINT_EXPORT = ""
    make_job()
    with capture_logs() as logs, TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint = checkpoint_write()
    [line] = [e for e in logs if e["event"] == "audit_checkpoint_written"]
    assert (line["id"], line["checkpoint_hash"]) == (checkpoint.id, checkpoint.checkpoint_hash)

    # A rolled-back checkpoint is never exported (on commit only).
    make_job()
    with capture_logs() as logs, TestCase.captureOnCommitCallbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            checkpoint_write()
            raise RuntimeError("rolled back")
    assert not [e for e in logs if e["event"] == "audit_checkpoint_written"]


@pytest.mark.django_db
def test_an_unwritable_export_file_keeps_the_checkpoint_and_logs_an_error(tmp_path, settings):
    from django.test import TestCase
    from structlog.testing import capture_logs

    settings.AUDIT_CHECKPOINT_EXPORT = str(tmp_path / "missing-dir" / "checkpoints.jsonl")
    make_job()
    with capture_logs() as logs, TestCase.captureOnCommitCallbacks(execute=True):
        checkpoint = checkpoint_write()
    assert AuditCheckpoint.objects.filter(id=checkpoint.id).exists()
    events = {e["event"]: e for e in logs}
    assert events["audit_checkpoint_written"]["checkpoint_hash"] == checkpoint.checkpoint_hash
    assert events["audit_checkpoint_export_failed"]["path"] == settings.AUDIT_CHECKPOINT_EXPORT
