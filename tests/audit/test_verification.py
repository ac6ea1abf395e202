"""Each tamper a database superuser can do makes verification fail, naming job and seq."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from audit.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from audit.checkpoints import checkpoint_write
from audit.models import AuditLog
from audit.services import job_chain
from audit.verification import audit_verify
from tests.audit.tampering import tamper
from tests.factories import job_in_state

pytestmark = pytest.mark.django_db


def rows_of(job):
    return list(AuditLog.objects.filter(job_id=job.id).order_by("seq"))


def changed_payload(job):
    tamper(
        'UPDATE audit_logs SET payload = replace(payload, \'"to":"queued"\', \'"to":"failed"\') '
        "WHERE chain = %s AND seq = 2",
        [job_chain(job.id)],
    )
    return 2, "does not match sha256(prev_hash + payload)"


def changed_hash(job):
    tamper(
        "UPDATE audit_logs SET chain_hash = %s WHERE chain = %s AND seq = 3",
        [hashlib.sha256(b"forged").hexdigest(), job_chain(job.id)],
    )
    return 3, "does not match sha256(prev_hash + payload)"


def changed_event_type_column(job):
    tamper(
        "UPDATE audit_logs SET event_type = 'cancelled' WHERE chain = %s AND seq = 4",
        [job_chain(job.id)],
    )
    return 4, "disagrees with the row's columns on event_type"


def deleted_middle_row(job):
    tamper("DELETE FROM audit_logs WHERE chain = %s AND seq = 2", [job_chain(job.id)])
    return 3, "sequence gap: expected seq 2, found 3"


def deleted_tail(job):
    checkpoint_write()
    tamper("DELETE FROM audit_logs WHERE chain = %s AND seq >= 3", [job_chain(job.id)])
    return 4, "recorded by the checkpoint is missing"


def deleted_tail_and_its_checkpoint(job):
    """Issue 7 point 5: the newest checkpoint goes with the tail it recorded, so no
    remaining checkpoint or row misses it; the job row still says `succeeded` while
    the chain ends at `started`."""
    checkpoint_write()
    tamper(
        "DELETE FROM audit_logs WHERE chain = %s AND seq = 4; DELETE FROM audit_checkpoints",
        [job_chain(job.id)],
    )
    return 3, "the job is succeeded but its chain ends at started (seq 3)"


def deleted_tail_in_replica_mode(job):
    """session_replication_role = replica skips every ordinary trigger (superuser only)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("DELETE FROM audit_logs WHERE chain = %s AND seq = 4", [job_chain(job.id)])
    return 3, "the job is succeeded but its chain ends at started (seq 3)"


def deleted_whole_chain_without_checkpoint(job):
    tamper("DELETE FROM audit_logs WHERE chain = %s", [job_chain(job.id)])
    return None, "the job is succeeded but its chain records no transition at all"


def job_row_changed_behind_the_services(job):
    with connection.cursor() as cursor:
        cursor.execute("UPDATE jobs SET status = 'failed' WHERE id = %s", [job.id])
    return 4, "the job is failed but its chain ends at succeeded (seq 4)"


def inserted_out_of_order(job):
    """A well-formed row planted after a gap (the insert trigger disabled to do it)."""
    head = rows_of(job)[-1]
    payload = json.loads(head.payload) | {"seq": 6, "event_type": "progress", "data": {}}
    text = canonical_bytes(payload)
    tamper(
        "INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, actor_id, ts, "
        "payload, prev_hash, chain_hash, part) "
        "VALUES (%s, %s, 6, 'progress', %s, %s, %s, %s, %s, %s, %s)",
        [
            head.chain,
            str(job.id),
            head.actor_type,
            head.actor_id,
            head.ts,
            text.decode(),
            head.chain_hash,
            chain_hash(head.chain_hash, text),
            head.part,
        ],
    )
    return 6, "sequence gap: expected seq 5, found 6"


def deleted_whole_chain(job):
    checkpoint_write()
    tamper("DELETE FROM audit_logs WHERE chain = %s", [job_chain(job.id)])
    return 4, "recorded by the checkpoint is missing"


def forged_row_rehashed(job):
    """A knowledgeable attacker inserts an entry after seq 1 and renumbers and re-hashes
    everything after it: the chain itself is consistent again; the checkpoint is not."""
    checkpoint_write()
    rows = rows_of(job)
    payloads = [json.loads(r.payload) for r in rows]
    forged = {**payloads[1], "event_type": "cancel_requested", "data": {}}
    new_rows, prev = [], GENESIS_HASH
    for seq, payload in enumerate([payloads[0], forged, *payloads[1:]], start=1):
        payload = {**payload, "seq": seq}
        data = canonical_bytes(payload)
        digest = chain_hash(prev, data)
        new_rows.append((payload, data.decode(), prev, digest))
        prev = digest
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(new_rows))
    params = []
    for payload, text, prev_hash, digest in new_rows:
        params += [payload["chain"], str(job.id), payload["seq"], payload["event_type"]]
        params += [payload["actor"]["type"], payload["actor"]["id"]]
        params += [payload["ts"], text, prev_hash, digest, rows[0].part]
    tamper(
        f"DELETE FROM audit_logs WHERE chain = %s; INSERT INTO audit_logs "
        f"(chain, job_id, seq, event_type, actor_type, actor_id, ts, payload, prev_hash, "
        f"chain_hash, part) VALUES {values}",
        [job_chain(job.id), *params],
    )
    assert len(rows_of(job)) == 5
    return 4, "the checkpoint recorded"


def naive_appended_forgery(job):
    head = rows_of(job)[-1]
    payload = json.loads(head.payload) | {"seq": 5, "event_type": "failed"}
    tamper(
        "INSERT INTO audit_logs (chain, job_id, seq, event_type, actor_type, actor_id, ts, "
        "payload, prev_hash, chain_hash, part) "
        "VALUES (%s, %s, 5, 'failed', %s, %s, %s, %s, %s, %s, %s)",
        [
            head.chain,
            str(job.id),
            head.actor_type,
            head.actor_id,
            head.ts,
            canonical_bytes(payload).decode(),
            head.chain_hash,
            "ab" * 32,
            head.part,
        ],
    )
    return 5, "does not match sha256(prev_hash + payload)"


TAMPERS = [
    changed_payload,
    changed_hash,
    changed_event_type_column,
    deleted_middle_row,
    deleted_tail,
    deleted_tail_and_its_checkpoint,
    deleted_tail_in_replica_mode,
    deleted_whole_chain,
    deleted_whole_chain_without_checkpoint,
    job_row_changed_behind_the_services,
    forged_row_rehashed,
    naive_appended_forgery,
    inserted_out_of_order,
]


def test_untouched_history_verifies():
    jobs = [job_in_state("succeeded") for _ in range(3)]
    checkpoint_write()
    report = audit_verify()
    assert report.ok, report.problems
    assert (report.rows_checked, report.chains_checked) == (12, 3)
    assert report.checkpoints_checked == 1 and report.heads_checked == 3
    assert audit_verify(job_ids=[jobs[0].id]).rows_checked == 4


@pytest.mark.parametrize("do_tamper", TAMPERS, ids=lambda f: f.__name__)
def test_tamper_fails_verification_naming_job_and_seq(do_tamper):
    bystander = job_in_state("succeeded")
    job = job_in_state("succeeded")
    seq, what = do_tamper(job)

    report = audit_verify()
    assert not report.ok
    assert any(
        p.job_id == str(job.id) and p.seq == seq and what in p.message for p in report.problems
    ), report.problems
    assert all(p.job_id != str(bystander.id) for p in report.problems)
    if do_tamper is forged_row_rehashed:
        # The rewritten chain is self-consistent: only the signed checkpoint catches it.
        assert {p.kind for p in report.problems} == {"head_changed"}
    assert audit_verify(job_ids=[bystander.id]).ok

    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("verify_audit_chain", stdout=out)
    assert exited.value.code == 1
    assert f"job {job.id}" + (f", seq {seq}" if seq else ":") in out.getvalue()


def test_payload_fields_are_checked_exactly_when_the_fast_check_cannot_tell():
    """Strings that need JSON escaping defeat the fast (concatenated) field check; the
    exact slow path must then accept an honest row rather than report it."""
    from django.db import transaction

    from audit.services import Actor, audit_append

    with transaction.atomic():
        audit_append(chain="ops", event_type="progress", actor=Actor.system('we"ird\\name'))
    report = audit_verify()
    assert report.ok, report.problems
    assert report.rows_checked == 1


def test_whole_chain_missing_is_named_when_asked_for_by_job():
    job = job_in_state("succeeded")
    tamper("DELETE FROM audit_logs WHERE chain = %s", [job_chain(job.id)])
    report = audit_verify(job_ids=[job.id])
    # The job row, still there, also says its chain should not be empty.
    assert [(p.kind, p.job_id) for p in report.problems] == [
        ("chain_missing", str(job.id)),
        ("status_mismatch", str(job.id)),
    ]


@pytest.mark.parametrize(
    ("column", "value", "what"),
    [
        ("prev_hash", "xyz", "does not match the previous row's chain_hash"),
        ("prev_hash", "ü" * 64, "does not match the previous row's chain_hash"),
        ("chain_hash", "ab" * 31, "does not match sha256(prev_hash + payload)"),
        ("chain_hash", "ö" * 64, "does not match sha256(prev_hash + payload)"),
    ],
)
def test_malformed_row_hash_is_reported_by_the_command_not_a_crash(column, value, what):
    """Not hex, wrong length, not ASCII: each is tampering, exit 1 naming job and seq."""
    job = job_in_state("succeeded")
    tamper(
        f"UPDATE audit_logs SET {column} = %s WHERE chain = %s AND seq = 4",
        [value, job_chain(job.id)],
    )
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("verify_audit_chain", stdout=out)
    assert exited.value.code == 1
    assert f"job {job.id}, seq 4: row_broken" in out.getvalue() and what in out.getvalue()
