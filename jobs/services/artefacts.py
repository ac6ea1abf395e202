"""Files a job produces (docs/architecture.md#the-handler-contract `save_artefact`)."""

from __future__ import annotations

import io
import uuid
from typing import IO, cast

from django.core.files import File
from django.db import models, transaction

from jobs.artefact_storage import STORAGE_ERRORS, DigestingReader
from jobs.domain.errors import RetryableError
from jobs.models import Artefact, Job
from jobs.services.transitions import Fence
from jobs.services.worker import job_worker_lock


def artefact_save(
    *,
    job_id: uuid.UUID | str,
    kind: str,
    name: str,
    data: bytes | str | IO[bytes],
    content_type: str = "application/octet-stream",
    fence: Fence | None = None,
) -> Artefact:
    """Store a file for a job; an upsert on (job, kind, name), so a rerun replaces it.

    With a `fence` (a worker's write) the job row is locked first and the write refused
    with JobLost unless the worker still holds the job.

    The new file is written to storage (jobs.artefact_storage) first and the row
    switched to it in one statement; the replaced file is deleted only after commit, so
    a rollback never leaves a row pointing at a missing file. Its sha256 and size are
    computed from the bytes as the storage reads them. A storage that fails the write
    (down, unreachable, refusing) raises StorageUnavailableError, retryable: the
    transaction rolls back, the job is retried and nothing it wrote before is lost.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    reader = DigestingReader(io.BytesIO(data) if isinstance(data, bytes) else data)
    content = File(cast(IO[bytes], reader), name=name)
    content.content_type = content_type  # type: ignore[attr-defined]  # the S3 object's
    with transaction.atomic():
        if fence is not None:
            job_worker_lock(job_id=job_id, fence=fence)
        artefact = (
            Artefact.objects.select_for_update().filter(job_id=job_id, kind=kind, name=name).first()
        )
        old_name = artefact.file.name if artefact else None
        artefact = artefact or Artefact(job_id=job_id, kind=kind, name=name)
        try:
            artefact.file.save(name, content, save=False)
        except STORAGE_ERRORS as exc:
            raise StorageUnavailableError(
                f"artefact storage refused {kind}/{name}: {type(exc).__name__}: {exc}"[:500]
            ) from exc
        artefact.sha256, artefact.size = reader.finish()
        artefact.content_type = content_type
        artefact.save()
        Job.objects.filter(id=job_id).update(version=models.F("version") + 1)
        if old_name and old_name != artefact.file.name:
            storage = artefact.file.storage
            # robust: the new file is committed; a storage that fails the clean-up
            # leaves an orphan object behind, not a failed job.
            transaction.on_commit(lambda: storage.delete(old_name), robust=True)
    return artefact


class StorageUnavailableError(RetryableError):
    """The artefact storage failed a write: the attempt fails and is retried."""

    code = "STORAGE_UNAVAILABLE"
