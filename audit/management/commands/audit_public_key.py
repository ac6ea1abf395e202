"""Print the Ed25519 public key that verifies checkpoints and audit archives."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit.signing import public_key_text


class Command(BaseCommand):
    help = (
        "Print the Ed25519 public key of AUDIT_SIGNING_ED25519_KEY (base64 of its 32 raw "
        "bytes): what an auditor passes to verify_audit_chain --archive --public-key."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(public_key_text())
