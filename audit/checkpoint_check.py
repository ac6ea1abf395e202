"""One checkpoint's own checks (its link, hash, HMAC and payload), shared by the full walk
(audit.verification, which re-exports it) and the incremental one (audit.incremental)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from django.conf import settings

from audit.canonical import canonical_bytes
from audit.tree import is_v2, v2_payload_problem


def checkpoint_problems(
    row: tuple[Any, ...], expected_prev: str, *, heads: Any = None
) -> list[str]:
    """What is wrong with one checkpoint (the first eight columns of a row of
    verify_checkpoints) whose predecessor's hash is `expected_prev`, `heads` its heads
    column (a version 2 checkpoint's heads); [] when it is genuine (also
    audit.incremental's check)."""
    _, last_id, prev, stored, key_id, signature, ts, payload = row
    broken = []
    if prev != expected_prev:
        broken.append(
            f"prev_hash {prev} does not match the previous checkpoint's hash {expected_prev}"
        )
    try:
        digest = hashlib.sha256(bytes.fromhex(prev))
        digest.update(payload)
        computed: str | None = digest.hexdigest()
    except ValueError:
        computed = None
    if computed != stored:
        broken.append(f"checkpoint_hash {stored} does not match its payload ({computed})")
    key = settings.AUDIT_SIGNING_KEYS.get(key_id)
    if key is None:
        broken.append(f"signed with unknown key id {key_id!r}")
    else:
        try:
            expected_sig = hmac.new(
                key.encode("utf-8"), bytes.fromhex(stored), hashlib.sha256
            ).hexdigest()
        except ValueError:
            expected_sig = ""
        # Bytes, not str: compare_digest refuses a non-ASCII str with TypeError, and
        # a tampered signature may be anything.
        if not hmac.compare_digest(
            expected_sig.encode(), str(signature).encode("utf-8", "backslashreplace")
        ):
            broken.append("HMAC signature does not verify")
    if not broken and is_v2(payload):
        mismatch = v2_payload_problem(
            payload,
            heads=heads,
            created_at=ts,
            last_audit_id=last_id,
            prev_hash=prev,
            key_id=key_id,
        )
        if mismatch:
            broken.append(mismatch)
    elif not broken:
        # Genuine payload; JCS key order: created_at, heads, key_id,
        # last_audit_id, prev_hash, v.
        expected_first = canonical_bytes({"created_at": ts})[:-1] + b',"heads":'
        expected_last = (
            b"],"
            + canonical_bytes(
                {"key_id": key_id, "last_audit_id": last_id, "prev_hash": prev, "v": 1}
            )[1:]
        )
        if not (payload.startswith(expected_first) and payload.endswith(expected_last)):
            broken.append("columns disagree with the signed payload")
    return broken
