"""Write one signed audit checkpoint now (the dispatcher also does so every loop)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit.checkpoints import checkpoint_write


class Command(BaseCommand):
    help = "Record the heads of the audit chains that changed since the last checkpoint."

    def handle(self, *args: Any, **options: Any) -> None:
        checkpoint = checkpoint_write()
        if checkpoint is None:
            self.stdout.write("No chain changed since the last checkpoint; nothing written.")
        else:
            self.stdout.write(
                f"Checkpoint {checkpoint.pk} written (up to audit id {checkpoint.last_audit_id}, "
                f"key {checkpoint.key_id}, hash {checkpoint.checkpoint_hash})."
            )
