"""The keyring: a year signed by two keys verifies with both, and fails naming the key
that is missing or used outside its validity."""

from __future__ import annotations

import base64
import gzip
import json
import os
from datetime import UTC, datetime
from io import StringIO

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import TestCase

from audit.checkpoints import checkpoint_write
from audit.keyring import KeyringError, load_keyring
from tests.factories import make_job

JANUARY = datetime(2026, 1, 15, tzinfo=UTC)
MARCH = datetime(2026, 3, 15, tzinfo=UTC)
ROTATION = datetime(2026, 6, 30, tzinfo=UTC)
AUGUST = datetime(2026, 8, 15, tzinfo=UTC)


def new_key() -> tuple[str, str, str]:
    """(private seed, public base64, public PEM) of a fresh Ed25519 key."""
    seed = os.urandom(32)
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key()
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    pem = public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    return base64.b64encode(seed).decode(), base64.b64encode(raw).decode(), pem


def run(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("verify_audit_chain", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def rotated_year(settings, tmp_path):
    """Checkpoints in January and March signed by key kA, in August by kB."""
    settings.AUDIT_CHECKPOINT_EXPORT = str(tmp_path / "checkpoints.jsonl")
    a, b = new_key(), new_key()
    secrets = {"kA": "secret-of-key-a-for-tests", "kB": "secret-of-key-b-for-tests"}
    settings.AUDIT_SIGNING_KEYS = secrets
    written = []
    for key_id, key, when in (("kA", a, JANUARY), ("kA", a, MARCH), ("kB", b, AUGUST)):
        settings.AUDIT_SIGNING_KEY_ID = key_id
        settings.AUDIT_SIGNING_ED25519_KEY = key[0]
        make_job()
        with TestCase.captureOnCommitCallbacks(execute=True):
            written.append(checkpoint_write(now=when))
    return {"a": a, "b": b, "checkpoints": written, "dir": tmp_path}


def keyring_file(path, entries) -> str:
    path.write_text(json.dumps(entries))
    return str(path)


def entry(key_id, public, not_before=None, not_after=None):
    return {
        "key_id": key_id,
        "public_key": public,
        "not_before": not_before.isoformat() if not_before else None,
        "not_after": not_after.isoformat() if not_after else None,
    }


@pytest.mark.django_db
def test_a_year_with_a_rotation_verifies_with_the_keyring(rotated_year):
    a, b = rotated_year["a"], rotated_year["b"]
    ring = keyring_file(
        rotated_year["dir"] / "keyring.json",
        [entry("kA", a[2], not_after=ROTATION), entry("kB", b[1], not_before=ROTATION)],
    )
    assert run("--public-key", ring)[0] == 0
    first = rotated_year["checkpoints"][0]
    code, out = run("--since-checkpoint", first.checkpoint_hash, "--public-key", ring)
    assert code == 0, out


@pytest.mark.django_db
def test_with_only_the_first_key_the_rotated_checkpoints_fail_naming_the_second(rotated_year):
    a = rotated_year["a"]
    later = rotated_year["checkpoints"][2]
    only_a = keyring_file(rotated_year["dir"] / "only-a.json", [entry("kA", a[1])])
    code, out = run("--public-key", only_a)
    assert code == 1
    assert f"checkpoint {later.id}: checkpoint_key" in out
    assert "key id 'kB', which the keyring does not hold" in out
    first = rotated_year["checkpoints"][0]
    code, out = run("--since-checkpoint", first.checkpoint_hash, "--public-key", only_a)
    assert code == 1
    assert f"checkpoint {later.id}" in out and "'kB'" in out
    # One bare key (no keyring) fails the same checkpoint, naming its key id.
    code, out = run("--public-key", a[1])
    assert code == 1
    assert f"checkpoint {later.id}" in out and "key id 'kB'" in out


@pytest.mark.django_db
def test_a_signature_outside_its_keys_validity_fails_naming_the_key(rotated_year):
    a, b = rotated_year["a"], rotated_year["b"]
    march = rotated_year["checkpoints"][1]
    # kA retired at the start of March (say it leaked): the March checkpoint it signed
    # is refused.
    ring = keyring_file(
        rotated_year["dir"] / "retired.json",
        [
            entry("kA", a[1], not_after=datetime(2026, 3, 1, tzinfo=UTC)),
            entry("kB", b[1], not_before=ROTATION),
        ],
    )
    code, out = run("--public-key", ring)
    assert code == 1
    assert f"checkpoint {march.id}: checkpoint_key" in out
    assert "key 'kA' made at 2026-03-15" in out and "outside the key's validity" in out


@pytest.mark.django_db
def test_audit_public_key_prints_the_configured_keyring(settings):
    old = new_key()
    settings.AUDIT_PUBLISHED_KEYS = [entry("k0", old[1], not_after=ROTATION)]
    settings.AUDIT_SIGNING_KEY_NOT_BEFORE = ROTATION.isoformat()
    out = StringIO()
    call_command("audit_public_key", "--keyring", stdout=out)
    ring = json.loads(out.getvalue())
    assert [k["key_id"] for k in ring] == ["k0", settings.AUDIT_SIGNING_KEY_ID]
    assert ring[0]["public_key"] == old[1]
    assert ring[1]["not_before"].startswith("2026-06-30")
    # What it prints is a keyring verify_audit_chain reads.
    assert len(load_keyring(out.getvalue()).keys) == 2


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '[{"key_id": "k1"}]',
        '[{"key_id": "k1", "public_key": "c2hvcnQ="}]',
        '[{"key_id": "k1", "public_key": "%s", "not_before": "yesterday"}]' % ("A" * 43 + "="),
        "not a key",
    ],
)
def test_a_bad_keyring_is_refused_with_a_reason(text):
    with pytest.raises(KeyringError):
        load_keyring(text)


@pytest.mark.django_db
def test_a_bad_public_key_is_a_usage_error():
    with pytest.raises(CommandError) as refused:
        call_command("verify_audit_chain", "--public-key", "[1, 2]")
    assert refused.value.returncode == 2


@pytest.mark.django_db
def test_an_archive_names_its_key_id_and_verifies_with_the_keyring(settings, tmp_path):
    from tests.audit.test_archive import archive, ops_event, purge, verify
    from tests.factories import job_in_state

    job = job_in_state("succeeded")
    purge(job)
    ops_event()
    checkpoint_write()
    path = tmp_path / "audit.jsonl.gz"
    archive(path)
    with gzip.open(path, "rb") as file:
        header = json.loads(file.readline())
    assert header["key_id"] == settings.AUDIT_SIGNING_KEY_ID
    out = StringIO()
    call_command("audit_public_key", "--keyring", stdout=out)
    ring = tmp_path / "keyring.json"
    ring.write_text(out.getvalue())
    assert verify(path, "--public-key", str(ring))[0] == 0
    # A keyring that holds another key under that id, or not that id: refused, named.
    other = keyring_file(tmp_path / "other.json", [entry("k9", new_key()[1])])
    code, printed = verify(path, "--public-key", other)
    assert code == 1
    assert "archive_key" in printed
    assert f"key id '{settings.AUDIT_SIGNING_KEY_ID}', which the keyring does not hold" in printed
