"""Verifying a webhook jobops sent (Standard Webhooks): `verify(headers, body, secret)`.

The sender signs `"{webhook-id}.{webhook-timestamp}.{body}"` with HMAC-SHA256 under the
endpoint's secret (`whsec_` + base64 of its bytes) and sends
`webhook-signature: v1,<base64 signature>` (several, space-separated, while a secret is
rotated). A receiver checks one matches (constant-time) and that the timestamp is within
the tolerance of its clock (5 minutes), which bounds replays.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from jobops_client.errors import WebhookVerificationError

TOLERANCE_SECONDS = 300
SECRET_PREFIX = "whsec_"
# Bounds on what a receiver reads before the signature is known good.
MAX_SIGNATURES = 16
MAX_HEADER_CHARS = 4096


def _secret_bytes(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        return secret
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WebhookVerificationError("The secret is not whsec_ followed by base64.") from exc


def _header(headers: Mapping[str, str], name: str) -> str:
    lowered = {key.lower(): value for key, value in headers.items()}
    value = lowered.get(name)
    if not value:
        raise WebhookVerificationError(f"Missing the {name} header.")
    if len(value) > MAX_HEADER_CHARS:
        raise WebhookVerificationError(f"The {name} header is too long.")
    return value


def sign(*, msg_id: str, timestamp: int, body: bytes, secret: str | bytes) -> str:
    """The `v1,<base64>` signature of a message (what a sender puts in the header)."""
    content = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_secret_bytes(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify(
    headers: Mapping[str, str],
    body: bytes | str,
    secret: str | bytes,
    *,
    tolerance: float = TOLERANCE_SECONDS,
    now: float | None = None,
) -> Any:
    """The webhook's JSON payload when its signature verifies; WebhookVerificationError
    otherwise (a missing header, a timestamp outside `tolerance` seconds of `now`, no
    matching `v1` signature). `body`: the raw bytes received, before any parsing."""
    raw = body.encode("utf-8") if isinstance(body, str) else body
    msg_id = _header(headers, "webhook-id")
    stamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature").split(" ")
    try:
        timestamp = int(stamp)
    except ValueError as exc:
        raise WebhookVerificationError("The webhook-timestamp is not a number.") from exc
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookVerificationError("The webhook-timestamp is too old or too new.")
    expected = sign(msg_id=msg_id, timestamp=timestamp, body=raw, secret=secret)
    matched = False
    for candidate in signatures[:MAX_SIGNATURES]:
        # Every candidate compared (no early exit): the time taken says nothing.
        if candidate.startswith("v1,"):
            matched |= hmac.compare_digest(candidate.encode(), expected.encode())
    if not matched:
        raise WebhookVerificationError("No signature matches.")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise WebhookVerificationError("The body is not JSON.") from exc
