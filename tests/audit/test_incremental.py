"""Incremental verification: what came after a checkpoint known from outside the database."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import TestCase
from django.urls import reverse
from django.utils import timezone

from audit.canonical import GENESIS_HASH, canonical_bytes
from audit.checkpoints import checkpoint_write
from audit.incremental import Trusted, audit_verify_incremental, trusted_start
from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor, audit_append, audit_payload
from audit.verification_runs import FULL, INCREMENTAL, last_run, verification_tile
from jobs.services import job_claim
from tests.audit.tampering import tamper
from tests.factories import job_in_state, make_job


def exported_checkpoint():
    """A checkpoint, committed as far as its export is concerned (on_commit runs)."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        return checkpoint_write()


def ops_entry(name: str = "test_event") -> AuditLog:
    with transaction.atomic():
        return audit_append(chain=OPS_CHAIN, event_type=name, actor=Actor.system())


def run(*args: str) -> tuple[int, str]:
    from io import StringIO

    out = StringIO()
    try:
        call_command("verify_audit_chain", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def export(tmp_path, settings):
    settings.AUDIT_CHECKPOINT_EXPORT = str(tmp_path / "checkpoints.jsonl")
    return settings.AUDIT_CHECKPOINT_EXPORT


@pytest.fixture
def history(export):
    """Before the trusted checkpoint: a finished job, a queued one, the ops chain. After
    it: a new job, the queued job started, an ops entry; a second checkpoint; then one
    more job that no checkpoint covers yet."""
    job_in_state("succeeded")
    queued = job_in_state("queued")
    ops_entry()
    trusted = exported_checkpoint()
    make_job()
    job_claim(job_id=queued.id, locked_by="w1")
    ops_entry()
    later = exported_checkpoint()
    make_job()
    return {"trusted": trusted, "later": later, "queued": queued}


@pytest.mark.django_db
def test_new_valid_entries_pass_and_the_output_names_the_range(history):
    trusted = history["trusted"]
    new_rows = AuditLog.objects.filter(id__gt=trusted.last_audit_id).count()
    code, out = run("--since-checkpoint", trusted.checkpoint_hash)
    assert code == 0, out
    assert f"audit ids {trusted.last_audit_id + 1}.." in out
    assert f"checkpoints {trusted.id}..{history['later'].id}" in out
    assert "Only the new entries and their link to it were proven" in out
    report = audit_verify_incremental(trusted_start(trusted.checkpoint_hash))
    assert report.ok, report.problems
    assert report.rows_checked == new_rows
    assert report.from_checkpoint_id == trusted.id
    # The queued job's and the ops chain's links rest on the trusted checkpoint's heads.
    assert report.links_on_database == 0
    assert report.uncovered_chains == 1
    # Without a hash: from the newest exported checkpoint.
    code, out = run("--since-checkpoint")
    assert code == 0
    assert f"audit ids {history['later'].last_audit_id + 1}.." in out


@pytest.mark.django_db
def test_a_changed_new_entry_is_caught(history):
    job = history["queued"]
    row = AuditLog.objects.get(job_id=job.id, event_type="started")
    tamper(
        "UPDATE audit_logs SET payload = replace(payload, 'started', 'succeeded') WHERE id = %s",
        [row.id],
    )
    code, out = run("--since-checkpoint", history["trusted"].checkpoint_hash)
    assert code == 1
    assert f"job {job.id}, seq {row.seq}: row_broken" in out


@pytest.mark.django_db
def test_a_forged_new_row_in_a_checkpointed_range_is_caught(export):
    make_job()
    trusted = exported_checkpoint()
    make_job()
    # A gap of ids: an append rolled back.
    with pytest.raises(RuntimeError), transaction.atomic():
        make_job()
        raise RuntimeError("rolled back")
    make_job()
    exported_checkpoint()
    taken = set(AuditLog.objects.filter(id__gt=trusted.last_audit_id).values_list("id", flat=True))
    gap = next(i for i in range(min(taken), max(taken)) if i not in taken)
    chain, ts = f"job:{uuid.uuid4()}", timezone.now()
    payload = canonical_bytes(
        audit_payload(
            chain=chain,
            seq=1,
            ts=ts,
            event_type="created",
            actor=Actor.system(),
            job_id=chain[4:],
            data={},
        )
    )
    digest = hashlib.sha256(bytes.fromhex(GENESIS_HASH) + payload).hexdigest()
    # Every column copied from a real row (whatever the table holds besides, e.g. a
    # partition key), then the forged values over it.
    forged = {
        "id": gap,
        "chain": chain,
        "job_id": chain[4:],
        "seq": 1,
        "event_type": "created",
        "actor_type": "system",
        "actor_id": "jobops",
        "ts": ts.isoformat(),
        "payload": payload.decode(),
        "prev_hash": GENESIS_HASH,
        "chain_hash": digest,
    }
    tamper(
        "INSERT INTO audit_logs SELECT (jsonb_populate_record(NULL::audit_logs,"
        " to_jsonb(a) || %s::jsonb)).* FROM audit_logs a WHERE a.id = %s",
        [json.dumps(forged), min(taken)],
    )
    code, out = run("--since-checkpoint", trusted.checkpoint_hash)
    assert code == 1
    assert f"chain {chain}" in out and "head_unnamed" in out


@pytest.mark.django_db
def test_a_changed_pre_checkpoint_head_that_a_new_entry_links_to_is_caught(history):
    job = history["queued"]
    old = AuditLog.objects.get(job_id=job.id, event_type="queued")
    new = AuditLog.objects.get(job_id=job.id, event_type="started")
    assert old.id <= history["trusted"].last_audit_id < new.id
    # Rewrite the old head and carry the rewrite into the new entry, so that the new
    # entry's own hash and its link to the database's row are both consistent.
    forged = hashlib.sha256(b"rewritten").hexdigest()
    new_hash = hashlib.sha256(bytes.fromhex(forged) + new.payload.encode()).hexdigest()
    tamper("UPDATE audit_logs SET chain_hash = %s WHERE id = %s", [forged, old.id])
    tamper(
        "UPDATE audit_logs SET prev_hash = %s, chain_hash = %s WHERE id = %s",
        [forged, new_hash, new.id],
    )
    code, out = run("--since-checkpoint", history["trusted"].checkpoint_hash)
    assert code == 1
    assert f"job {job.id}, seq {new.seq}: link_broken" in out
    assert "the trusted checkpoint names" in out


@pytest.mark.django_db
def test_a_database_checkpoint_that_differs_from_the_exported_one_fails_naming_it(history):
    trusted = history["trusted"]
    tamper(
        "UPDATE audit_checkpoints SET checkpoint_hash = %s WHERE id = %s",
        ["ab" * 32, trusted.id],
    )
    code, out = run("--since-checkpoint")
    # The newest exported one is `later`: it still verifies, but its link does not.
    assert code == 1
    code, out = run("--since-checkpoint", trusted.checkpoint_hash)
    assert code == 1
    assert f"checkpoint {trusted.id}: checkpoint_differs" in out
    assert trusted.checkpoint_hash in out


@pytest.mark.django_db
def test_a_trusted_hash_the_database_never_had_fails(history):
    code, out = run("--since-checkpoint", "cd" * 32)
    assert code == 1
    assert "is not in the database" in out


@pytest.mark.django_db
def test_a_forged_later_checkpoint_is_caught(history):
    later = history["later"]
    tamper("UPDATE audit_checkpoints SET signature = %s WHERE id = %s", ["00" * 32, later.id])
    code, out = run("--since-checkpoint", history["trusted"].checkpoint_hash)
    assert code == 1
    assert f"checkpoint {later.id}: checkpoint_broken" in out


@pytest.mark.django_db
def test_a_deleted_new_head_is_caught(history):
    job = history["queued"]
    head = AuditLog.objects.get(job_id=job.id, event_type="started")
    tamper("DELETE FROM audit_logs WHERE id = %s", [head.id])
    code, out = run("--since-checkpoint", history["trusted"].checkpoint_hash)
    assert code == 1
    assert f"job {job.id}, seq {head.seq}: head_missing" in out


@pytest.mark.django_db
def test_a_link_no_checkpoint_names_rests_on_the_database_row(export):
    job = job_in_state("queued")
    exported_checkpoint()
    ops_entry()  # a checkpoint that does not name the job's chain
    trusted = exported_checkpoint()
    job_claim(job_id=job.id, locked_by="w1")
    report = audit_verify_incremental(Trusted(trusted.checkpoint_hash))
    assert report.ok, report.problems
    assert report.links_on_database == 1
    old = AuditLog.objects.get(job_id=job.id, event_type="queued")
    tamper("UPDATE audit_logs SET payload = payload || ' ' WHERE id = %s", [old.id])
    report = audit_verify_incremental(Trusted(trusted.checkpoint_hash))
    assert [p.kind for p in report.problems] == ["link_broken"]


@pytest.mark.django_db
def test_usage_errors_exit_2(settings):
    settings.AUDIT_CHECKPOINT_EXPORT = ""
    from django.core.management.base import CommandError

    with pytest.raises(CommandError) as caught:
        call_command("verify_audit_chain", "--since-checkpoint")
    assert caught.value.returncode == 2
    with pytest.raises(CommandError) as caught:
        call_command("verify_audit_chain", "--since-checkpoint", "nothex")
    assert caught.value.returncode == 2


@pytest.mark.django_db
def test_recorded_runs_appear_on_the_dashboard_tile(history, otp_admin_client):
    assert run("--since-checkpoint", "--record")[0] == 0
    incremental = last_run(INCREMENTAL)
    assert incremental["ok"] and incremental["range"].startswith("audit ids ")
    page = otp_admin_client.get(reverse("admin:index")).content.decode()
    assert 'id="verification-incremental"' in page
    assert incremental["range"] in page
    # No full walk yet: stale, said on the tile and at the top.
    assert 'id="verification-stale"' in page
    assert "full audit verification has not run for more than 8 days" in page

    assert run("--record")[0] == 0
    assert last_run(FULL)["ok"]
    page = otp_admin_client.get(reverse("admin:index")).content.decode()
    assert 'id="verification-stale"' not in page
    assert "full: " in page and "every entry and checkpoint" in page
    assert "ops chain, event audit_verified" in page
    # The record is itself on the chain, and verifies.
    assert run()[0] == 0


@pytest.mark.django_db
def test_a_full_run_older_than_8_days_is_stale(history):
    assert run("--record")[0] == 0
    assert not verification_tile()["full_stale"]
    # Backdate the record's column as an old run would have it (the tile reads `ts`).
    record = AuditLog.objects.get(event_type="audit_verified")
    tamper(
        "UPDATE audit_logs SET ts = ts - interval '9 days' WHERE id = %s",
        [record.id],
    )
    tile = verification_tile()
    assert tile["full_stale"]
    assert tile["full"]["ok"]


@pytest.mark.django_db
def test_an_exported_later_checkpoint_deleted_with_its_tail_is_caught(history):
    later = history["later"]
    tamper("DELETE FROM audit_checkpoints WHERE id >= %s", [later.id])
    tamper("DELETE FROM audit_logs WHERE id > %s", [history["trusted"].last_audit_id])
    code, out = run("--since-checkpoint", history["trusted"].checkpoint_hash)
    assert code == 1
    assert f"checkpoint {later.id}: checkpoint_missing" in out
