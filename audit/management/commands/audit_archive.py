"""Write an audit archive to hand to an auditor (docs/operations/audit-archives.md).

`--partition NAME` archives one partition of audit_logs (YYYY-MM, ops-YYYY-MM or legacy),
verifies the file offline and records it for `audit_detach`; `--until DATE` archives the
chains closed before a date (retired once a partition was detached: use --partition).

Exit status: 0 written, 1 refused (an open chain, no covering checkpoint, a stored payload
that is not canonical, or --until after a detach), 2 usage error or no signed checkpoint
before the date. With --proof JOB_ID: 0 printed, 1 no checkpoint names the job's newest
entry yet, 2 no such job's entries.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_date

from audit.archive import ArchiveError, archive_write
from audit.detach import detached_partitions
from audit.errors import AuditProofPendingError
from audit.partition_archive import archive_file_name, archive_partition, resolve
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
        "lines), for `verify_audit_chain --archive`; or, with --partition, one partition "
        "of audit_logs, verified and recorded for `audit_detach`; or, with --proof, the proof "
        "of one job's audit history. Deletes nothing."
    )

    def add_arguments(self, parser: Any) -> None:
        what = parser.add_mutually_exclusive_group(required=True)
        what.add_argument("--until", metavar="DATE", help="YYYY-MM-DD, 00:00 UTC, excluded.")
        what.add_argument(
            "--partition",
            metavar="NAME",
            help="YYYY-MM (that month's job partition), ops-YYYY-MM (its ops partition) "
            "or legacy (every entry from before the partitioned log).",
        )
        what.add_argument(
            "--proof",
            metavar="JOB_ID",
            help="Instead, print the proof of this job's audit history (JSON), e.g. of a "
            "purged job, while its entries are in the database.",
        )
        parser.add_argument(
            "--out",
            metavar="FILE",
            help="A file not yet there (with --partition: by default in AUDIT_ARCHIVE_DIR).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["proof"]:
            if options["out"]:
                raise CommandError("--proof takes no --out", returncode=EXIT_USAGE)
            self.stdout.write(print_job_proof(options["proof"]))
            return
        if options["partition"]:
            self._partition(options)
            return
        try:
            day = parse_date(options["until"])
        except ValueError:
            day = None
        if day is None:
            raise CommandError(
                f"--until {options['until']!r} is not a date (YYYY-MM-DD)", returncode=EXIT_USAGE
            )
        path = self._path(options["out"])
        gone = detached_partitions()
        if gone:
            raise CommandError(
                f"--until is retired once a partition was detached ({gone[0].partition} "
                "was): its chains are no longer in the database. Archive partitions with "
                "`audit_archive --partition NAME` (docs/operations/audit-archives.md)",
                returncode=1,
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

    def _path(self, path: str | None) -> str:
        if not path:
            raise CommandError("--out FILE is required", returncode=EXIT_USAGE)
        if os.path.exists(path):
            raise CommandError(
                f"{path} exists: an archive is never overwritten", returncode=EXIT_USAGE
            )
        return path

    def _partition(self, options: dict[str, Any]) -> None:
        try:
            ref = resolve(options["partition"])
            out = options["out"]
            if not out:
                if not settings.AUDIT_ARCHIVE_DIR:
                    raise CommandError(
                        "--out FILE is required when AUDIT_ARCHIVE_DIR is not set",
                        returncode=EXIT_USAGE,
                    )
                out = os.path.join(settings.AUDIT_ARCHIVE_DIR, archive_file_name(ref))
            path = self._path(out)
            header = archive_partition(ref, path)
        except ArchiveError as exc:
            raise CommandError(str(exc), returncode=exc.returncode) from exc
        except OSError as exc:
            raise CommandError(f"cannot write the archive: {exc}", returncode=EXIT_USAGE) from exc
        self.stdout.write(
            f"Archive {path} of {ref.label} ({ref.name}) written and verified: "
            f"{header['partition']['rows']} rows in {len(header['chains'])} chains, checkpoint "
            f"{header['checkpoint_hash']}, key id {header['key_id']}. Detach it with "
            f"`manage.py audit_detach {ref.label} --archive {path}` as the owner role."
        )
