"""The `uploads` table: the input files clients store for their jobs
(docs/api.md#uploading-an-input)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from jobs.artefact_storage import get_artefact_storage


class Upload(models.Model):
    """A file a client stored for its jobs: the bytes in the artefact storage under
    `file`, their sha256 and size as received. Belongs to one organisation, and only its
    members see it or name it in a job. Kept while a job's params name it; one that none
    names is swept (row, bytes, an ops entry) once `expires_at` has passed
    (jobs.services.uploads.uploads_sweep).

    No foreign key to jobs (an import job names it in its params), so purge deletes jobs
    without knowing this table; the sweep takes an upload whose jobs were all purged.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(
        "tenants.Organisation", on_delete=models.PROTECT, related_name="uploads"
    )
    # Who stored it (kept out of hashed audit payloads: the entry names the user's id).
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The storage key: uploads/<org id>/<upload id> (jobs.services.uploads).
    file = models.FileField(storage=get_artefact_storage, max_length=500)
    name = models.CharField(max_length=255)  # the client's file name, as sent
    content_type = models.CharField(max_length=128)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "uploads"
        constraints = [
            models.CheckConstraint(condition=Q(size__gte=0), name="uploads_size_nonneg"),
        ]
        indexes = [
            # The sweep: uploads past their expiry, oldest first.
            models.Index(fields=["expires_at"], name="uploads_expires_idx"),
        ]

    def __str__(self) -> str:
        return f"upload {self.id} ({self.name})"
