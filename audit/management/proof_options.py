"""`verify_audit_chain --proof FILE` and `--consistency FILE`: a job's proof, or a
consistency proof between two tree heads, verified offline with `--public-key` alone
(audit.proofs). Kept beside the command so that its database options stay apart."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from audit.proofs import (
    CONSISTENCY_FORMAT,
    PROOF_FORMAT,
    ProofUnreadable,
    load_document,
    proof_keyring,
    verify_consistency_document,
    verify_job_proof,
)
from audit.verification import VerificationReport

EXIT_USAGE = 2
# The options of the database walk and of --archive, none of which a proof file uses.
OTHER_OPTIONS = (
    "job",
    "since",
    "expect_checkpoint",
    "expect_checkpoints_file",
    "archive",
    "archives",
)


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--proof",
        metavar="FILE",
        help="Verify a job's audit proof (GET /api/v1/jobs/{id}/audit-proof, "
        "audit_archive --proof) offline with --public-key: no database is used.",
    )
    parser.add_argument(
        "--consistency",
        metavar="FILE",
        help="Verify a consistency proof between two tree heads offline with --public-key.",
    )


def wanted(options: dict[str, Any]) -> bool:
    return bool(options.get("proof") or options.get("consistency"))


def verify(options: dict[str, Any]) -> tuple[str, VerificationReport]:
    """(what was verified, the report) for --proof or --consistency; CommandError with
    exit status 2 for a usage error or a file that is not such a document."""
    if options["proof"] and options["consistency"]:
        raise CommandError("give --proof or --consistency, not both", returncode=EXIT_USAGE)
    if any(options.get(name) for name in OTHER_OPTIONS):
        raise CommandError(
            "--proof and --consistency verify a file alone: --job, --since, --expect-* and "
            "--archive do not apply",
            returncode=EXIT_USAGE,
        )
    key = (options.get("public_key") or "").strip()
    if not key:
        raise CommandError(
            "--public-key KEY is required: a proof means nothing without the key you trust",
            returncode=EXIT_USAGE,
        )
    try:
        keyring = proof_keyring(key)
    except ValueError as exc:
        raise CommandError(
            f"--public-key is neither an Ed25519 public key nor a keyring: {exc}",
            returncode=EXIT_USAGE,
        ) from exc
    path = options["proof"] or options["consistency"]
    expected = PROOF_FORMAT if options["proof"] else CONSISTENCY_FORMAT
    try:
        with open(path, "rb") as file:
            document = load_document(file.read(), expected)
    except (OSError, ProofUnreadable) as exc:
        raise CommandError(f"{path}: {exc}", returncode=EXIT_USAGE) from exc
    if options["proof"]:
        return "Audit proof", verify_job_proof(document, public_key=keyring)
    return "Consistency proof", verify_consistency_document(document, public_key=keyring)
