"""Archive, then detach: a partition of audit_logs leaves the database only whole, after
a verified archive, by its owner, audited; verify_audit_chain --archives proves the
whole history and names what is missing (docs/operations/audit-archives.md)."""

from __future__ import annotations

import gzip
import io
import json
from datetime import UTC, date, datetime, timedelta
from unittest.mock import patch

import pytest
from django.core.management import CommandError, call_command
from django.db import ProgrammingError, connection, transaction
from django.utils import timezone

from audit.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from audit.checkpoints import checkpoint_write
from audit.detach import DETACHED, detach_partition, detached_partitions
from audit.models import AuditLog, AuditPartitionArchive
from audit.partition_archive import PartitionError, resolve
from audit.partitions import partition_name
from audit.services import OPS_CHAIN, Actor, audit_append
from audit.signing import sign
from audit.tree import heads_tree
from audit.verification import audit_verify
from jobs.services import creation
from jobs.services.purge import purge_batch
from tests.factories import job_in_state

pytestmark = pytest.mark.django_db


def months_ago(n: int) -> date:
    today = timezone.now().date()
    year, month = today.year, today.month - n
    while month < 1:
        year, month = year - 1, month + 12
    return date(year, month, 1)


def create_partition(kind: str, month: date) -> str:
    """A past month's partition as audit_create_partitions makes the next months' (the
    test database's user is the owner: a superuser)."""
    part = month if kind == "job" else month.replace(day=2)
    name = partition_name(part)
    low, high = part.isoformat(), (part + timedelta(days=1)).isoformat()
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {name} (LIKE audit_logs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        cursor.execute(
            f"ALTER TABLE {name} ADD CONSTRAINT {name}_part "
            f"CHECK (part >= '{low}' AND part < '{high}')"
        )
        cursor.execute(
            f"CREATE TRIGGER {name}_no_truncate BEFORE TRUNCATE ON {name} "
            "FOR EACH STATEMENT EXECUTE FUNCTION jobops_refuse_audit_change()"
        )
        cursor.execute(
            f"ALTER TABLE audit_logs ATTACH PARTITION {name} "
            f"FOR VALUES FROM ('{low}') TO ('{high}')"
        )
    return name


@pytest.fixture
def past():
    """Job and ops partitions for the three months before this one (rolled back with the
    test's transaction); the month of the jobs and the ops segment these tests archive."""
    for n in (3, 2, 1):
        create_partition("job", months_ago(n))
        create_partition("ops", months_ago(n))
    return months_ago(2)


def job_created_in(monkeypatch, month: date, status: str = "succeeded"):
    """A job whose created_at, hence its chain's partition, is in `month`."""
    when = datetime(month.year, month.month, 10, 12, tzinfo=UTC)
    insert = creation.job_insert

    def inserted_then(job, *, actor):
        with patch("django.utils.timezone.now", return_value=when):
            return insert(job, actor=actor)

    with patch.object(creation, "job_insert", inserted_then):
        job = job_in_state(status)
    job.refresh_from_db()
    assert str(job.audit_part) == month.isoformat()
    return job


def purge_all() -> None:
    purge_batch(older_than=timedelta(seconds=-5))


def archive(ref_name: str, path) -> str:
    out = io.StringIO()
    call_command("audit_archive", "--partition", ref_name, "--out", str(path), stdout=out)
    return out.getvalue()


def detach(ref_name: str, path) -> str:
    out = io.StringIO()
    call_command("audit_detach", ref_name, "--archive", str(path), stdout=out)
    return out.getvalue()


def verify_dir(directory) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit_chain", "--archives", str(directory), stdout=out)
    except SystemExit as exited:
        return int(exited.code), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def closed(monkeypatch, past):
    """Two purged jobs of the past month, covered by a checkpoint."""
    jobs = [job_created_in(monkeypatch, past) for _ in range(2)]
    purge_all()
    checkpoint_write()
    return jobs


def test_partition_names():
    assert resolve("2026-08").name == "audit_logs_job_2026_08"
    assert resolve("ops-2026-08").name == "audit_logs_ops_2026_08"
    assert resolve("legacy").name == "audit_logs_legacy"
    assert resolve("audit_logs_ops_2026_08").label == "ops-2026-08"
    with pytest.raises(PartitionError) as refused:
        resolve("August")
    assert refused.value.returncode == 2


def test_a_partition_with_an_open_chain_is_neither_archived_nor_detached(
    monkeypatch, past, tmp_path
):
    open_job = job_created_in(monkeypatch, past)  # succeeded, not purged: still open
    checkpoint_write()
    label = f"{past:%Y-%m}"
    with pytest.raises(
        CommandError, match=rf"1 job chain\(s\) in it are still open.*{open_job.id}"
    ):
        archive(label, tmp_path / "a.jsonl.gz")
    assert not (tmp_path / "a.jsonl.gz").exists()
    (tmp_path / "forged.jsonl.gz").write_bytes(gzip.compress(b"{}\n"))
    with pytest.raises(CommandError, match="still open"):
        detach(label, tmp_path / "forged.jsonl.gz")
    assert AuditLog.objects.filter(part=past).exists()


def test_detach_without_a_verified_archive_is_refused(closed, past, tmp_path):
    label = f"{past:%Y-%m}"
    archive(label, tmp_path / "real.jsonl.gz")
    # A file no record names (a copy with a byte changed is another file).
    data = gzip.decompress((tmp_path / "real.jsonl.gz").read_bytes())
    (tmp_path / "other.jsonl.gz").write_bytes(gzip.compress(data + b"\n"))
    with pytest.raises(CommandError, match="no verified archive of audit_logs_job_"):
        detach(label, tmp_path / "other.jsonl.gz")
    assert AuditLog.objects.filter(part=past).count() > 0
    assert not AuditLog.objects.filter(event_type=DETACHED).exists()


def test_the_app_role_cannot_detach(closed, past, tmp_path):
    label = f"{past:%Y-%m}"
    path = tmp_path / "a.jsonl.gz"
    archive(label, path)
    with connection.cursor() as cursor:  # the deferred keys' checks, before ALTER TABLE
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    call_command(
        "setup_db_roles",
        "--owner",
        "jobops_owner_t",
        "--app",
        "jobops_app_t",
        "--apply",
        stdout=io.StringIO(),
    )
    with connection.cursor() as cursor:
        cursor.execute("SET ROLE jobops_app_t")
    try:
        with pytest.raises(PartitionError, match="'jobops_app_t' does not own audit_logs_job_"):
            detach_partition(resolve(label), str(path))
        # Nor, past the command, by hand; and its archive records are append-only to it.
        for statement in (
            f"ALTER TABLE audit_logs DETACH PARTITION audit_logs_job_{past:%Y_%m}",
            f"DROP TABLE audit_logs_job_{past:%Y_%m}",
            "DELETE FROM audit_partition_archives",
            "UPDATE audit_partition_archives SET sha256 = 'x'",
        ):
            with pytest.raises(ProgrammingError, match=r"must be owner|permission denied"):
                with transaction.atomic():
                    with connection.cursor() as cursor:
                        cursor.execute(statement)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
    assert AuditLog.objects.filter(part=past).count() > 0
    with pytest.raises(ProgrammingError, match="append-only"):  # the owner too: the trigger
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM audit_partition_archives")


def test_archive_detach_then_the_whole_history_verifies(closed, past, tmp_path):
    label = f"{past:%Y-%m}"
    path = tmp_path / "job.jsonl.gz"
    said = archive(label, path)
    assert "written and verified" in said
    record = AuditPartitionArchive.objects.get()
    assert record.partition == f"audit_logs_job_{past:%Y_%m}" and record.rows > 0
    header = json.loads(gzip.open(path).readline())
    assert header["key_id"] == record.key_id and header["partition"]["label"] == label
    said = detach(label, path)
    assert "detached and dropped" in said
    assert not AuditLog.objects.filter(part=past).exists()
    [gone] = detached_partitions()
    assert gone.sha256 == record.sha256 and gone.checkpoint_hash == record.checkpoint_hash
    # Live alone: the detached heads are left to the archive, nothing is reported.
    live = audit_verify()
    assert live.ok, live.problems
    assert live.heads_deferred > 0
    code, out = verify_dir(tmp_path)
    assert code == 0, out
    # After the first detach, --until is retired.
    with pytest.raises(CommandError, match=r"--until is retired.*--partition"):
        call_command("audit_archive", "--until", "2030-01-01", "--out", str(tmp_path / "u"))


def ops_entries_in(month: date, count: int) -> list[str]:
    """`count` ops entries with ts and part in `month`, as its writer puts them."""
    part, hashes, prev = month.replace(day=2), [], GENESIS_HASH
    ts = datetime(month.year, month.month, 2, tzinfo=UTC)
    with connection.cursor() as cursor:
        for seq in range(1, count + 1):
            payload = canonical_bytes({"chain": OPS_CHAIN, "seq": seq}).decode()
            digest = chain_hash(prev, payload.encode())
            cursor.execute(
                "INSERT INTO audit_logs (chain, seq, event_type, actor_type, actor_id, ts, "
                "payload, prev_hash, chain_hash, part) "
                "VALUES (%s, %s, 'x', 'system', 'x', %s, %s, %s, %s, %s)",
                [OPS_CHAIN, seq, ts, payload, prev, digest, part],
            )
            hashes.append(digest)
            prev = digest
    return hashes


def test_the_ops_chain_goes_on_across_its_detached_segments(past, tmp_path):
    """Segments leave oldest first; a segment's archive reaches the first head a
    checkpoint names after it; the live ops chain continues the last one detached."""
    last = months_ago(1)
    hashes = ops_entries_in(last, 2)
    audit_append(chain=OPS_CHAIN, event_type="x", actor=Actor.system(), data={})
    checkpoint_write()  # names ops seq 3, past the segment's end
    newest = f"ops-{last:%Y-%m}"
    archive(newest, tmp_path / "ops-last.jsonl.gz")
    with pytest.raises(CommandError, match="older segments are still attached"):
        detach(newest, tmp_path / "ops-last.jsonl.gz")
    for label in ("legacy", f"ops-{months_ago(3):%Y-%m}", f"ops-{months_ago(2):%Y-%m}"):
        archive(label, tmp_path / f"{label}.jsonl.gz")
        detach(label, tmp_path / f"{label}.jsonl.gz")
    header = json.loads(gzip.open(tmp_path / "ops-last.jsonl.gz").readline())
    [ops] = header["chains"]
    assert (ops["head_seq"], "from_seq" in ops) == (3, False)
    assert header["segments"] == [{"chain": OPS_CHAIN, "last_seq": 2, "last_hash": hashes[1]}]
    detach(newest, tmp_path / "ops-last.jsonl.gz")
    assert not AuditLog.objects.filter(chain=OPS_CHAIN, seq__lte=2).exists()
    entry = audit_append(chain=OPS_CHAIN, event_type="x", actor=Actor.system(), data={})
    assert entry.seq == AuditLog.objects.filter(chain=OPS_CHAIN).count() + 2
    checkpoint_write()
    live = audit_verify()
    assert live.ok, live.problems
    code, out = verify_dir(tmp_path)
    assert code == 0, out


def test_missing_changed_dropped_and_forged_are_each_named(closed, past, tmp_path, monkeypatch):
    label = f"{past:%Y-%m}"
    path = tmp_path / "job.jsonl.gz"
    archive(label, path)
    detach(label, path)
    original = path.read_bytes()

    # A deleted archive file: named with its partition.
    path.unlink()
    code, out = verify_dir(tmp_path)
    assert code == 1
    assert f"archive_missing: partition audit_logs_job_{past:%Y_%m} was detached" in out
    assert "job.jsonl.gz" in out

    # A changed line.
    lines = gzip.decompress(original).split(b"\n")
    lines[2] = lines[2].replace(b'"seq":2', b'"seq":7')
    path.write_bytes(gzip.compress(b"\n".join(lines)))
    code, out = verify_dir(tmp_path)
    assert code == 1
    assert "archive_changed: archive job.jsonl.gz of partition" in out
    assert "archive job.jsonl.gz: line" in out

    # A forged checkpoint: rewritten and signed again by whoever holds the key; the file's
    # sha256 and the database's own checkpoint give it away.
    header, *rest = gzip.decompress(original).split(b"\n")
    doc = json.loads(header)
    cp = doc["checkpoints"][0]
    payload = json.loads(cp["payload"])
    if "heads" in payload:
        payload["heads"] = payload["heads"][:1]
    else:  # version 2: the heads beside the payload, which signs their root and count
        cp["heads"] = cp["heads"][:1]
        payload["heads_root"] = heads_tree(cp["heads"]).root.hex()
        payload["heads_count"] = 1
    cp["payload"] = canonical_bytes(payload).decode()
    cp["checkpoint_hash"] = chain_hash(cp["prev_hash"], cp["payload"].encode())
    cp["ed25519_signature"] = sign(bytes.fromhex(cp["checkpoint_hash"]))
    doc.pop("signature")
    doc["signature"] = sign(canonical_bytes(doc))
    path.write_bytes(gzip.compress(b"\n".join([canonical_bytes(doc), *rest])))
    code, out = verify_dir(tmp_path)
    assert code == 1
    assert f"checkpoint_forged: archive job.jsonl.gz: checkpoint {cp['id']}" in out

    # A partition dropped by the owner without audit_detach (its archive aside).
    path.write_bytes(original)
    assert verify_dir(tmp_path)[0] == 0
    other = months_ago(3)
    job = job_created_in(monkeypatch, other)
    purge_all()
    checkpoint_write()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE audit_logs_job_{other:%Y_%m}")
    code, out = verify_dir(tmp_path)
    assert code == 1
    assert f"partition_missing: partition audit_logs_job_{other:%Y_%m} is neither" in out
    assert f"job:{job.id}" in out
    assert audit_verify().ok is False


def test_a_straggler_is_on_the_dashboard_with_its_partition_then_force_purged(monkeypatch):
    from django.core.management import call_command as run

    from config.dashboard import dashboard_overview
    from jobs.models import Job
    from jobs.selectors.stragglers import stragglers_before
    from tests.factories import UserFactory

    old = stragglers_before().date()
    month = date(old.year - 1, old.month, 1) if old.month == 1 else date(old.year, old.month - 1, 1)
    create_partition("job", month)
    job = job_created_in(monkeypatch, month, status="succeeded")
    Job.objects.filter(id=job.id).update(idempotency_expires_at=timezone.now() + timedelta(days=3))
    problems = dashboard_overview(use_cache=False)["problems"]
    [line] = [p for p in problems if str(job.id) in p]
    assert f"holds audit partition audit_logs_job_{month:%Y_%m}" in line
    assert "idempotency key is live" in line and "--force-job" in line
    # The operator's decision: force-purge it, audited on the job's chain.
    with pytest.raises(CommandError, match="staff user"):
        run("purge", "--force-job", str(job.id), "--justification", "x")
    staff = UserFactory(is_staff=True)
    out = io.StringIO()
    run(
        "purge",
        "--force-job",
        str(job.id),
        "--operator",
        staff.username,
        "--justification",
        "holds the partition; customer confirmed",
        stdout=out,
    )
    assert not Job.objects.filter(id=job.id).exists()
    last = AuditLog.objects.filter(chain=f"job:{job.id}").order_by("-seq").first()
    assert last.event_type == "purged" and last.actor_id == str(staff.pk)
    assert json.loads(last.payload)["data"]["forced"] is True
    problems = dashboard_overview(use_cache=False)["problems"]
    assert not [p for p in problems if str(job.id) in p]


def test_the_dispatcher_archives_a_ready_partition_and_never_detaches(
    closed, past, tmp_path, settings, monkeypatch
):
    from audit import partition_archive
    from audit.partition_archive import AUDIT_PARTITIONS_READY_TO_DETACH

    settings.AUDIT_ARCHIVE_DIR = ""
    partition_archive._last_run = None
    assert partition_archive.archive_step() == 0  # no directory: reads only
    assert AUDIT_PARTITIONS_READY_TO_DETACH._value.get() == 0
    kept = job_created_in(monkeypatch, months_ago(1))  # not purged: its partition waits
    settings.AUDIT_ARCHIVE_DIR = str(tmp_path)
    partition_archive._last_run = None
    assert partition_archive.archive_step() >= 1
    assert not AuditPartitionArchive.objects.filter(
        partition=f"audit_logs_job_{kept.audit_part:%Y_%m}"
    ).exists()
    [record] = AuditPartitionArchive.objects.filter(partition=f"audit_logs_job_{past:%Y_%m}")
    assert (tmp_path / record.file_name).is_file()
    assert AUDIT_PARTITIONS_READY_TO_DETACH._value.get() >= 1
    assert AuditLog.objects.filter(part=past).exists()  # still attached: the owner detaches
    assert partition_archive.archive_step() == 0  # once an hour


def test_an_archive_waits_for_a_checkpoint_that_covers_the_last_entries(
    monkeypatch, past, tmp_path
):
    job = job_created_in(monkeypatch, past)
    checkpoint_write()  # names the job's `succeeded` head, not the `purged` after it
    purge_all()
    with pytest.raises(CommandError, match=rf"no signed checkpoint naming.*job:{job.id}"):
        archive(f"{past:%Y-%m}", tmp_path / "a.jsonl.gz")
    assert not list(tmp_path.iterdir())
    assert not AuditPartitionArchive.objects.exists()
    checkpoint_write()
    assert "written and verified" in archive(f"{past:%Y-%m}", tmp_path / "a.jsonl.gz")


def test_archives_usage(tmp_path):
    with pytest.raises(CommandError, match="not a directory") as refused:
        call_command("verify_audit_chain", "--archives", str(tmp_path / "none"))
    assert refused.value.returncode == 2
    with pytest.raises(CommandError, match="--job and --since do not apply"):
        call_command("verify_audit_chain", "--archives", str(tmp_path), "--since", "2026-01-01")
    with pytest.raises(CommandError, match="names no partition") as refused:
        call_command("audit_detach", "last-month", "--archive", str(tmp_path / "x"))
    assert refused.value.returncode == 2
    # Nothing detached yet: the live history alone, intact.
    assert verify_dir(tmp_path)[0] == 0
