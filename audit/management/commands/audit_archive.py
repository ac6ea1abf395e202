"""Write an audit archive to hand to an auditor (docs/operations/audit-archives.md).

Exit status: 0 written, 1 the database's history cannot be archived as it is (a stored
payload that is not canonical: run verify_audit_chain), 2 usage error or no signed
checkpoint before the date. With --proof JOB_ID: 0 printed, 1 no checkpoint names the
job's newest entry yet, 2 no such job's entries.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_date

from audit.archive import ArchiveError, archive_write
from audit.errors import AuditProofPendingError
from audit.proofs import ChainNotFound, job_proof

EXIT_USAGE = 2
EXIT_NOT_YET = 1


def print_job_proof(value: str) -> str:
    """The proof of job `value` as one line of JSON (CommandError when there is none)."""
    try:
        job_id = uuid.UUID(value)
    except ValueError:
        raise CommandError(f"--proof {value!r} is not a job id", returncode=EXIT_USAGE) from None
    try:
        return json.dumps(job_proof(job_id), separators=(",", ":"), sort_keys=True)
    except ChainNotFound:
        raise CommandError(
            f"job {job_id} has no audit entry in the database (look in its archive)",
            returncode=EXIT_USAGE,
        ) from None
    except AuditProofPendingError as exc:
        raise CommandError(
            f"job {job_id}: {exc.message} Or run `manage.py audit_checkpoint`.",
            returncode=EXIT_NOT_YET,
        ) from None


class Command(BaseCommand):
    help = (
        "Write the audit chains closed before DATE (purged jobs' chains, the ops chain up "
        "to a checkpoint) and the signed checkpoints that cover them to FILE (gzip JSON "
        "lines), for `verify_audit_chain --archive`. Deletes nothing."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--until", metavar="DATE", help="YYYY-MM-DD, 00:00 UTC, excluded.")
        parser.add_argument("--out", metavar="FILE", help="A file not yet there.")
        parser.add_argument(
            "--proof",
            metavar="JOB_ID",
            help="Instead, print the proof of this job's audit history (JSON), e.g. of a "
            "purged job, while its entries are in the database.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["proof"]:
            if options["until"] or options["out"]:
                raise CommandError("--proof takes no --until or --out", returncode=EXIT_USAGE)
            self.stdout.write(print_job_proof(options["proof"]))
            return
        if not (options["until"] and options["out"]):
            raise CommandError("--until and --out are required", returncode=EXIT_USAGE)
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
