"""Verify the audit hash chains and signed checkpoints, or an audit archive offline.

`--since-checkpoint [HASH]` verifies only what came after a checkpoint already verified
(audit.incremental); `--record` records the run on the ops chain for the dashboard
(audit.verification_runs); `--public-key` takes one key or a keyring (audit.keyring).

Exit status: 0 intact, 1 tampered (each problem printed naming chain, job, seq and
what broke), 2 usage error (or, with --archive, --proof or --consistency, a file that is
not one).
"""

from __future__ import annotations

import gzip
import json
import os
import uuid
from datetime import UTC, datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from audit.archive import ArchiveUnreadable, verify_archive
from audit.history import verify_history
from audit.incremental import (
    IncrementalReport,
    StartUnknown,
    audit_verify_incremental,
    trusted_start,
)
from audit.keyring import Keyring, KeyringError, check_checkpoint_keys, load_keyring
from audit.management import proof_options
from audit.verification import VerificationReport, audit_verify
from audit.verification_runs import FULL, INCREMENTAL, record_run

EXIT_TAMPERED = 1
EXIT_USAGE = 2


def parse_since(value: str) -> datetime:
    """An ISO 8601 date or datetime; naive values are taken as UTC."""
    try:
        parsed = parse_datetime(value)
        if parsed is None:
            day = parse_date(value)
            parsed = datetime.combine(day, time.min) if day else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise CommandError(
            f"--since {value!r} is not an ISO 8601 date or datetime "
            "(e.g. 2026-01-31 or 2026-01-31T12:00:00Z)",
            returncode=EXIT_USAGE,
        )
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)


def parse_job_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise CommandError(f"--job {value!r} is not a UUID", returncode=EXIT_USAGE) from None


def parse_hash(value: str) -> str:
    digest = value.strip().lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise CommandError(
            f"--expect-checkpoint {value!r} is not a sha256 hex digest", returncode=EXIT_USAGE
        )
    return digest


def read_exported_hashes(path: str) -> list[str]:
    """The checkpoint hashes of an export file (audit.checkpoints.checkpoint_export)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = [line for line in file if line.strip()]
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc}", returncode=EXIT_USAGE) from exc
    hashes = []
    for number, line in enumerate(lines, 1):
        try:
            hashes.append(parse_hash(json.loads(line)["checkpoint_hash"]))
        except (ValueError, KeyError, TypeError, AttributeError, CommandError) as exc:
            raise CommandError(
                f"{path}:{number} is not an exported checkpoint line", returncode=EXIT_USAGE
            ) from exc
    return hashes


class Command(BaseCommand):
    help = "Verify the audit hash chains and checkpoints. Exit 0 intact, 1 tampered, 2 usage."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--job", action="append", default=[], metavar="ID", help="Only this job's chain."
        )
        parser.add_argument(
            "--since", metavar="T", help="Only chains with activity since T (ISO 8601)."
        )
        parser.add_argument("--json", action="store_true", help="Print one JSON document.")
        parser.add_argument(
            "--expect-checkpoint",
            action="append",
            default=[],
            metavar="HASH",
            help="A checkpoint hash exported earlier that must still be in the database.",
        )
        parser.add_argument(
            "--expect-checkpoints-file",
            metavar="FILE",
            help="Every checkpoint_hash of an AUDIT_CHECKPOINT_EXPORT file (JSON lines).",
        )
        parser.add_argument(
            "--archive",
            metavar="FILE",
            help="Verify this audit_archive file instead, offline: no database is used.",
        )
        parser.add_argument(
            "--archives",
            metavar="DIR",
            help="The live database plus the archives of its detached partitions in DIR: "
            "the whole history; a detached partition whose archive is not there is named.",
        )
        parser.add_argument(
            "--public-key",
            metavar="KEY",
            help="The public key you trust (audit_public_key), or a keyring file of "
            "published keys with their validity (audit_public_key --keyring): every "
            "Ed25519 signature must verify under the key its key id names.",
        )
        parser.add_argument(
            "--since-checkpoint",
            nargs="?",
            const="",
            default=None,
            metavar="HASH",
            help="Verify only what was appended after this checkpoint (default: the newest "
            "of the AUDIT_CHECKPOINT_EXPORT file), and that checkpoint's own signature "
            "and link. Proves only the new entries and their link; run the full walk too.",
        )
        parser.add_argument(
            "--record",
            action="store_true",
            help="Record the run (mode, range, result, duration) on the ops chain, where "
            "the dashboard reads it.",
        )
        proof_options.add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        # Validated here rather than by argparse types so that call_command and the
        # command line both give exit status 2 through CommandError.returncode.
        job_ids = [parse_job_id(v) for v in options["job"]] or None
        since = parse_since(options["since"]) if options["since"] else None
        expected = [parse_hash(v) for v in options["expect_checkpoint"]]
        if options["expect_checkpoints_file"]:
            expected += read_exported_hashes(options["expect_checkpoints_file"])
        started_at = timezone.now()
        range_text = "every entry and checkpoint"
        what = "Audit archive" if options["archive"] else "Audit trail"
        if proof_options.wanted(options):
            if options["since_checkpoint"] is not None or options["record"]:
                raise CommandError(
                    "--proof and --consistency verify a file alone: --since-checkpoint and "
                    "--record do not apply",
                    returncode=EXIT_USAGE,
                )
            what, report = proof_options.verify(options)
        elif options["archive"]:
            if options["since_checkpoint"] is not None or options["record"]:
                raise CommandError(
                    "--archive verifies a file alone: --since-checkpoint and --record do not apply",
                    returncode=EXIT_USAGE,
                )
            report = self._verify_archive(options)
        elif options["archives"]:
            if options["since_checkpoint"] is not None or options["record"]:
                raise CommandError(
                    "--archives verifies the whole history: --since-checkpoint and --record "
                    "do not apply",
                    returncode=EXIT_USAGE,
                )
            report = self._verify_history(options)
        elif options["since_checkpoint"] is not None:
            report = self._verify_incremental(options, job_ids, since, expected)
            range_text = report.range_text()
        else:
            if options["record"] and (job_ids or since):
                raise CommandError(
                    "--record records whole runs: a run of --job or --since is not the full walk",
                    returncode=EXIT_USAGE,
                )
            keyring = self._keyring(options)
            report = audit_verify(job_ids=job_ids, since=since, expected_checkpoints=expected)
            if keyring is not None:
                check_checkpoint_keys(report, keyring)
        self._print(report, what=what, as_json=options["json"])
        if options["record"]:
            mode = INCREMENTAL if isinstance(report, IncrementalReport) else FULL
            record_run(mode=mode, report=report, range_text=range_text, started_at=started_at)
        if not report.ok:
            raise SystemExit(EXIT_TAMPERED)

    def _keyring(self, options: dict[str, Any]) -> Keyring | None:
        if options["public_key"] is None:
            return None
        try:
            return load_keyring(options["public_key"])
        except KeyringError as exc:
            raise CommandError(
                f"--public-key is neither an Ed25519 public key nor a keyring: {exc}",
                returncode=EXIT_USAGE,
            ) from exc

    def _verify_incremental(
        self, options: dict[str, Any], job_ids: Any, since: Any, expected: list[str]
    ) -> IncrementalReport:
        if job_ids or since or expected:
            raise CommandError(
                "--since-checkpoint verifies every entry after the checkpoint: --job, --since "
                "and --expect-* do not apply",
                returncode=EXIT_USAGE,
            )
        wanted = parse_hash(options["since_checkpoint"]) if options["since_checkpoint"] else None
        keyring = self._keyring(options)
        try:
            trusted = trusted_start(wanted)
        except StartUnknown as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        return audit_verify_incremental(trusted, keyring=keyring)

    def _verify_archive(self, options: dict[str, Any]) -> VerificationReport:
        """The --archive branch: the file and a public key only, never the database."""
        database_only = ("job", "since", "expect_checkpoint", "expect_checkpoints_file")
        if any(options[name] for name in database_only):
            raise CommandError(
                "--archive verifies a file alone: --job, --since and --expect-* do not apply",
                returncode=EXIT_USAGE,
            )
        keyring = self._keyring(options)
        try:
            with gzip.open(options["archive"], "rb") as file:
                return verify_archive(file, public_key=keyring)
        except (ArchiveUnreadable, OSError) as exc:
            raise CommandError(f"{options['archive']}: {exc}", returncode=EXIT_USAGE) from exc

    def _verify_history(self, options: dict[str, Any]) -> VerificationReport:
        """The --archives branch: the live database and the archives of every detached
        partition (audit.history)."""
        if any(options[name] for name in ("job", "since")):
            raise CommandError(
                "--archives verifies the whole history: --job and --since do not apply",
                returncode=EXIT_USAGE,
            )
        if not os.path.isdir(options["archives"]):
            raise CommandError(
                f"--archives {options['archives']}: not a directory", returncode=EXIT_USAGE
            )
        return verify_history(options["archives"], public_key=self._keyring(options))

    def _print(self, report: VerificationReport, *, what: str, as_json: bool) -> None:
        if as_json:
            document = report.as_dict()
            document["problems"] = [
                {**p, "description": str(problem)}
                for p, problem in zip(document["problems"], report.problems, strict=True)
            ]
            self.stdout.write(json.dumps(document, indent=2))
        else:
            summary = (
                f"{report.rows_checked} rows in {report.chains_checked} chains, "
                f"{report.checkpoints_checked} checkpoints ({report.heads_checked} heads) "
                f"checked in {report.seconds:.2f}s"
            )
            if report.heads_deferred:
                summary += (
                    f"; {report.heads_deferred} heads of detached partitions left to their "
                    "archives (verify them with --archives DIR)"
                )
            if isinstance(report, IncrementalReport):
                what = "Audit trail since the checkpoint"
                summary += (
                    f"; verified {report.range_text()} from the trusted checkpoint "
                    f"{report.from_checkpoint_hash} ({report.trusted_source}). Only the new "
                    "entries and their link to it were proven; the entries before it rest on "
                    f"the last full walk. {report.links_on_database} first entries link to a "
                    "database row no verified checkpoint names; "
                    f"{report.uncovered_chains} chains have entries no checkpoint covers yet"
                )
            if report.ok:
                self.stdout.write(self.style.SUCCESS(f"{what} intact: {summary}."))
            else:
                for problem in report.problems:
                    self.stdout.write(f"TAMPERED {problem}")
                more = report.problems_total - len(report.problems)
                if more:
                    self.stdout.write(f"... and {more} more problems")
                self.stdout.write(
                    self.style.ERROR(
                        f"{what} NOT intact: {report.problems_total} problems; {summary}."
                    )
                )
