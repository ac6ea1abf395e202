"""A proof per job (audit.proofs): offline verification with the public key alone, what
tampering it catches, consistency between tree heads, what it reveals of other tenants,
version 1 checkpoints next to version 2, and the API."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from audit.archive import archive_write, verify_archive
from audit.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from audit.checkpoints import checkpoint_signature, checkpoint_write
from audit.models import AuditCheckpoint, AuditLog, AuditTreeHead
from audit.proofs import job_proof, verify_consistency_document, verify_job_proof
from audit.services import format_ts, job_chain
from audit.signing import public_key_text, sign
from audit.tree import tree_head_bytes
from audit.tree_log import consistency_document
from audit.verification import audit_verify
from tests.audit.tampering import tamper
from tests.factories import OrganisationFactory, UserFactory, client_for, job_in_state, make_job
from tests.processes import run_manage

pytestmark = pytest.mark.django_db


def write(tmp_path: Path, document: dict, name: str = "proof.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def other_key() -> tuple[Ed25519PrivateKey, str]:
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return key, base64.b64encode(raw).decode()


def verify_file(path: Path, *, option: str = "--proof") -> subprocess.CompletedProcess:
    return verify_process(option, str(path), "--public-key", public_key_text())


def verify_process(*args: str) -> subprocess.CompletedProcess:
    """`manage.py verify_audit_chain` as an auditor runs it: a process whose
    DATABASE_URL points at nothing that answers."""
    env = {
        "PATH": "/usr/bin:/bin",
        "DEBUG": "true",
        "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
    }
    return run_manage("verify_audit_chain", *args, env=env)


@pytest.fixture
def proved(history):
    """A succeeded job, checkpointed, with two more checkpoints after it (so its proof
    has a path in the checkpoint log), and its proof."""
    checkpoint_write()
    for _ in range(2):
        make_job()
        checkpoint_write()
    return history, job_proof(history.id)


def test_a_proof_verifies_offline_with_the_public_key_alone(proved, tmp_path):
    _, proof = proved
    assert [e["entry"]["event_type"] for e in proof["entries"]] == [
        "created",
        "queued",
        "started",
        "succeeded",
    ]
    assert proof["log"]["tree_size"] == 3 and proof["log"]["leaf_index"] == 0
    path = write(tmp_path, proof)
    done = verify_process("--proof", str(path), "--public-key", public_key_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Audit proof intact: 4 rows in 1 chains" in done.stdout


def test_verification_uses_no_database(proved, django_assert_num_queries):
    _, proof = proved
    key = public_key_text()
    document = json.loads(json.dumps(proof))
    with django_assert_num_queries(0):
        report = verify_job_proof(document, public_key=key)
    assert report.ok, report.problems
    assert report.seconds < 0.1


def tampered_entry(proof):
    proof["entries"][1]["entry"]["actor"]["id"] = "someone-else"


def tampered_rehashed(proof):
    # A rewritten entry with hashes recomputed all the way to a new head: the head is
    # then not the one the signed checkpoint names.
    prev = GENESIS_HASH
    proof["entries"][1]["entry"]["data"] = {"forged": True}
    for line in proof["entries"]:
        line["prev_hash"] = prev
        line["chain_hash"] = prev = chain_hash(prev, canonical_bytes(line["entry"]))
    proof["head"]["chain_hash"] = prev


def tampered_sibling(proof):
    path = proof["log"]["path"]
    path[0] = ("0" if path[0][0] != "0" else "1") + path[0][1:]


def tampered_heads_sibling(proof):
    proof["checkpoint"]["path"] = [GENESIS_HASH]
    proof["checkpoint"]["tree_size"] = 2


def tampered_dropped_entry(proof):
    proof["entries"].pop()


@pytest.mark.parametrize(
    ("tamper", "kind"),
    [
        (tampered_entry, "entry_broken"),
        (tampered_rehashed, "head_not_in_checkpoint"),
        (tampered_sibling, "checkpoint_not_in_log"),
        (tampered_heads_sibling, "head_not_in_checkpoint"),
        (tampered_dropped_entry, "entries_missing"),
    ],
)
def test_a_tampered_proof_fails_naming_what(proved, tamper, kind):
    _, proof = proved
    tamper(proof)
    report = verify_job_proof(proof, public_key=public_key_text())
    assert not report.ok
    assert kind in {p.kind for p in report.problems}, report.problems


def test_a_changed_entry_and_a_wrong_sibling_exit_1_naming_them(proved, tmp_path):
    job, proof = proved
    changed = copy.deepcopy(proof)
    tampered_entry(changed)
    done = verify_process(
        "--proof", str(write(tmp_path, changed)), "--public-key", public_key_text()
    )
    assert done.returncode == 1
    assert f"job {job.id}, seq 2: entry_broken" in done.stdout
    sibling = copy.deepcopy(proof)
    tampered_sibling(sibling)
    done = verify_process(
        "--proof", str(write(tmp_path, sibling)), "--public-key", public_key_text()
    )
    assert done.returncode == 1
    assert "checkpoint_not_in_log" in done.stdout


def test_another_keys_signature_fails(proved, tmp_path):
    _, proof = proved
    key, public = other_key()
    # Given another key, the real proof fails ...
    assert verify_job_proof(proof, public_key=public).problems[0].kind == "proof_key"
    # ... and a tree head re-signed by another key fails against the real key.
    forged = copy.deepcopy(proof)
    head = forged["tree_head"]
    head["signature"] = base64.b64encode(
        key.sign(
            tree_head_bytes(
                tree_size=head["tree_size"],
                root_hash=head["root_hash"],
                created_at=head["created_at"],
                key_id=head["key_id"],
            )
        )
    ).decode()
    done = verify_process(
        "--proof", str(write(tmp_path, forged)), "--public-key", public_key_text()
    )
    assert done.returncode == 1
    assert "tree_head_signature" in done.stdout


def test_usage_errors_exit_2(proved, tmp_path):
    """In process: the exit status is CommandError.returncode, as the process gives it
    (the offline process itself is exercised by the tests above)."""
    _, proof = proved
    path = write(tmp_path, proof)
    (tmp_path / "junk.json").write_text("[]")
    for args in (
        ["--proof", str(path)],  # no key
        ["--proof", str(path), "--public-key", "nope"],
        ["--proof", str(tmp_path / "junk.json"), "--public-key", public_key_text()],
    ):
        with pytest.raises(CommandError) as refused:
            call_command("verify_audit_chain", *args)
        assert refused.value.returncode == 2, args


def test_a_consistency_proof_verifies_and_a_rewritten_older_head_fails_it(proved, tmp_path):
    key = public_key_text()
    document = consistency_document(1, 3)
    assert verify_consistency_document(document, public_key=key).ok
    done = verify_process(
        "--consistency", str(write(tmp_path, document, "c.json")), "--public-key", key
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The operator, holding the key, signs another history of size 1: the newer head
    # does not extend it.
    forged = copy.deepcopy(document)
    first = forged["first"]
    first["root_hash"] = "ab" * 32
    first["signature"] = sign(
        tree_head_bytes(
            tree_size=1,
            root_hash=first["root_hash"],
            created_at=first["created_at"],
            key_id=first["key_id"],
        )
    )
    report = verify_consistency_document(forged, public_key=key)
    assert [p.kind for p in report.problems] == ["consistency_broken"]
    done = verify_process(
        "--consistency", str(write(tmp_path, forged, "f.json")), "--public-key", key
    )
    assert done.returncode == 1 and "consistency_broken" in done.stdout


def test_a_proof_for_organisation_a_names_no_chain_of_organisation_b(tmp_path):
    acme, globex = OrganisationFactory(slug="acme"), OrganisationFactory(slug="globex")
    alice, bob = UserFactory(org=acme), UserFactory(org=globex)
    mine = job_in_state("succeeded", owner=alice)
    theirs = [job_in_state("succeeded", owner=bob) for _ in range(3)]
    checkpoint = checkpoint_write()
    assert {job_chain(j.id) for j in theirs} <= {h["chain"] for h in checkpoint.heads}
    response = client_for(alice).get(f"/api/v1/jobs/{mine.id}/audit-proof")
    assert response.status_code == 200
    text = response.content.decode()
    for job in theirs:
        assert str(job.id) not in text
    assert "globex" not in text
    assert verify_job_proof(response.json(), public_key=public_key_text()).ok
    # Bob may not have Alice's proof: the job's visibility rules, the 404 envelope.
    refused = client_for(bob).get(f"/api/v1/jobs/{mine.id}/audit-proof")
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "ERR-JOB-404"


def test_the_api_answers_409_with_retry_after_until_a_checkpoint_covers_the_job(settings):
    user = UserFactory()
    job = make_job(owner=user)
    api = client_for(user)
    response = api.get(f"/api/v1/jobs/{job.id}/audit-proof")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "ERR-AUDIT-PROOF-PENDING"
    assert "retry after the next checkpoint" in response.json()["error"]["message"]
    assert response["Retry-After"] == str(settings.AUDIT_CHECKPOINT_SECONDS)
    checkpoint_write()
    assert api.get(f"/api/v1/jobs/{job.id}/audit-proof").status_code == 200


def test_the_consistency_endpoint(proved):
    api = client_for(UserFactory())
    response = api.get("/api/v1/audit/tree-heads/consistency?first=2&second=3")
    assert response.status_code == 200
    assert verify_consistency_document(response.json(), public_key=public_key_text()).ok
    for query in ("first=3&second=2", "first=x&second=3", "first=0&second=1", "second=3"):
        bad = api.get(f"/api/v1/audit/tree-heads/consistency?{query}")
        assert bad.status_code == 400, query
        assert bad.json()["error"]["code"] == "ERR-AUDIT-400"
    missing = api.get("/api/v1/audit/tree-heads/consistency?first=1&second=99")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "ERR-AUDIT-404"
    assert (
        APIClient().get("/api/v1/audit/tree-heads/consistency?first=1&second=2").status_code == 401
    )


def write_v1_checkpoint() -> AuditCheckpoint:
    """A checkpoint as the release before version 2 wrote it: its heads in the payload."""
    previous = AuditCheckpoint.objects.order_by("-id").first()
    prev_hash = previous.checkpoint_hash if previous else GENESIS_HASH
    last_id = previous.last_audit_id if previous else 0
    rows = AuditLog.objects.filter(id__gt=last_id).order_by("chain", "-seq").distinct("chain")
    heads = [{"chain": r.chain, "seq": r.seq, "hash": r.chain_hash} for r in rows]
    top = AuditLog.objects.order_by("-id").first()
    now = timezone.now()
    payload = canonical_bytes(
        {
            "v": 1,
            "created_at": format_ts(now),
            "last_audit_id": top.id,
            "prev_hash": prev_hash,
            "key_id": "k1",
            "heads": heads,
        }
    )
    digest = chain_hash(prev_hash, payload)
    return AuditCheckpoint.objects.create(
        created_at=now,
        last_audit_id=top.id,
        payload=payload.decode(),
        prev_hash=prev_hash,
        checkpoint_hash=digest,
        key_id="k1",
        signature=checkpoint_signature(key_id="k1", checkpoint_hash=digest),
        ed25519_signature=sign(bytes.fromhex(digest)),
    )


def test_version_1_checkpoints_still_verify_and_all_heads_gives_old_jobs_a_proof(tmp_path):
    old = job_in_state("succeeded")
    v1 = write_v1_checkpoint()
    new = job_in_state("succeeded")
    v2 = checkpoint_write()
    assert json.loads(v1.payload)["v"] == 1 and json.loads(v2.payload)["v"] == 2
    assert "heads" not in json.loads(v2.payload) and AuditTreeHead.objects.count() == 1
    report = audit_verify()
    assert report.ok, report.problems
    assert report.checkpoints_checked == 2
    # The old job's head is only in the version 1 checkpoint: no proof yet ...
    with pytest.raises(Exception, match="retry after the next checkpoint"):
        job_proof(old.id)
    assert verify_job_proof(job_proof(new.id), public_key=public_key_text()).ok
    # ... until the one-time checkpoint of every head.
    call_command("audit_checkpoint", "--all-heads")
    assert verify_job_proof(job_proof(old.id), public_key=public_key_text()).ok
    assert audit_verify().ok
    # An archive holding both versions verifies offline.
    archive = tmp_path / "a.jsonl.gz"
    archive_write(until=timezone.now() + timedelta(days=1), path=str(archive))
    with gzip.open(archive, "rb") as file:
        assert verify_archive(file, public_key=public_key_text()).ok


def test_a_v2_checkpoint_whose_stored_heads_were_changed_fails_verification():
    job_in_state("succeeded")
    checkpoint = checkpoint_write()
    tamper(
        "UPDATE audit_checkpoints SET heads = heads - 0 WHERE id = %s",
        [checkpoint.id],
    )
    report = audit_verify()
    # Reported once: the tree head naming it is not reported again.
    assert [p.kind for p in report.problems] == ["checkpoint_broken"]
    assert "do not hash to the signed heads_root" in report.problems[0].message


def test_several_checkpoints_in_one_transaction_each_get_a_tree_head(monkeypatch):
    monkeypatch.setattr("audit.checkpoints.MAX_HEADS", 2)
    for _ in range(5):
        make_job()
    checkpoint_write()
    heads = list(AuditTreeHead.objects.order_by("tree_size"))
    assert [h.tree_size for h in heads] == [1, 2, 3]
    assert [h.checkpoint_id for h in heads] == list(
        AuditCheckpoint.objects.order_by("id").values_list("id", flat=True)
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM audit_tree_heads")
        assert cursor.fetchone()[0] == 3


def test_audit_archive_prints_a_purged_jobs_proof(proved, capsys):
    job, _ = proved
    call_command("audit_archive", "--proof", str(job.id))
    printed = json.loads(capsys.readouterr().out)
    assert printed["job_id"] == str(job.id)
    assert verify_job_proof(printed, public_key=public_key_text()).ok


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("UPDATE audit_tree_heads SET root_hash = repeat('0', 64) WHERE tree_size = 2", "root"),
        (
            "UPDATE audit_tree_heads SET nodes[1] = repeat('1', 64) WHERE tree_size = 3",
            "nodes or root",
        ),
        ("DELETE FROM audit_tree_heads WHERE tree_size = 2", "tree size 3 where 2 was due"),
        ("DELETE FROM audit_tree_heads WHERE tree_size = 3", "no tree head puts in the log"),
        (
            "DELETE FROM audit_checkpoints WHERE id = (SELECT max(id) FROM audit_checkpoints)",
            "which is missing",
        ),
    ],
)
def test_verification_recomputes_the_checkpoint_log(proved, sql, message):
    assert audit_verify().tree_heads_checked == 3
    tamper(sql)
    report = audit_verify()
    assert not report.ok
    assert {p.kind for p in report.problems} <= {
        "tree_head_broken",
        "checkpoint_not_in_log",
        "head_missing",
    }
    assert any(message in p.message for p in report.problems), report.problems
    # A verification of chosen chains leaves the log alone.
    assert audit_verify(job_ids=[proved[0].id]).tree_heads_checked == 0
