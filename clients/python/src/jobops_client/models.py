"""What the client answers with: a Job (the API's job body, with its ETag), its
Artefacts, and a batch's results."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from jobops_client.errors import ApiError, ArtefactIntegrityError

# A job in one of these has ended: `wait` returns it (a failed one may still be retried).
FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Job:
    """A job as the API showed it: `data` is the body (docs/api.md#the-job-body),
    `etag` its ETag, `created` whether a submit made it (False: its key's earlier job;
    None: not a submit's answer)."""

    data: dict[str, Any]
    etag: str | None = None
    created: bool | None = None

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def status(self) -> str:
        return str(self.data["status"])

    @property
    def done(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def result(self) -> Any:
        return self.data.get("result")

    @property
    def progress(self) -> dict[str, Any]:
        return dict(self.data.get("progress") or {})

    @property
    def last_error(self) -> dict[str, Any] | None:
        return self.data.get("last_error")

    @property
    def idempotency_key(self) -> str | None:
        return self.data.get("idempotency_key")


@dataclass(frozen=True)
class Artefact:
    """A file a job wrote: `download(path)` fetches it and checks its sha256 and size."""

    data: dict[str, Any]
    # The client's HTTP session (its base URL and token) the download goes through.
    http: httpx.Client = field(repr=False, compare=False)

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def kind(self) -> str:
        return str(self.data["kind"])

    @property
    def sha256(self) -> str:
        return str(self.data["sha256"])

    @property
    def size(self) -> int:
        return int(self.data["size"])

    @property
    def url(self) -> str:
        return str(self.data["url"])

    def download(self, path: str | os.PathLike[str]) -> Path:
        """Write the artefact to `path` and return it. The bytes are hashed as they come;
        a sha256 or size other than the job's record raises ArtefactIntegrityError,
        and so does any failure midway: the partial file is deleted either way. A
        presigned redirect (ARTEFACT_DOWNLOAD=presigned) is followed, without the
        token (httpx drops Authorization on a redirect to another origin)."""
        target = Path(path)
        digest, written = hashlib.sha256(), 0
        try:
            with (
                self.http.stream("GET", self.url, follow_redirects=True) as response,
                target.open("wb") as out,
            ):
                if response.status_code != 200:
                    response.read()
                    raise ApiError.from_response(response)
                for chunk in response.iter_bytes(CHUNK):
                    digest.update(chunk)
                    written += len(chunk)
                    out.write(chunk)
            if digest.hexdigest() != self.sha256 or written != self.size:
                raise ArtefactIntegrityError(
                    f"{self.name}: got {written} bytes with sha256 {digest.hexdigest()}, "
                    f"expected {self.size} with {self.sha256}"
                )
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return target


@dataclass(frozen=True)
class BatchResult:
    """Item `index` of a batch: `status` `created`, `existing` (its key's earlier job) or
    `error`; `id` the job's, `error` the ApiError its create would have raised."""

    index: int
    status: str
    id: str | None = None
    error: ApiError | None = None
