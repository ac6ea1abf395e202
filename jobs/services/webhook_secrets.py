"""Webhook signing secrets: made, encrypted at rest, and signed with (docs/webhooks.md).

A secret is `whsec_` and the base64 of 32 random bytes, as the Standard Webhooks
specification writes them; it is shown once, when it is made or rotated. The database
holds it only encrypted (Fernet: AES-128-CBC and HMAC-SHA256) with
JOBOPS_WEBHOOK_SECRET_KEY, so a dump or a replica holds no key that signs.
"""

from __future__ import annotations

import base64
import secrets
from datetime import datetime

from cryptography.fernet import Fernet
from django.conf import settings
from standardwebhooks.webhooks import Webhook

PREFIX = "whsec_"


def secret_new() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _fernet() -> Fernet:
    key = settings.JOBOPS_WEBHOOK_SECRET_KEY or settings.JOBOPS_WEBHOOK_DEV_SECRET_KEY
    return Fernet(key.encode())


def secret_encrypt(secret: str) -> str:
    return _fernet().encrypt(secret.encode()).decode()


def secret_decrypt(token: str) -> str:
    return _fernet().decrypt(token.encode()).decode()


def signatures(*, secrets_: list[str], webhook_id: str, timestamp: datetime, body: str) -> str:
    """The `webhook-signature` header: one `v1,<base64>` per secret, space-separated
    (during a rotation's overlap the receiver may hold either secret)."""
    return " ".join(
        Webhook(secret).sign(msg_id=webhook_id, timestamp=timestamp, data=body)
        for secret in secrets_
    )
