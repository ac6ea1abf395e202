"""Where artefact files live: Django's `storages["artefacts"]` (docs/configuration.md#artefacts).

The file system of this host by default; with `ARTEFACT_STORAGE=s3`, django-storages'
S3 backend against S3 or an S3-compatible server. `Artefact.file` names the object
(its storage key, `s3_key` in the API body) and reads and writes through
`artefact_storage`, which looks the alias up on each use, so that the storage a
process was configured with (or a test's override of STORAGES) is the one used.
"""

from __future__ import annotations

import hashlib
from typing import IO, Any

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.core.files.storage import Storage, storages
from django.utils.functional import LazyObject

ARTEFACTS = "artefacts"

# What a storage that is down, unreachable or refusing raises on a write: the file
# system's OSError, botocore's connection and service errors.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (OSError, BotoCoreError, ClientError)


class _ArtefactStorage(LazyObject):
    def _setup(self) -> None:
        self._wrapped = storages[ARTEFACTS]

    def __getattr__(self, name: str) -> Any:
        # storages[] caches one backend per alias (and forgets it when STORAGES
        # changes), so this costs a dict lookup.
        return getattr(storages[ARTEFACTS], name)


artefact_storage: Storage = _ArtefactStorage()  # type: ignore[assignment]


def get_artefact_storage() -> Storage:
    """Artefact.file's storage (a callable, so that migrations name it, not a backend)."""
    return artefact_storage


def artefact_presigned_url(*, key: str, filename: str, content_type: str) -> str | None:
    """A URL that serves the object for ARTEFACT_PRESIGNED_EXPIRY_SECONDS, as an
    attachment; None unless ARTEFACT_DOWNLOAD is presigned and the storage is S3 (the
    file system has no such URL: it streams)."""
    if settings.ARTEFACT_DOWNLOAD != "presigned":
        return None
    from storages.backends.s3 import S3Storage  # boto3: only where S3 is used

    storage = storages[ARTEFACTS]
    if not isinstance(storage, S3Storage):
        return None
    return storage.url(
        key,
        parameters={
            "ResponseContentDisposition": f'attachment; filename="{_quoted(filename)}"',
            "ResponseContentType": content_type,
        },
        expire=settings.ARTEFACT_PRESIGNED_EXPIRY_SECONDS,
    )


def _quoted(filename: str) -> str:
    return filename.replace("\\", "_").replace('"', "_")


class DigestingReader:
    """A binary source (from its start) that hashes and counts its bytes as the storage
    reads them.

    The storage writes from it (the file system in chunks, S3 in parts), so the sha256
    and size come from the one read the write makes. Reads at any position are
    allowed (a backend may seek to find the size, or re-read a part): only bytes past
    those already hashed, in order, are hashed; `finish` reads whatever the storage
    skipped, so the digest is of the whole source whatever the backend did.
    """

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source
        self._sha = hashlib.sha256()
        self._pos = source.tell() if source.seekable() else 0
        self._hashed = 0  # the offset up to which the digest has seen the source

    def read(self, size: int | None = -1) -> bytes:
        data = self._source.read(-1 if size is None else size)
        end = self._pos + len(data)
        if self._pos <= self._hashed < end:
            self._sha.update(data[self._hashed - self._pos :])
            self._hashed = end
        self._pos = end
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = self._source.seek(offset, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return self._source.seekable()

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._source.closed

    def close(self) -> None:
        pass  # the caller's source: the caller closes it

    def finish(self) -> tuple[str, int]:
        """(sha256 hex, size) of the whole source, hashing any bytes not yet read."""
        if self._source.seekable():
            self._source.seek(self._hashed)
            for chunk in iter(lambda: self._source.read(64 * 1024), b""):
                self._sha.update(chunk)
                self._hashed += len(chunk)
        return self._sha.hexdigest(), self._hashed
