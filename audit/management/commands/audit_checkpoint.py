"""Write one signed audit checkpoint now (the dispatcher also does so every loop).

`--all-heads`, once after upgrading to checkpoint version 2 (docs/operations/upgrading.md):
checkpoints of every chain's head, so that jobs last checkpointed before the upgrade get
a proof (GET /api/v1/jobs/{id}/audit-proof)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit.checkpoints import checkpoint_write, checkpoint_write_all_heads


class Command(BaseCommand):
    help = "Record the heads of the audit chains that changed since the last checkpoint."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--all-heads",
            action="store_true",
            help="Record the head of every chain, changed or not (once, after the upgrade "
            "to version 2 checkpoints).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["all_heads"]:
            written = checkpoint_write_all_heads()
            heads = sum(len(c.heads or []) for c in written)
            self.stdout.write(
                f"{len(written)} checkpoints written naming the heads of {heads} chains."
            )
            return
        checkpoint = checkpoint_write()
        if checkpoint is None:
            self.stdout.write("No chain changed since the last checkpoint; nothing written.")
        else:
            self.stdout.write(
                f"Checkpoint {checkpoint.pk} written (up to audit id {checkpoint.last_audit_id}, "
                f"key {checkpoint.key_id}, hash {checkpoint.checkpoint_hash})."
            )
