"""Detach and drop an archived partition of audit_logs (docs/operations/audit-archives.md).

Run with the owner role's DATABASE_URL, never by the app or the dispatcher. Exit status:
0 detached, 1 refused (an open chain, no verified archive with the file's sha256, a file
that does not verify, a role that does not own the partition, a lock not obtained), 2 usage.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError

from audit.archive import ArchiveError
from audit.detach import LOCK_TIMEOUT, detach_partition
from audit.partition_archive import resolve


class Command(BaseCommand):
    help = (
        "Detach and drop one partition of audit_logs (YYYY-MM, ops-YYYY-MM or legacy) whose "
        "archive was written and verified by `audit_archive --partition`; audited on the ops "
        "chain (audit_partition_detached). Run as the database owner role."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("partition", metavar="NAME")
        parser.add_argument(
            "--archive", required=True, metavar="FILE", help="The partition's archive file."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            ref = resolve(options["partition"])
            done = detach_partition(ref, options["archive"])
        except ArchiveError as exc:
            raise CommandError(str(exc), returncode=exc.returncode) from exc
        except OperationalError as exc:
            raise CommandError(
                f"the detach did not get its lock within {LOCK_TIMEOUT} (a transaction holds "
                f"audit_logs) or was chosen as a deadlock's victim; nothing changed: run it "
                f"again ({exc})",
                returncode=1,
            ) from exc
        self.stdout.write(
            f"Partition {done['partition']} ({done['rows']} rows) detached and dropped; "
            f"audit_logs held exclusively for {done['held_seconds'] * 1000:.1f} ms. Archive "
            f"{done['file_name']} sha256 {done['sha256']}, checkpoint {done['checkpoint_hash']}."
        )
