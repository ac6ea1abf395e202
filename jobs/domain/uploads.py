"""What an upload may hold (docs/api.md#uploading-an-input): one table, read by the API
that accepts a file and by the import handler that parses it."""

from __future__ import annotations

# An upload's content type (the file part's own, parameters such as charset aside) and
# the format the import handler reads it as. Anything else is 415 at the upload.
UPLOAD_FORMATS: dict[str, str] = {
    "text/csv": "csv",
    "application/x-ndjson": "jsonl",
    "application/jsonl": "jsonl",
}
# A part that says nothing of its type (no Content-Type, or the application/octet-stream
# that curl and most clients send for a file they do not know) is read as the upload's
# `format` field says, else as its file name's extension says; else it is a 422.
UNLABELLED = frozenset({"", "application/octet-stream"})
FORMAT_MEDIA_TYPES: dict[str, str] = {"csv": "text/csv", "jsonl": "application/jsonl"}
UPLOAD_EXTENSIONS: dict[str, str] = {
    ".csv": "text/csv",
    ".jsonl": "application/jsonl",
    ".ndjson": "application/x-ndjson",
}
# The storage key of an upload's bytes: beside the artefacts, in a folder of their own
# that the artefact orphan sweep does not walk.
UPLOAD_PREFIX = "uploads"


def upload_key(*, org_id: int, upload_id: object) -> str:
    return f"{UPLOAD_PREFIX}/{org_id}/{upload_id}"
