"""Write an audit archive to hand to an auditor (docs/operations/audit-archives.md).

Exit status: 0 written, 1 the database's history cannot be archived as it is (a stored
payload that is not canonical: run verify_audit_chain), 2 usage error or no signed
checkpoint before the date.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_date

from audit.archive import ArchiveError, archive_write

EXIT_USAGE = 2


class Command(BaseCommand):
    help = (
        "Write the audit chains closed before DATE (purged jobs' chains, the ops chain up "
        "to a checkpoint) and the signed checkpoints that cover them to FILE (gzip JSON "
        "lines), for `verify_audit_chain --archive`. Deletes nothing."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--until", required=True, metavar="DATE", help="YYYY-MM-DD, 00:00 UTC, excluded."
        )
        parser.add_argument("--out", required=True, metavar="FILE", help="A file not yet there.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            day = parse_date(options["until"])
        except ValueError:
            day = None
        if day is None:
            raise CommandError(
                f"--until {options['until']!r} is not a date (YYYY-MM-DD)", returncode=EXIT_USAGE
            )
        path = options["out"]
        if os.path.exists(path):
            raise CommandError(
                f"{path} exists: an archive is never overwritten", returncode=EXIT_USAGE
            )
        try:
            header = archive_write(until=datetime.combine(day, time.min, tzinfo=UTC), path=path)
        except ArchiveError as exc:
            raise CommandError(str(exc), returncode=exc.returncode) from exc
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc}", returncode=EXIT_USAGE) from exc
        self.stdout.write(
            f"Archive {path} written: {len(header['chains'])} chains, "
            f"{len(header['checkpoints'])} checkpoints, public key {header['public_key']}."
        )
