"""Audit archives: written from the database, verified offline with the public key only."""

from __future__ import annotations

import base64
import gzip
import io
import json
from datetime import timedelta
from io import StringIO

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone

from audit.canonical import canonical_bytes, chain_hash
from audit.checkpoints import checkpoint_write
from audit.models import AuditCheckpoint, AuditLog
from audit.services import OPS_CHAIN, Actor, audit_append, job_chain
from audit.signing import load_public_key, verifies
from audit.tree import canonical_heads, heads_tree
from jobs.models import Job
from tests.audit.tampering import tamper
from tests.factories import job_in_state, make_job
from tests.processes import free_port, operator_env, run_manage

TOMORROW = (timezone.now() + timedelta(days=1)).date().isoformat()


def purge(job: Job) -> None:
    """What purge leaves of a job: its chain, closed by a `purged` entry."""
    with transaction.atomic():
        audit_append(
            chain=job_chain(job.id), event_type="purged", actor=Actor.system(), job_id=job.id
        )


def ops_event(name: str = "dlq_reconciled") -> None:
    with transaction.atomic():
        audit_append(chain=OPS_CHAIN, event_type=name, actor=Actor.system(), data={"n": 1})


def archive(path, until: str = TOMORROW) -> str:
    out = io.StringIO()
    call_command("audit_archive", "--until", until, "--out", str(path), stdout=out)
    return out.getvalue()


def verify(path, *args: str) -> tuple[int, str]:
    """verify_audit_chain --archive through call_command: (exit status, stdout)."""
    out = io.StringIO()
    try:
        call_command("verify_audit_chain", "--archive", str(path), *args, stdout=out)
    except SystemExit as exited:
        return int(exited.code), out.getvalue()
    return 0, out.getvalue()


def read_lines(path) -> list[bytes]:
    with gzip.open(path, "rb") as file:
        return file.read().splitlines(keepends=True)


def write_lines(path, lines: list[bytes]) -> None:
    with gzip.open(path, "wb") as file:
        file.write(b"".join(lines))


def tampered(path, lines: list[bytes]) -> str:
    """Write `lines` as the archive, verify it: it must exit 1; return what it printed."""
    write_lines(path, lines)
    status, out = verify(path)
    assert status == 1, out
    return out


def with_header(header, lines: list[bytes]) -> list[bytes]:
    return [canonical_bytes(header) + b"\n", *lines[1:]]


def line_of(lines: list[bytes], chain: str, seq: int) -> int:
    for index, line in enumerate(lines[1:], 1):
        entry = json.loads(line)["entry"]
        if (entry["chain"], entry["seq"]) == (chain, seq):
            return index
    raise AssertionError(f"no line for {chain} seq {seq}")


@pytest.fixture
def archived(tmp_path):
    """An archive of one purged job (5 entries), the ops chain (2), and a job still open."""
    job, open_job = job_in_state("succeeded"), make_job()
    purge(job)
    ops_event()
    ops_event()
    checkpoint_write()
    path = tmp_path / "audit.jsonl.gz"
    archive(path)
    return job, open_job, path


@pytest.mark.django_db
def test_an_archive_holds_the_closed_chains_and_verifies(archived):
    job, open_job, path = archived
    header, *entries = (json.loads(line) for line in read_lines(path))
    assert [c["chain"] for c in header["chains"]] == sorted([job_chain(job.id), OPS_CHAIN])
    assert [(e["entry"]["chain"], e["entry"]["seq"]) for e in entries] == sorted(
        [(job_chain(job.id), s) for s in range(1, 6)] + [(OPS_CHAIN, 1), (OPS_CHAIN, 2)]
    )
    assert entries[4]["entry"]["event_type"] == "purged"
    assert job_chain(open_job.id) not in {e["entry"]["chain"] for e in entries}
    assert header["public_key"] == call_public_key()
    status, out = verify(path)
    assert status == 0, out
    assert "Audit archive intact: 7 rows in 2 chains, 1 checkpoints (3 heads)" in out
    assert verify(path, "--public-key", call_public_key())[0] == 0


@pytest.mark.django_db
def test_any_one_changed_byte_of_an_entry_is_named_by_job_and_seq(archived):
    job, _, path = archived
    lines = read_lines(path)
    at = line_of(lines, job_chain(job.id), 2)
    original = lines[at]
    for position in range(len(original) - 1):  # each byte but the newline
        flipped = bytearray(original)
        flipped[position] ^= 0x01
        lines[at] = bytes(flipped)
        named = f"TAMPERED chain job:{job.id}, job {job.id}, seq 2: line_broken"
        assert named in tampered(path, lines), position


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("edit", "seq", "says"),
    [
        ("remove", 1, "expected seq 1, found 2"),
        ("remove", 3, "expected seq 3, found 4"),
        ("remove", 5, "the chain ends at seq 4; its checkpoint names head seq 5"),
        ("swap", 2, "expected seq 2, found 3"),
        # The job's last line swapped with the ops chain's first.
        ("swap", 5, "the chain ends at seq 4; its checkpoint names head seq 5"),
    ],
)
def test_a_removed_or_moved_line_is_named_by_job_and_seq(archived, edit, seq, says):
    job, _, path = archived
    lines = read_lines(path)
    at = line_of(lines, job_chain(job.id), seq)
    if edit == "remove":
        del lines[at]
    else:
        lines[at], lines[at + 1] = lines[at + 1], lines[at]
    out = tampered(path, lines)
    assert f"TAMPERED chain job:{job.id}, job {job.id}, seq {seq}: line_broken" in out
    assert says in out


@pytest.mark.django_db
def test_a_chain_left_out_whole_is_caught_by_the_header_signature(archived):
    job, _, path = archived
    lines = read_lines(path)
    header = json.loads(lines[0])
    header["chains"] = [c for c in header["chains"] if c["chain"] != job_chain(job.id)]
    chain = b'"chain":"' + job_chain(job.id).encode()
    lines = lines[:1] + [line for line in lines[1:] if chain not in line]
    assert "archive_signature" in tampered(path, with_header(header, lines))


def forge(path, job: Job) -> str:
    """Rewrite the job's seq 2 and everything after it with fresh hashes, a checkpoint and
    a header signed by another key, as someone without the real key would; return that
    key's public half."""
    key = Ed25519PrivateKey.generate()

    def b64sign(message: bytes) -> str:
        return base64.b64encode(key.sign(message)).decode()

    lines = read_lines(path)
    header = json.loads(lines[0])
    chain, prev, heads = job_chain(job.id), None, []
    for index, line in enumerate(lines[1:], 1):
        record = json.loads(line)
        if record["entry"]["chain"] != chain:
            continue
        if record["entry"]["seq"] == 2:
            record["entry"]["actor"]["id"] = "someone-else"
        record["prev_hash"] = prev or record["prev_hash"]
        record["chain_hash"] = chain_hash(record["prev_hash"], canonical_bytes(record["entry"]))
        prev = record["chain_hash"]
        lines[index] = canonical_bytes(record) + b"\n"
        heads = [{"chain": chain, "seq": record["entry"]["seq"], "chain_hash": prev}]
    checkpoint = header["checkpoints"][-1]
    payload = json.loads(checkpoint["payload"])
    # A version 2 checkpoint: its heads beside the payload, which signs their root.
    checkpoint["heads"] = canonical_heads(
        (h["chain"], h["seq"], h["chain_hash"])
        for h in [*(h for h in checkpoint["heads"] if h["chain"] != chain), *heads]
    )
    payload["heads_root"] = heads_tree(checkpoint["heads"]).root.hex()
    checkpoint["payload"] = canonical_bytes(payload).decode()
    checkpoint["checkpoint_hash"] = chain_hash(
        checkpoint["prev_hash"], checkpoint["payload"].encode()
    )
    checkpoint["ed25519_signature"] = b64sign(bytes.fromhex(checkpoint["checkpoint_hash"]))
    for entry in header["chains"]:
        if entry["chain"] == chain:
            entry["head_hash"] = prev
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    header["public_key"] = base64.b64encode(public).decode()
    del header["signature"]
    header["signature"] = b64sign(canonical_bytes(header))
    write_lines(path, with_header(header, lines))
    return header["public_key"]


@pytest.mark.django_db
def test_a_history_forged_under_another_key_is_refused_given_the_real_key(archived):
    job, _, path = archived
    forge(path, job)
    # Consistent in itself: only the key the auditor trusts tells it apart.
    assert verify(path)[0] == 0
    status, out = verify(path, "--public-key", call_public_key())
    assert status == 1, out
    assert "archive_key" in out


@pytest.mark.django_db
def test_a_checkpoint_signed_by_another_key_fails_under_the_archive_key(archived):
    _, _, path = archived
    lines = read_lines(path)
    header = json.loads(lines[0])
    checkpoint = header["checkpoints"][-1]
    other = Ed25519PrivateKey.generate().sign(bytes.fromhex(checkpoint["checkpoint_hash"]))
    checkpoint["ed25519_signature"] = base64.b64encode(other).decode()
    out = tampered(path, with_header(header, lines))
    assert f"checkpoint {checkpoint['id']}: checkpoint_broken" in out
    assert "head_unsigned" in out


@pytest.mark.django_db
def test_a_checkpoint_without_ed25519_is_proved_by_the_signed_one_after_it(tmp_path):
    job = job_in_state("succeeded")
    purge(job)
    older = checkpoint_write()
    # As a checkpoint written before the Ed25519 key existed.
    tamper("UPDATE audit_checkpoints SET ed25519_signature = '' WHERE id = %s", [older.id])
    ops_event()
    newer = checkpoint_write()
    path = tmp_path / "audit.jsonl.gz"
    archive(path)
    header = json.loads(read_lines(path)[0])
    assert [c["id"] for c in header["checkpoints"]] == [older.id, newer.id]
    assert header["checkpoints"][0]["ed25519_signature"] == ""
    status, out = verify(path)
    assert status == 0, out

    # Without the signed one after it, nothing proves it.
    header["checkpoints"][1]["prev_hash"] = "0" * 64
    out = tampered(path, with_header(header, read_lines(path)))
    assert f"checkpoint {older.id}: checkpoint_broken" in out


@pytest.mark.django_db
def test_archiving_deletes_nothing(tmp_path):
    job = job_in_state("succeeded")
    purge(job)
    checkpoint_write()
    before = (AuditLog.objects.count(), AuditCheckpoint.objects.count(), Job.objects.count())
    archive(tmp_path / "audit.jsonl.gz")
    after = (AuditLog.objects.count(), AuditCheckpoint.objects.count(), Job.objects.count())
    assert before == after


@pytest.mark.django_db
def test_chains_closed_after_the_date_are_left_out(tmp_path):
    early, late = job_in_state("succeeded"), job_in_state("succeeded")
    purge(early)
    checkpoint_write(now=timezone.now() - timedelta(days=3))
    purge(late)
    checkpoint_write()
    path = tmp_path / "audit.jsonl.gz"
    archive(path, until=(timezone.now() - timedelta(days=1)).date().isoformat())
    header = json.loads(read_lines(path)[0])
    assert [c["chain"] for c in header["chains"]] == [job_chain(early.id)]
    assert verify(path)[0] == 0


@pytest.mark.django_db
def test_no_signed_checkpoint_before_the_date_is_a_usage_error(tmp_path):
    job_in_state("succeeded")
    checkpoint_write()
    path = tmp_path / "audit.jsonl.gz"
    with pytest.raises(CommandError) as refused:
        archive(path, until="2000-01-01")
    assert refused.value.returncode == 2
    assert not path.exists()
    with pytest.raises(CommandError) as refused:
        archive(path, until="yesterday")
    assert refused.value.returncode == 2


@pytest.mark.django_db
def test_a_file_that_is_not_an_archive_is_a_usage_error(tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(b'{"format":"jobops-audit-archive"}\n')
    not_archive = tmp_path / "other.jsonl.gz"
    write_lines(not_archive, [b'{"hello":"world"}\n'])
    for path in (plain, not_archive, tmp_path / "missing.gz"):
        with pytest.raises(CommandError) as refused:
            verify(path)
        assert refused.value.returncode == 2


@pytest.mark.django_db
def test_archive_options_do_not_mix_with_the_database_ones(archived):
    job, _, path = archived
    for args in (["--job", str(job.id)], ["--since", "2026-01-01"]):
        with pytest.raises(CommandError) as refused:
            verify(path, *args)
        assert refused.value.returncode == 2
    # Without --archive the key checks the database's checkpoints' Ed25519 signatures.
    call_command("verify_audit_chain", "--public-key", call_public_key(), stdout=StringIO())
    with pytest.raises(CommandError) as refused:
        verify(path, "--public-key", "c2hvcnQ=")
    assert refused.value.returncode == 2


@pytest.mark.django_db
def test_a_flipped_byte_of_the_compressed_file_never_passes(archived):
    _, _, path = archived
    data = path.read_bytes()
    # After gzip's 10-byte header (its time field is 0, its name empty), before the last
    # byte of compressed data (padding bits) and the 8 bytes of CRC and size.
    for position in range(10, len(data) - 9, max(1, len(data) // 40)):
        flipped = bytearray(data)
        flipped[position] ^= 0x10
        path.write_bytes(bytes(flipped))
        try:
            status = verify(path)[0]
        except CommandError as refused:
            status = refused.returncode
        assert status in (1, 2), position


def call_public_key() -> str:
    out = io.StringIO()
    call_command("audit_public_key", stdout=out)
    return out.getvalue().strip()


@pytest.mark.django_db
def test_the_printed_public_key_verifies_a_checkpoint_signature():
    job_in_state("succeeded")
    checkpoint = checkpoint_write()
    key = load_public_key(call_public_key())
    message = bytes.fromhex(checkpoint.checkpoint_hash)
    assert verifies(key, checkpoint.ed25519_signature, message)
    assert not verifies(key, checkpoint.ed25519_signature, bytes(32))


@pytest.mark.django_db(transaction=True)
def test_the_archive_verifies_as_a_process_with_no_database_server(tmp_path):
    job = job_in_state("succeeded")
    purge(job)
    checkpoint_write()
    path = tmp_path / "audit.jsonl.gz"
    archive(path)
    nowhere = f"postgres://postgres@127.0.0.1:{free_port()}/nowhere"
    key = call_public_key()
    intact = run_manage(
        "verify_audit_chain",
        "--archive",
        str(path),
        "--public-key",
        key,
        env=operator_env(DATABASE_URL=nowhere),
    )
    assert intact.returncode == 0, intact.stdout + intact.stderr
    assert "Audit archive intact" in intact.stdout

    lines = read_lines(path)
    del lines[line_of(lines, job_chain(job.id), 2)]
    write_lines(path, lines)
    tampered = run_manage(
        "verify_audit_chain", "--archive", str(path), env=operator_env(DATABASE_URL=nowhere)
    )
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert f"job {job.id}, seq 2: line_broken" in tampered.stdout
