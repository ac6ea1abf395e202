"""The planning types' result as an artefact (`model`, `cam`, `sim`): reviewable later and
referenced by its sha256, beside the job body's `result`, which stays for compatibility.

One JSON file per job, `result/<type>.json`, holding the result's canonical JSON
(RFC 8785, as the audit hashes): the same result gives the same bytes, so every attempt
writes the same file and sha256. Written through `ctx.save_artefact`, which is fenced by
the lock holder and attempt and an upsert on (job, kind, name): a retried attempt
replaces the file of an earlier one (never a second artefact), an attempt that lost its
job writes nothing, and a failed write rolls back (never a row naming half a file).
"""

from __future__ import annotations

from typing import Any

from audit.canonical import canonical_bytes
from jobs.services import validate_result

KIND = "result"
CONTENT_TYPE = "application/json"


def result_artefact(ctx: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Save `result` as the job's JSON artefact and return it unchanged (the job's result).

    Checked first as the job's result is (a fatal RESULT_INVALID for NaN, a number JSON
    cannot carry exactly, or one too large), so that such a result fails the same way
    with or without its artefact."""
    validate_result(result)
    ctx.save_artefact(
        KIND, f"{ctx.job_type}.json", canonical_bytes(result), content_type=CONTENT_TYPE
    )
    return result
