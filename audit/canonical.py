"""Canonical JSON (RFC 8785) and the chain hash of DESIGN.md section 5."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

GENESIS_HASH = "0" * 64


def canonical_bytes(value: Any) -> bytes:
    return rfc8785.dumps(value)


def chain_hash(prev_hash: str, payload: bytes) -> str:
    return hashlib.sha256(bytes.fromhex(prev_hash) + payload).hexdigest()
