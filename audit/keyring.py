"""A keyring of published Ed25519 public keys, each with its id and validity
(docs/operations/keys.md#the-keyring).

A checkpoint, an archive's header and a proof each name the key id that signed them
(a checkpoint's `key_id`, an archive header's `key_id`). An auditor who holds one public
key can verify only what that key signed; after a rotation, a year of history is signed
by two keys or more. The keyring lists every key the operator ever published, with the
window in which it was allowed to sign: a signature is accepted only from the key its
key id names, for an object created inside that key's window. A signature by a key
outside its window (a retired key, perhaps leaked since) fails, naming the key.

`--public-key` of verify_audit_chain takes either one public key (base64 of its 32 raw
bytes, or a PEM SubjectPublicKeyInfo) or a keyring file: a JSON list of
`{"key_id", "public_key", "not_before", "not_after"}` (public_key PEM or base64; the
times ISO 8601, null for no bound). One key alone has no id and no window: it verifies
whatever it signed, as before keyrings existed.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)
from django.conf import settings
from django.db import connection
from django.utils.dateparse import parse_datetime

from audit.report import Problem, VerificationReport
from audit.signing import load_public_key, public_key_text, verifies

# A keyring file is a short list; refuse anything absurd before parsing it.
MAX_KEYRING_BYTES = 1_000_000
MAX_KEYS = 1_000


class KeyringError(ValueError):
    """Not a public key nor a keyring (the message says what is wrong; exit status 2)."""


@dataclass(frozen=True)
class PublishedKey:
    key_id: str | None  # None: a single key given alone, valid for any key id
    public_key: Ed25519PublicKey
    text: str  # base64 of the 32 raw bytes
    not_before: datetime | None = None
    not_after: datetime | None = None

    def valid_at(self, when: datetime | None) -> bool:
        if when is None:
            return self.not_before is None and self.not_after is None
        if self.not_before is not None and when < self.not_before:
            return False
        return self.not_after is None or when <= self.not_after

    def window(self) -> str:
        low = _iso(self.not_before) if self.not_before else "-inf"
        high = _iso(self.not_after) if self.not_after else "+inf"
        return f"[{low}, {high}]"

    def as_dict(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "public_key": self.text,
            "not_before": _iso(self.not_before) if self.not_before else None,
            "not_after": _iso(self.not_after) if self.not_after else None,
        }


@dataclass(frozen=True)
class Keyring:
    keys: tuple[PublishedKey, ...]

    @property
    def single(self) -> bool:
        """One key given alone (no id, no window): the behaviour before keyrings."""
        return len(self.keys) == 1 and self.keys[0].key_id is None

    def key_id_of(self, text: str) -> str | None:
        """The key id under which the keyring holds this public key (None: it does not)."""
        return next((k.key_id for k in self.keys if k.text == str(text).strip()), None)

    def check(
        self,
        *,
        key_id: str | None,
        signature: object,
        message: bytes,
        at: datetime | str | None,
        what: str = "signature",
    ) -> str | None:
        """Why `signature` over `message`, made at `at` under `key_id`, is not accepted;
        None when it is (the key `key_id` names, valid at `at`, verifies it)."""
        when = as_time(at)
        if self.single:
            if verifies(self.keys[0].public_key, signature, message):
                return None
            return (
                f"{what} by key id {key_id!r} does not verify under the given public key "
                "(signed by another key: pass a keyring that holds it)"
            )
        named = [k for k in self.keys if k.key_id == key_id]
        if not named:
            return f"{what} by key id {key_id!r}, which the keyring does not hold"
        outside = [k for k in named if verifies(k.public_key, signature, message)]
        if any(k.valid_at(when) for k in outside):
            return None
        if outside:
            return (
                f"{what} by key {key_id!r} made at {_iso(when) if when else 'an unknown time'}, "
                f"outside the key's validity {outside[0].window()}"
            )
        return f"{what} does not verify under key {key_id!r}"


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def as_time(value: datetime | str | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    try:
        parsed = parse_datetime(value)
    except ValueError:
        return None
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _key(text: str) -> tuple[Ed25519PublicKey, str]:
    """A public key from PEM or from base64 of its 32 raw bytes, and its base64 text."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = load_pem_public_key(text.encode("ascii"))
        except (ValueError, UnicodeError) as exc:
            raise KeyringError(f"not a PEM public key: {exc}") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise KeyringError("the PEM public key is not an Ed25519 key")
    else:
        try:
            key = load_public_key(text)
        except ValueError as exc:
            raise KeyringError(f"not an Ed25519 public key (base64 of 32 bytes): {exc}") from exc
    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return key, base64.b64encode(raw).decode("ascii")


def _bound(entry: dict[str, Any], name: str, number: int) -> datetime | None:
    value = entry.get(name)
    if value is None:
        return None
    when = as_time(value) if isinstance(value, str) else None
    if when is None:
        raise KeyringError(f"key {number}: {name} {value!r} is not an ISO 8601 datetime")
    return when


def parse_keyring(data: Any) -> Keyring:
    """A keyring from its JSON value (a list of entries; see the module docstring)."""
    if not isinstance(data, list) or not data or len(data) > MAX_KEYS:
        raise KeyringError(f"a keyring is a JSON list of 1 to {MAX_KEYS} keys")
    keys = []
    for number, entry in enumerate(data, 1):
        if not isinstance(entry, dict):
            raise KeyringError(f"key {number} is not a JSON object")
        key_id, text = entry.get("key_id"), entry.get("public_key")
        if not isinstance(key_id, str) or not key_id or len(key_id) > 32:
            raise KeyringError(f"key {number}: key_id must be a string of 1 to 32 characters")
        if not isinstance(text, str):
            raise KeyringError(f"key {number}: public_key must be a PEM or base64 string")
        try:
            public, canonical = _key(text)
        except KeyringError as exc:
            raise KeyringError(f"key {number} ({key_id}): {exc}") from exc
        low, high = _bound(entry, "not_before", number), _bound(entry, "not_after", number)
        if low and high and high < low:
            raise KeyringError(f"key {number} ({key_id}): not_after is before not_before")
        keys.append(PublishedKey(key_id, public, canonical, low, high))
    return Keyring(tuple(keys))


def load_keyring(value: str) -> Keyring:
    """What `--public-key` names: a file (a keyring, or one key in PEM or base64) or the
    key's text itself; KeyringError when it is none of them."""
    text = value
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as file:
                text = file.read(MAX_KEYRING_BYTES + 1)
        except (OSError, UnicodeError) as exc:
            raise KeyringError(f"cannot read {value}: {exc}") from exc
        if len(text) > MAX_KEYRING_BYTES:
            raise KeyringError(f"{value} is larger than a keyring ({MAX_KEYRING_BYTES} bytes)")
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise KeyringError(f"not a JSON keyring: {exc}") from exc
        return parse_keyring(data)
    public, canonical = _key(text)
    return Keyring((PublishedKey(None, public, canonical),))


def configured_keyring() -> Keyring:
    """The keyring of this deployment (`manage.py audit_public_key --keyring`): the keys
    of AUDIT_PUBLISHED_KEYS (earlier keys, each with its window) and the current key
    under AUDIT_SIGNING_KEY_ID, valid from AUDIT_SIGNING_KEY_NOT_BEFORE (none: unbounded).
    """
    current = {
        "key_id": settings.AUDIT_SIGNING_KEY_ID,
        "public_key": public_key_text(),
        "not_before": settings.AUDIT_SIGNING_KEY_NOT_BEFORE or None,
        "not_after": None,
    }
    published = [
        dict(k)
        for k in settings.AUDIT_PUBLISHED_KEYS
        if not (
            isinstance(k, dict)
            and k.get("key_id") == current["key_id"]
            and k.get("public_key") == current["public_key"]
        )
    ]
    return parse_keyring([*published, current])


_CHECKPOINT_SIGNATURES_SQL = """
SELECT id, key_id, checkpoint_hash, ed25519_signature, created_at
FROM audit_checkpoints WHERE ed25519_signature <> '' ORDER BY id
"""


def check_checkpoint_keys(report: VerificationReport, keyring: Keyring) -> None:
    """Every checkpoint's Ed25519 signature (those written before Ed25519 existed carry
    none and rest on their HMAC) under the key its key id names, valid when it was made.
    Adds a `checkpoint_key` problem per failure to `report`."""
    with connection.connection.cursor(name="audit_checkpoint_keys") as cursor:
        cursor.itersize = 2_000
        cursor.execute(_CHECKPOINT_SIGNATURES_SQL)
        for cp_id, key_id, digest, signature, created_at in cursor:
            try:
                message = bytes.fromhex(digest)
            except ValueError:
                message = b""
            problem = keyring.check(
                key_id=key_id,
                signature=signature,
                message=message,
                at=created_at,
                what="Ed25519 signature",
            )
            if problem:
                report.add(Problem(kind="checkpoint_key", message=problem, checkpoint_id=cp_id))
