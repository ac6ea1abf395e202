"""Files a job produces (docs/architecture.md#the-handler-contract `save_artefact`)."""

from __future__ import annotations

import hashlib
import uuid
from typing import IO

from django.core.files import File
from django.core.files.base import ContentFile
from django.db import models, transaction

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

    The new file is written to storage first and the row switched to it in one
    statement; the replaced file is deleted only after commit, so a rollback never
    leaves a row pointing at a missing file.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    content = ContentFile(data) if isinstance(data, bytes) else File(data)
    digest, size = hashlib.sha256(), 0
    for chunk in content.chunks():
        digest.update(chunk)
        size += len(chunk)
    content.seek(0)
    with transaction.atomic():
        if fence is not None:
            job_worker_lock(job_id=job_id, fence=fence)
        artefact = (
            Artefact.objects.select_for_update().filter(job_id=job_id, kind=kind, name=name).first()
        )
        old_name = artefact.file.name if artefact else None
        artefact = artefact or Artefact(job_id=job_id, kind=kind, name=name)
        artefact.file.save(name, content, save=False)
        artefact.sha256, artefact.size, artefact.content_type = (
            digest.hexdigest(),
            size,
            content_type,
        )
        artefact.save()
        Job.objects.filter(id=job_id).update(version=models.F("version") + 1)
        if old_name and old_name != artefact.file.name:
            storage = artefact.file.storage
            transaction.on_commit(lambda: storage.delete(old_name))
    return artefact
