"""Ed25519 signatures of checkpoints and archives (docs/security.md#audit-archives).

The HMAC of a checkpoint (audit.checkpoints) needs the secret to verify, so whoever can
verify it could forge it too. An Ed25519 signature verifies with the public key alone:
an auditor given an archive and the public key can check it without being able to sign.
Keys and signatures travel as base64 of their raw bytes (32 and 64).
"""

from __future__ import annotations

import base64
import binascii
from functools import cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.conf import settings


@cache
def _private_key(seed: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(base64.b64decode(seed, validate=True))


def signing_key() -> Ed25519PrivateKey:
    """The private key of settings.AUDIT_SIGNING_ED25519_KEY."""
    return _private_key(settings.AUDIT_SIGNING_ED25519_KEY)


def public_key_text() -> str:
    """The public key that verifies what `sign` signs (`manage.py audit_public_key`)."""
    raw = signing_key().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def sign(message: bytes) -> str:
    return base64.b64encode(signing_key().sign(message)).decode("ascii")


def load_public_key(text: str) -> Ed25519PublicKey:
    """A public key from its base64 text; ValueError when it is not one."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ValueError("not base64") from exc
    if len(raw) != 32:
        raise ValueError("not 32 bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def verifies(public_key: Ed25519PublicKey, signature: object, message: bytes) -> bool:
    """Whether `signature` (base64 text, or anything a tampered file holds) signs `message`."""
    if not isinstance(signature, str):
        return False
    try:
        public_key.verify(base64.b64decode(signature, validate=True), message)
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True
