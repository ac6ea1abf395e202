"""Canonical JSON (RFC 8785) and the chain hash of docs/architecture.md."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

GENESIS_HASH = "0" * 64


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes of `value`.

    Audit payloads are almost always ASCII strings, small integers, booleans and nulls
    under ASCII keys. For those, JCS and the C encoder of `json.dumps` (sorted keys, no
    spaces) write the same bytes: the same escapes, and ASCII keys sort the same by
    UTF-16 code units as by code points. Anything else (floats, non-ASCII text, integers
    past 2**53, other types) goes through `rfc8785`, which also refuses what JCS cannot
    represent. Every entry is hashed, and verified, through here.
    """
    if _plain(value, 0):
        # ensure_ascii=False: JCS writes DEL (0x7f) as it is; ensure_ascii would escape it.
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return text.encode("ascii")
    return rfc8785.dumps(value)


_SAFE_INT = 2**53 - 1  # JCS numbers are IEEE doubles: larger integers are refused
_PLAIN_DEPTH = 32


def _plain(value: Any, depth: int) -> bool:
    """Whether `json.dumps` writes `value` exactly as JCS does (see canonical_bytes)."""
    if isinstance(value, str):  # str-valued enums (Status) are written as their value
        return value.isascii()
    kind = type(value)
    if value is None or kind is bool:
        return True
    if kind is int:
        return -_SAFE_INT <= value <= _SAFE_INT
    if depth >= _PLAIN_DEPTH:
        return False
    if kind is dict:
        return all(
            type(k) is str and k.isascii() and _plain(v, depth + 1) for k, v in value.items()
        )
    if kind is list or kind is tuple:
        return all(_plain(v, depth + 1) for v in value)
    return False


def entry_payload(
    *,
    chain: str,
    seq: Any,
    ts: str,
    event_type: str,
    actor_type: str,
    actor_id: str,
    job_id: str | None,
    data: Any,
) -> dict[str, Any]:
    """What an entry hashes (docs/architecture.md#canonical-json-and-hashing), from the
    values of its columns: the one layout of the payload, which the writer
    (audit.services.audit_payload) fills and verification checks rows against."""
    return {
        "chain": chain,
        "seq": seq,
        "ts": ts,
        "event_type": event_type,
        "actor": {"type": actor_type, "id": actor_id},
        "job_id": job_id,
        "data": data,
    }


def chain_hash(prev_hash: str, payload: bytes) -> str:
    return hashlib.sha256(bytes.fromhex(prev_hash) + payload).hexdigest()
