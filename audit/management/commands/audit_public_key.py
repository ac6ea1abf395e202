"""Print the Ed25519 public key that verifies checkpoints and audit archives, or the
keyring of every published key (docs/operations/keys.md#the-keyring)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand

from audit.keyring import configured_keyring
from audit.signing import public_key_text


class Command(BaseCommand):
    help = (
        "Print the Ed25519 public key of AUDIT_SIGNING_ED25519_KEY (base64 of its 32 raw "
        "bytes): what an auditor passes to verify_audit_chain --archive --public-key. "
        "--keyring: the keyring (JSON) of AUDIT_PUBLISHED_KEYS and the current key."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--keyring",
            action="store_true",
            help="Print the keyring: every published key with its key id and validity.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["keyring"]:
            keys = [k.as_dict() for k in configured_keyring().keys]
            self.stdout.write(json.dumps(keys, indent=2))
        else:
            self.stdout.write(public_key_text())
