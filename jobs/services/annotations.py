"""Audit enrichment (docs/architecture.md#annotations): jobs of the `audit_enrichment`
category add to the audit record of another job and change no domain entity.

The reference type, `annotate`, appends one `annotated` entry to **its own** chain,
naming the job it annotates, that job's entry (seq) and the entry's hash, with a label
and a note. Another job's chain is never appended to: its head lives on its row (an
entry written beside it would break its next transition), and a chain ending in
`purged` is complete. The target's row is only read.

- `annotation_target_check`: at creation (jobs.services.creation), the target must be
  a job the owner may see (the visibility of GET /api/v1/jobs/{id}) in the new job's
  own organisation (404 otherwise), not purged (422), with the entry named (422).
- `annotation_target_entry`: the handler's check when it runs: the target is still
  there in the job's organisation; purged (or gone) meanwhile is a non-retryable failure.
- `job_annotate`: the fenced append, once per job (a rerun of the handler after a lost
  worker finds its entry and appends no second one).
"""

from __future__ import annotations

import uuid
from typing import Any

from audit.models import AuditLog
from audit.services import job_chain
from jobs.domain.errors import JobValidationError
from jobs.domain.exceptions import JobLost, JobNotFoundError, JobParamsInvalidError
from jobs.models import Job
from jobs.selectors import job_get_for_user
from jobs.selectors.annotations import (
    ANNOTATED,
    job_chain_entry,
    job_purged,
    purged_job_seen_by,
)
from jobs.services.transitions import Fence, change
from jobs.services.worker import WORKER
from tenants.selectors import viewer_for

# The category whose types enrich the audit record of the job their params name
# (`target_job_id`, `target_seq`); creation checks the target of each.
AUDIT_ENRICHMENT = "audit_enrichment"
# A handler's failure codes (non-retryable: the target will not come back).
TARGET_PURGED = "ANNOTATION_TARGET_PURGED"
TARGET_MISSING = "ANNOTATION_TARGET_MISSING"

_NOT_FOUND = "No such job, or not one you may see in this job's organisation."


def annotation_target_check(
    *, owner: Any, staff: bool, org_id: int, params: dict[str, Any]
) -> None:
    """Refuse an audit-enrichment job whose target its owner may not annotate:

    1. The target as GET /api/v1/jobs/{id} reads it for the owner (jobops' one
       visibility rule, with the caller's staff powers), in the new job's organisation:
       any other job is JobNotFoundError (404), as if it did not exist.
    2. A target the owner could have seen but that was purged: 422 (its chain is
       complete; nothing more can be said about its entries here).
    3. The entry `target_seq` must exist (at most the target's chain head): 422.
    """
    target_id, seq = params["target_job_id"], params["target_seq"]
    try:
        target = job_get_for_user(job_id=uuid.UUID(target_id), user=owner, staff=staff)
    except JobNotFoundError:
        purged = job_purged(job_id=target_id)
        viewer = viewer_for(owner, staff=staff)
        if purged is not None and purged_job_seen_by(purged, viewer=viewer, org_id=org_id):
            raise JobParamsInvalidError(
                "The job to annotate was purged: its audit chain is complete.",
                details={"target_job_id": ["This job was purged (its retention passed)."]},
            ) from None
        raise JobNotFoundError(
            "The job to annotate was not found.", details={"target_job_id": [_NOT_FOUND]}
        ) from None
    if target.org_id != org_id:
        raise JobNotFoundError(
            "The job to annotate was not found.", details={"target_job_id": [_NOT_FOUND]}
        )
    if seq > target.audit_seq:
        raise JobParamsInvalidError(
            details={"target_seq": [f"The job's audit chain has {target.audit_seq} entries."]}
        )


def annotation_target_entry(*, org_id: int, target_job_id: str, target_seq: int) -> AuditLog:
    """The entry an annotation names, when its handler runs: the target must still be a
    job of the annotating job's organisation (creation checked its owner's view of it).
    A target purged since (or gone otherwise) fails the job for good
    (JobValidationError: non-retryable, dead-lettered)."""
    head = Job.objects.filter(id=target_job_id, org_id=org_id).values_list("audit_seq", flat=True)
    if head.first() is None:
        if job_purged(job_id=target_job_id) is not None:
            raise JobValidationError(
                f"job {target_job_id} was purged after this annotation was created",
                code=TARGET_PURGED,
            )
        raise JobValidationError(
            f"job {target_job_id} is not a job of this organisation", code=TARGET_MISSING
        )
    entry = job_chain_entry(job_id=target_job_id, seq=target_seq)
    if entry is None:  # creation checked it: only a chain changed outside jobops
        raise JobValidationError(
            f"job {target_job_id} has no audit entry {target_seq}", code=TARGET_MISSING
        )
    return entry


def job_annotate(
    *, job_id: uuid.UUID | str, fence: Fence, target: AuditLog, label: str, note: str
) -> AuditLog:
    """Append the `annotated` entry to the running job's own chain, fenced
    (jobs_note_fenced: only while `fence` holds, else JobLost), naming the target job,
    its entry's seq and hash; or return the one an earlier attempt of this job appended
    (a handler runs at least once: its side effect must not repeat)."""
    own = AuditLog.objects.filter(chain=job_chain(job_id), event_type=ANNOTATED)
    earlier = own.order_by("seq").first()
    if earlier is not None:
        return earlier
    data = {
        "target_job_id": str(target.job_id),
        "target_seq": target.seq,
        "target_hash": target.chain_hash,
        "label": label,
        "note": note,
    }
    rows = change(
        "jobs_note_fenced",
        job_ids=[job_id],
        actor=WORKER,
        event_type=ANNOTATED,
        data={str(job_id): data},
        attempts=[fence.attempt],
        locked_by=fence.locked_by,
    )
    if not rows:
        raise JobLost(f"job {job_id}: lock {fence.locked_by} attempt {fence.attempt} lost")
    return own.get()
