"""Uploads (docs/api.md#uploading-an-input): a client's input file stored with its
checksum, read back only while its bytes still hash to it, and swept once no job
names it.

- `upload_create` writes the bytes to the artefact storage (uploads/<org>/<id>),
  hashing them as the storage reads them, then commits the row and its
  `upload_created` entry on the ops chain together; bytes whose row did not commit are
  deleted again.
- `upload_verified_copy` copies the stored bytes to a local file while hashing them,
  and refuses (UploadChecksumError, non-retryable) when they no longer match: the
  caller reads the copy, so what it reads is exactly what was checked.
- `uploads_sweep` (one of JOBOPS_PURGE_EXTRAS, run by the purge step) deletes the
  uploads past their expiry that no job names, each with an `upload_swept` entry; the
  bytes go after commit.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import timedelta
from typing import IO, Any, cast

import structlog
from django.conf import settings
from django.core.files import File
from django.db import connection, transaction
from django.utils import timezone

from audit.services import OPS_CHAIN, Actor, audit_append
from jobs.artefact_storage import STORAGE_ERRORS, DigestingReader, artefact_storage
from jobs.domain.errors import UploadChecksumError, UploadMissingError
from jobs.domain.exceptions import (
    ArtefactStorageUnavailableError,
    PayloadTooLargeError,
    UploadFormatUnknownError,
    UploadMediaTypeError,
)
from jobs.domain.uploads import (
    FORMAT_MEDIA_TYPES,
    UNLABELLED,
    UPLOAD_EXTENSIONS,
    UPLOAD_FORMATS,
    UPLOAD_PREFIX,
    upload_key,
)
from jobs.queries import QUERIES
from jobs.services.artefacts import StorageUnavailableError
from jobs.tables.uploads import Upload

log = structlog.get_logger("jobs.uploads")
UPLOAD_CREATED = "upload_created"
UPLOAD_SWEPT = "upload_swept"
SWEEPER = Actor.system("purge")
# How long past its expiry an unnamed upload is still kept. An import job's create
# refuses an expired upload; this margin outlasts, by far, the moment between a create's
# check of the upload and its insert, so the sweep never takes an upload that a job
# being created is about to name.
SWEEP_GRACE = timedelta(minutes=5)
_CHUNK = 64 * 1024


def upload_media_type(
    *, content_type: str | None, name: str, file_format: str | None = None
) -> str:
    """The media type an upload is stored as (a key of UPLOAD_FORMATS).

    1. The part's own Content-Type, its parameters (charset) aside, when it is one an
       upload accepts; a `file_format` that says otherwise is a 422.
    2. A part labelled with any other type is 415 (UploadMediaTypeError).
    3. An unlabelled part (UNLABELLED): the `file_format` field's type, else its file
       name extension's; else 422 (UploadFormatUnknownError): nothing says what it holds.
    """
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    accepted = ", ".join(UPLOAD_FORMATS)
    if media_type in UPLOAD_FORMATS:
        if file_format is not None and UPLOAD_FORMATS[media_type] != file_format:
            raise UploadFormatUnknownError(
                f"The file is labelled {media_type} but `format` says {file_format}.",
                details={"format": [f"The file part says {UPLOAD_FORMATS[media_type]}."]},
            )
        return media_type
    if media_type not in UNLABELLED:
        raise UploadMediaTypeError(
            f"An upload is one of {accepted}; this file is {media_type}.",
            details={"content_type": [f"One of: {accepted}."]},
        )
    if file_format is not None:
        return FORMAT_MEDIA_TYPES[file_format]
    extension = os.path.splitext(name)[1].lower()
    if extension in UPLOAD_EXTENSIONS:
        return UPLOAD_EXTENSIONS[extension]
    raise UploadFormatUnknownError(
        "Nothing says what the file holds: label its part with one of "
        f"{accepted}, name it *{', *'.join(UPLOAD_EXTENSIONS)}, or send `format`.",
        details={"format": [f"One of: {', '.join(FORMAT_MEDIA_TYPES)}."]},
    )


def upload_size_check(size: int | None) -> None:
    """PayloadTooLargeError (413) for more than JOBOPS_UPLOAD_MAX_BYTES."""
    limit = settings.JOBOPS_UPLOAD_MAX_BYTES
    if size is not None and size > limit:
        raise PayloadTooLargeError(
            f"The upload is {size} bytes; at most {limit} are accepted (JOBOPS_UPLOAD_MAX_BYTES).",
            details={"limit": limit, "size": size},
        )


def upload_create(
    *,
    org_id: int,
    user: Any,
    source: IO[bytes],
    name: str,
    content_type: str | None,
    size: int | None,
    actor: Actor,
    file_format: str | None = None,
) -> Upload:
    """Store `source` (from its start) as an upload of organisation `org_id`.

    1. Refuse what is not accepted before anything is written: a type outside
       UPLOAD_FORMATS (415) or none at all (422; upload_media_type), more than
       JOBOPS_UPLOAD_MAX_BYTES (413).
    2. Write the bytes under uploads/<org>/<id>; the sha256 and size come from the one
       read the write makes (DigestingReader). A storage that fails is 503, nothing kept.
    3. One transaction: the row and its `upload_created` ops entry (ids, sha256 and
       size; not the file name, which the client chose). If it fails, the bytes go.
    """
    media_type = upload_media_type(content_type=content_type, name=name, file_format=file_format)
    upload_size_check(size)
    upload_id = uuid.uuid4()
    reader = DigestingReader(source)
    content = File(cast(IO[bytes], reader), name=str(upload_id))
    content.content_type = media_type  # type: ignore[attr-defined]  # the S3 object's
    try:
        stored = artefact_storage.save(upload_key(org_id=org_id, upload_id=upload_id), content)
    except STORAGE_ERRORS as exc:
        raise ArtefactStorageUnavailableError() from exc
    sha256, written = reader.finish()
    try:
        upload_size_check(written)  # a part that outgrew its declared size
        now = timezone.now()
        with transaction.atomic():
            upload = Upload.objects.create(
                id=upload_id,
                org_id=org_id,
                created_by=user,
                file=stored,
                name=name[:255],
                content_type=media_type,
                sha256=sha256,
                size=written,
                created_at=now,
                expires_at=now + settings.JOBOPS_UPLOAD_TTL,
            )
            audit_append(
                chain=OPS_CHAIN,
                event_type=UPLOAD_CREATED,
                actor=actor,
                data={
                    "upload_id": str(upload_id),
                    "org_id": org_id,
                    "sha256": sha256,
                    "size": written,
                    "content_type": media_type,
                },
            )
    except BaseException:
        _delete_files([stored])
        raise
    log.info("upload_created", upload_id=str(upload_id), org_id=org_id, size=written)
    return upload


def upload_verified_copy(*, upload: Upload, into: IO[bytes]) -> None:
    """Copy the upload's stored bytes into `into` (a local file), hashing them, and
    refuse them unless they still hash to the sha256 (and size) taken at the upload.

    Raises UploadChecksumError (non-retryable) when they differ, UploadMissingError
    when the bytes are gone, StorageUnavailableError (retryable) when the storage cannot
    be read. The caller reads `into` only after this returns: what it reads is what
    was checked, whatever happens to the stored object meanwhile."""
    digest = hashlib.sha256()
    size = 0
    try:
        with artefact_storage.open(upload.file.name, "rb") as stored:
            for chunk in iter(lambda: stored.read(_CHUNK), b""):
                digest.update(chunk)
                size += len(chunk)
                into.write(chunk)
    except FileNotFoundError as exc:
        raise UploadMissingError(f"upload {upload.id}: its bytes are gone from storage") from exc
    except STORAGE_ERRORS as exc:
        raise StorageUnavailableError(
            f"upload storage refused a read of {upload.id}: {type(exc).__name__}: {exc}"[:500]
        ) from exc
    if digest.hexdigest() != upload.sha256 or size != upload.size:
        raise UploadChecksumError(
            f"upload {upload.id}: the stored bytes ({size} bytes, sha256 "
            f"{digest.hexdigest()}) are not the ones received ({upload.size} bytes, sha256 "
            f"{upload.sha256}); nothing was read"
        )
    into.flush()
    into.seek(0)


def uploads_sweep(*, older_than: timedelta | None = None, dry_run: bool = False) -> int:
    """Delete the uploads that no job names once their expiry (JOBOPS_UPLOAD_TTL after
    the upload; `older_than` after it instead, for a purge run with --older-than) is
    SWEEP_GRACE past, in batches of JOBOPS_PURGE_BATCH: each batch one transaction with
    one `upload_swept` ops entry per upload; the bytes after commit. With `dry_run`, only
    count them. One of JOBOPS_PURGE_EXTRAS. Returns the count."""
    params = {
        "older_than": older_than.total_seconds() if older_than is not None else None,
        "grace": SWEEP_GRACE.total_seconds(),
        "limit": settings.JOBOPS_PURGE_BATCH,
    }
    if dry_run:
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["uploads_sweep_count"], params)
            return int(cursor.fetchone()[0])
    swept = 0
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(QUERIES["uploads_sweep_claim"], params)
                ids = [row[0] for row in cursor.fetchall()]
            gone = list(Upload.objects.filter(id__in=ids))
            for upload in gone:
                audit_append(
                    chain=OPS_CHAIN,
                    event_type=UPLOAD_SWEPT,
                    actor=SWEEPER,
                    data={
                        "upload_id": str(upload.id),
                        "org_id": upload.org_id,
                        "sha256": upload.sha256,
                    },
                )
            Upload.objects.filter(id__in=ids).delete()
            files = [upload.file.name for upload in gone]
            transaction.on_commit(lambda files=files: _delete_files(files))  # type: ignore[misc]
        swept += len(ids)
        if len(ids) < settings.JOBOPS_PURGE_BATCH:
            break
    if swept:
        log.info("uploads_swept", count=swept)
    return swept


def upload_orphans_sweep(*, grace: timedelta) -> int:
    """Delete the upload objects that no row names and that are older than `grace`
    (JOBOPS_ARTEFACT_ORPHAN_GRACE): bytes stored by a request that died before its row
    committed, or whose delete failed after the sweep. Younger ones may belong to an
    upload in flight. Lists the uploads folder: the purge step runs it with the artefact
    orphan sweep, at most once per grace period. Returns how many went."""
    cutoff = timezone.now() - grace
    try:
        folders = artefact_storage.listdir(UPLOAD_PREFIX)[0]
    except STORAGE_ERRORS as exc:  # no folder yet (FileNotFoundError), storage away
        log.info("upload_sweep_skipped", error=repr(exc))
        return 0
    swept = 0
    for folder in folders:
        names = [
            f"{UPLOAD_PREFIX}/{folder}/{name}"
            for name in artefact_storage.listdir(f"{UPLOAD_PREFIX}/{folder}")[1]
        ]
        for start in range(0, len(names), settings.JOBOPS_PURGE_BATCH):
            chunk = names[start : start + settings.JOBOPS_PURGE_BATCH]
            known = set(Upload.objects.filter(file__in=chunk).values_list("file", flat=True))
            swept += _delete_files(
                [
                    name
                    for name in chunk
                    if name not in known and artefact_storage.get_modified_time(name) < cutoff
                ]
            )
    if swept:
        log.info("upload_orphans_swept", count=swept)
    return swept


def _delete_files(names: list[str]) -> int:
    """Delete these upload objects; a failure is logged (the object stays, its row gone:
    upload_orphans_sweep takes it later). Returns how many went."""
    deleted = 0
    for name in names:
        try:
            artefact_storage.delete(name)
            deleted += 1
        except STORAGE_ERRORS as exc:
            log.warning("upload_delete_failed", name=name, error=repr(exc))
    return deleted
