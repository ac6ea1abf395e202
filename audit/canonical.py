"""Canonical JSON (RFC 8785) and the chain hash of docs/architecture.md."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Hole:
    """A value of a canonical payload that only the database knows when it appends the
    entry (the next seq, the status a transition replaces). `kind` says how it is
    written: "int" (a JSON number), "json" (any JSON value, already canonical text) or
    "text" (inside a JSON string: the value must need
    no escaping, e.g. a status name)."""

    name: str
    kind: str = "int"


@dataclass(frozen=True)
class Template:
    """Canonical JSON with holes: `pieces[0] + hole[0] + pieces[1] + ... + pieces[-1]`."""

    pieces: list[str]
    holes: list[Hole]

    def fill(self, values: dict[str, Any]) -> str:
        """The payload text with `values` in the holes (as the database fills them)."""
        out = [self.pieces[0]]
        for hole, piece in zip(self.holes, self.pieces[1:], strict=True):
            out += [str(values[hole.name]), piece]
        return "".join(out)

    def replace(self, old: str, new: str) -> Template:
        """This template with the text `old` replaced by `new` (an id swapped for a
        stand-in: both must be JSON text that needs no escaping)."""
        return Template(pieces=[p.replace(old, new) for p in self.pieces], holes=self.holes)


def canonical_template(value: Any) -> Template:
    """RFC 8785 text of `value` split around its `Hole`s, in the order they occur.

    Each hole is encoded as a unique sentinel string (a random nonce, so no string in
    the value can pose as one), found in the canonical text and cut out: an "int" hole
    with the quotes around it, a "text" hole inside them. Key order is JCS's, so the
    pieces are exactly the bytes the filled payload will hash as.
    """
    nonce = secrets.token_hex(8)
    by_sentinel: dict[str, Hole] = {}

    def mark(node: Any) -> Any:
        if isinstance(node, Hole):
            # ASCII that JSON writes unescaped (keeps the fast path of canonical_bytes);
            # the random nonce keeps any string of the value from posing as a hole.
            sentinel = f"<hole:{nonce}:{node.name}>"
            by_sentinel[sentinel] = node
            return sentinel
        if isinstance(node, dict):
            return {k: mark(v) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [mark(v) for v in node]
        return node

    text = canonical_bytes(mark(value)).decode("utf-8")
    found = sorted((text.index(s), s) for s in by_sentinel)
    pieces, holes, cursor = [], [], 0
    for position, sentinel in found:
        if text.count(sentinel) != 1:
            raise ValueError(f"hole {by_sentinel[sentinel].name} occurs more than once")
        hole = by_sentinel[sentinel]
        start, end = position, position + len(sentinel)
        if hole.kind in ("int", "json"):  # the value replaces the whole JSON string
            start, end = start - 1, end + 1
        pieces.append(text[cursor:start])
        holes.append(hole)
        cursor = end
    pieces.append(text[cursor:])
    return Template(pieces=pieces, holes=holes)
