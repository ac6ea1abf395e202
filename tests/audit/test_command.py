"""`manage.py verify_audit_chain`: exit 0 intact, 1 tampered, 2 usage error.

A few tests run it as a real process against the test database (committed data,
real exit status); the rest use call_command, which is much faster.
"""

from __future__ import annotations

import io
import json
import subprocess

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from audit.checkpoints import checkpoint_write
from audit.services import job_chain
from jobs.services import job_succeed
from tests.audit.tampering import tamper
from tests.factories import fence_of, job_in_state
from tests.processes import operator_env, run_manage


def change_payload(job, seq: int = 2) -> None:
    tamper(
        "UPDATE audit_logs SET payload = replace(payload, '\"attempt\":', '\"attempt\": ') "
        "WHERE chain = %s AND seq = %s",
        [job_chain(job.id), seq],
    )


def verify_process(*args: str) -> subprocess.CompletedProcess[str]:
    """verify_audit_chain as an operator runs it: a real process with manage.py's own
    settings module (exit status, stdout, stderr)."""
    return run_manage("verify_audit_chain", *args, env=operator_env())


def verify(*args: str) -> tuple[int, str]:
    """call_command; returns (exit status, stdout)."""
    out = io.StringIO()
    try:
        call_command("verify_audit_chain", *args, stdout=out)
    except SystemExit as exited:
        return int(exited.code), out.getvalue()
    return 0, out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_process_exits_0_when_intact_and_1_naming_job_and_seq_after_a_tamper():
    job, other = job_in_state("succeeded"), job_in_state("succeeded")
    checkpoint_write()
    intact = verify_process()
    assert intact.returncode == 0, intact.stdout + intact.stderr
    assert "intact: 8 rows in 2 chains, 1 checkpoints (2 heads)" in intact.stdout

    change_payload(job)
    tampered = verify_process()
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert f"TAMPERED chain job:{job.id}, job {job.id}, seq 2: row_broken" in tampered.stdout
    assert str(other.id) not in tampered.stdout


@pytest.mark.django_db(transaction=True)
def test_process_json_prints_one_document():
    job = job_in_state("succeeded")
    change_payload(job, seq=3)
    result = verify_process("--json")
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["ok"] is False
    assert document["rows_checked"] == 4
    assert document["problems_total"] == 1
    [problem] = document["problems"]
    assert (problem["job_id"], problem["seq"], problem["kind"]) == (str(job.id), 3, "row_broken")


@pytest.mark.django_db(transaction=True)
def test_process_usage_errors_exit_2():
    bad_job = verify_process("--job", "not-a-uuid")
    assert bad_job.returncode == 2, bad_job.stdout + bad_job.stderr
    assert "is not a UUID" in bad_job.stderr
    bad_since = verify_process("--since", "last tuesday", "--json")
    assert bad_since.returncode == 2, bad_since.stdout + bad_since.stderr
    assert "is not an ISO 8601 date or datetime" in bad_since.stderr


@pytest.mark.django_db
@pytest.mark.parametrize("since", ["2026-13-45", "tomorrow", "2026-01-01T25:00"])
def test_unparseable_since_is_a_usage_error(since):
    with pytest.raises(CommandError, match="not an ISO 8601") as raised:
        call_command("verify_audit_chain", "--since", since)
    assert raised.value.returncode == 2


@pytest.mark.django_db
def test_job_limits_verification_to_those_chains():
    job, other = job_in_state("succeeded"), job_in_state("succeeded")
    change_payload(job)
    assert verify("--job", str(other.id))[0] == 0
    status, out = verify("--job", str(job.id))
    assert status == 1 and f"job {job.id}, seq 2" in out
    assert verify("--job", str(other.id), "--job", str(job.id))[0] == 1
    assert verify("--job", str(other.id), "--json")[0] == 0


@pytest.mark.django_db
def test_deleted_tail_after_a_checkpoint_exits_1():
    job = job_in_state("succeeded")
    checkpoint_write()
    tamper("DELETE FROM audit_logs WHERE chain = %s AND seq = 4", [job_chain(job.id)])
    status, out = verify()
    assert status == 1
    assert f"job {job.id}, seq 4, checkpoint" in out and "head_missing" in out


@pytest.mark.django_db
def test_since_verifies_only_chains_active_since_then_from_seq_1():
    old = job_in_state("succeeded")
    change_payload(old)
    since = timezone.now()
    recent = job_in_state("queued")
    change_payload(recent, seq=1)

    status, out = verify("--since", since.isoformat(), "--json")
    document = json.loads(out)
    assert status == 1
    assert document["chains_checked"] == 1 and document["rows_checked"] == 2
    assert [(p["job_id"], p["seq"]) for p in document["problems"]] == [(str(recent.id), 1)]

    status, out = verify("--since", timezone.now().isoformat())
    assert status == 0 and "0 rows in 0 chains" in out


@pytest.mark.django_db
def test_since_still_catches_a_chain_deleted_whole_after_a_recent_checkpoint():
    job = job_in_state("succeeded")
    since = timezone.now()
    checkpoint_write()
    tamper("DELETE FROM audit_logs WHERE chain = %s", [job_chain(job.id)])
    status, out = verify("--since", since.isoformat())
    assert status == 1 and f"job {job.id}, seq 4" in out


@pytest.mark.django_db
def test_a_deleted_tail_with_its_checkpoint_is_caught_by_the_job_status():
    """Delete the newest checkpoint and the rows after it: the chain and the remaining
    checkpoints agree, but the job row still says `succeeded` (it ended at `started`)."""
    job = job_in_state("running")
    checkpoint_write()  # names the chain at `started`
    job_succeed(job_id=job.id, fence=fence_of(job), result={})
    newest = checkpoint_write()  # names it at `succeeded`
    tamper("DELETE FROM audit_checkpoints WHERE id = %s", [newest.id])
    tamper("DELETE FROM audit_logs WHERE chain = %s AND seq = 4", [job_chain(job.id)])
    status, out = verify()
    assert status == 1, out
    assert f"job {job.id}" in out and "status_mismatch" in out
    assert "is succeeded but its chain ends at started (seq 3)" in out


@pytest.mark.django_db
def test_exported_checkpoints_catch_a_deleted_newest_checkpoint(tmp_path, settings):
    settings.AUDIT_CHECKPOINT_EXPORT = str(tmp_path / "checkpoints.jsonl")
    from django.test import TestCase

    job_in_state("succeeded")
    with TestCase.captureOnCommitCallbacks(execute=True):
        first = checkpoint_write()
    job_in_state("succeeded")
    with TestCase.captureOnCommitCallbacks(execute=True):
        second = checkpoint_write()
    lines = [json.loads(line) for line in open(settings.AUDIT_CHECKPOINT_EXPORT)]
    assert [line["checkpoint_hash"] for line in lines] == [
        first.checkpoint_hash,
        second.checkpoint_hash,
    ]
    assert verify("--expect-checkpoints-file", settings.AUDIT_CHECKPOINT_EXPORT)[0] == 0
    # The newest checkpoint goes, with its tree head (its heads still exist, so nothing
    # else notices).
    tamper(
        "DELETE FROM audit_checkpoints WHERE id = %s; "
        "DELETE FROM audit_tree_heads WHERE checkpoint_id = %s",
        [second.id, second.id],
    )
    status, out = verify("--expect-checkpoints-file", settings.AUDIT_CHECKPOINT_EXPORT)
    assert status == 1 and second.checkpoint_hash in out and "checkpoint_missing" in out
    status, out = verify("--expect-checkpoint", second.checkpoint_hash.upper())
    assert status == 1 and second.checkpoint_hash in out
    assert verify("--expect-checkpoint", first.checkpoint_hash)[0] == 0


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["nothex", "ab" * 31])
def test_a_bad_expected_checkpoint_is_a_usage_error(value):
    with pytest.raises(CommandError) as refused:
        call_command("verify_audit_chain", "--expect-checkpoint", value)
    assert refused.value.returncode == 2


@pytest.mark.django_db(transaction=True)
def test_since_catches_a_tail_deleted_after_t_by_the_job_row_changed_since_then():
    """The tail written after T is deleted: no audit row since T is left, so no chain
    is 'active since T'; the job row, changed since T, still gives it away. (Each step
    commits, as in production: jobs.updated_at is the transaction's now().)"""
    from jobs.services import Fence, job_succeed

    bystander = job_in_state("succeeded")
    job = job_in_state("running")  # created, queued, started
    job.refresh_from_db()
    since = timezone.now()
    job_succeed(job_id=job.id, fence=Fence(job.locked_by, job.attempts), result={})
    tamper("DELETE FROM audit_logs WHERE chain = %s AND seq = 4", [job_chain(job.id)])

    status, out = verify("--since", since.isoformat())
    assert status == 1, out
    assert f"job {job.id}, seq 3: status_mismatch" in out
    assert str(bystander.id) not in out
    # Limited to other jobs, the same window finds nothing.
    assert verify("--since", since.isoformat(), "--job", str(bystander.id))[0] == 0
    assert verify("--since", since.isoformat(), "--job", str(job.id))[0] == 1
