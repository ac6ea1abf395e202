"""`import`: reads an upload (POST /api/v1/uploads) and reports what it holds
(docs/api.md#uploading-an-input).

The params name the upload; the schema accepts only an upload of the job's own
organisation that has not expired. The handler first copies the stored bytes to a
local file while hashing them and fails the job with UPLOAD_CHECKSUM (non-retryable)
unless they still hash to the sha256 taken at the upload: nothing is read before that,
and what it reads is the copy that was checked. Then it counts, streaming: a CSV's
records (after its header row) and columns; a JSON-lines file's records, blank lines
aside, and the lines that are not a JSON object. Memory stays flat whatever the size
(at most JOBOPS_UPLOAD_MAX_BYTES).
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
import uuid
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from jobs.domain.params import StrictParams
from jobs.domain.uploads import UPLOAD_FORMATS
from jobs.errors import JobValidationError, UploadMissingError
from jobs.selectors.uploads import upload_in_org
from jobs.services.uploads import upload_verified_copy

# A cancellation point (and a progress write) every this many records.
CHECK_EVERY = 10_000
# The header's names shown in the result, at most, and their length.
HEADER_SHOWN, HEADER_CHARS = 50, 200
# Invalid JSON lines named in the result (their line numbers), at most.
INVALID_SAMPLE = 10


class ImportParams(StrictParams):
    upload_id = serializers.UUIDField(
        help_text="An upload of the job's organisation (POST /api/v1/uploads), unexpired."
    )

    def validate_upload_id(self, value: uuid.UUID) -> str:
        # Unknown, another organisation's and expired answer alike: ids cannot be probed.
        upload = upload_in_org(upload_id=value, org_id=self.context.get("org_id"))
        if upload is None or upload.expires_at <= timezone.now():
            raise serializers.ValidationError(
                "No such upload in this organisation, or it has expired (upload again)."
            )
        return str(value)  # params are JSON


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    # The tenant comes from the job's row (ctx.org_id): an upload is read only by a job
    # of its own organisation, whatever its params were edited to.
    upload = upload_in_org(upload_id=uuid.UUID(params["upload_id"]), org_id=ctx.org_id)
    if upload is None:
        raise UploadMissingError(f"upload {params['upload_id']} is gone or not this organisation's")
    with tempfile.TemporaryFile() as copy:
        upload_verified_copy(upload=upload, into=copy)
        ctx.progress(10, step="verified", message=f"sha256 {upload.sha256}")
        text = io.TextIOWrapper(copy, encoding="utf-8", newline="")
        try:
            if UPLOAD_FORMATS[upload.content_type] == "csv":
                counts = _count_csv(ctx, text)
            else:
                counts = _count_json_lines(ctx, text)
        except UnicodeDecodeError as exc:
            raise JobValidationError(f"the upload is not UTF-8 text: {exc}") from exc
        finally:
            text.detach()
    return {
        "upload_id": str(upload.id),
        "sha256": upload.sha256,
        "size": upload.size,
        "format": UPLOAD_FORMATS[upload.content_type],
        **counts,
    }


def _count_csv(ctx: Any, text: io.TextIOWrapper) -> dict[str, Any]:
    # csv's own field limit (128 KiB) bounds a line; a longer field is a bad file.
    reader = csv.reader(text)
    try:
        header = next(reader, [])
        records = 0
        for records, _row in enumerate(reader, start=1):
            if records % CHECK_EVERY == 0:
                _checkpoint(ctx, records)
    except csv.Error as exc:
        raise JobValidationError(f"the upload is not valid CSV: {exc}") from exc
    return {
        "records": records,
        "columns": len(header),
        "header": [h[:HEADER_CHARS] for h in header[:HEADER_SHOWN]],
    }


def _count_json_lines(ctx: Any, text: io.TextIOWrapper) -> dict[str, Any]:
    records = invalid = 0
    invalid_lines: list[int] = []
    for number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            valid = isinstance(json.loads(line), dict)
        except ValueError:  # JSONDecodeError, and numbers past Python's digit limit
            valid = False
        if valid:
            records += 1
        else:
            invalid += 1
            if len(invalid_lines) < INVALID_SAMPLE:
                invalid_lines.append(number)
        if number % CHECK_EVERY == 0:
            _checkpoint(ctx, number)
    return {"records": records, "invalid": invalid, "invalid_lines": invalid_lines}


def _checkpoint(ctx: Any, done: int) -> None:
    ctx.check_cancel()
    ctx.progress(50, step="reading", message=f"{done} records")
