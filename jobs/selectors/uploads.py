"""Reads of uploads (docs/api.md#uploading-an-input). An upload is its organisation's: a
member of it sees it and names it in a job; anyone else is answered as if it did not
exist (404 on a read, 422 in a job's params), so that ids cannot be probed."""

from __future__ import annotations

import uuid
from typing import Any

from jobs.domain.exceptions import UploadNotFoundError
from jobs.tables.uploads import Upload
from tenants.selectors import memberships_of


def upload_get_for_user(*, upload_id: uuid.UUID, user: Any) -> Upload:
    """An upload of one of the caller's organisations; UploadNotFoundError else."""
    org_ids = [m.org_id for m in memberships_of(user)]
    upload = Upload.objects.filter(id=upload_id, org_id__in=org_ids).first()
    if upload is None:
        raise UploadNotFoundError()
    return upload


def upload_in_org(*, upload_id: uuid.UUID, org_id: int | None) -> Upload | None:
    """The upload if it is `org_id`'s, else None (unknown and another's alike)."""
    if org_id is None:
        return None
    return Upload.objects.filter(id=upload_id, org_id=org_id).first()
