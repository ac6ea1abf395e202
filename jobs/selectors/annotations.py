"""Reads of audit enrichment (docs/architecture.md#annotations): the entry an
annotation names, whether a job that is gone was purged (and who could have seen it),
and the annotations of a job, read from the annotating jobs' own `annotated` entries.

An annotation lives in its annotating job's chain, never in the chain of the job it
annotates: that chain's head is on its row, and a chain ending in `purged` is complete.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.db.models.expressions import RawSQL

from audit.models import AuditLog
from audit.services import job_chain
from jobs.models import Job
from tenants.selectors import Viewer

# The audit event of an annotation (jobs.services.annotations appends it).
ANNOTATED = "annotated"
# The job an `annotated` entry names, as audit_annotated_target_idx indexes it (audit
# migration 0009): the expression must stay this one for the index to serve the lookup.
ANNOTATED_TARGET = RawSQL("((payload::jsonb -> 'data') ->> 'target_job_id')", ())
# The annotations a job's page shows, newest first (an annotation is one more job: a
# job may have many; the page stays bounded).
ANNOTATIONS_SHOWN = 50


def job_chain_entry(*, job_id: uuid.UUID | str, seq: int) -> AuditLog | None:
    """Entry `seq` of the job's chain, or None (one probe of (chain, seq))."""
    return AuditLog.objects.filter(chain=job_chain(job_id), seq=seq).first()


@dataclass(frozen=True)
class PurgedJob:
    """A job whose row the purge removed: its chain ends in `purged`. `org_id` is the
    organisation its entries name; `creator` the (actor type, id) of its `created`
    entry."""

    org_id: int | None
    creator: tuple[str, str] | None


def job_purged(*, job_id: uuid.UUID | str) -> PurgedJob | None:
    """The purged job `job_id` (its chain's last entry is `purged`), or None: a job that
    never existed, or whose row is there. Two probes of (chain, seq)."""
    chain = AuditLog.objects.filter(chain=job_chain(job_id))
    last = chain.only("event_type", "payload").order_by("-seq").first()
    if last is None or last.event_type != "purged":
        return None
    context = _payload_data(last.payload).get("context") or {}
    org_id = context.get("org_id") if isinstance(context, dict) else None
    created = chain.filter(seq=1).values_list("actor_type", "actor_id").first()
    return PurgedJob(
        org_id=org_id if isinstance(org_id, int) else None,
        creator=(str(created[0]), str(created[1])) if created else None,
    )


def purged_job_seen_by(purged: PurgedJob, *, viewer: Viewer, org_id: int) -> bool:
    """Whether `viewer` could have seen the purged job in organisation `org_id` while it
    was there (tenants.selectors.Viewer's rules, from what its chain keeps: its
    organisation, and who created it for a member who sees only their own jobs). A
    job of another organisation, or one it could not have seen, stays "not found"."""
    if purged.org_id != org_id:
        return False
    if viewer.everything:
        return True
    wide, own = viewer.org_sets()
    if org_id in wide:
        return True
    created_by_viewer = purged.creator is not None and purged.creator[1] == str(viewer.owner_id)
    return org_id in own and created_by_viewer


@dataclass(frozen=True)
class Annotation:
    """One annotation of a job's entry, from the annotating job's `annotated` entry."""

    job_id: uuid.UUID  # the annotating job
    owner: str  # its owner's username
    ts: datetime
    target_seq: int
    target_hash: str
    label: str
    note: str


def job_annotations(
    *, job: Job, visible: QuerySet[Job], limit: int = ANNOTATIONS_SHOWN
) -> list[Annotation]:
    """The annotations of `job`, newest first, of annotating jobs among `visible` (the
    jobs the viewer may see; an annotation of a job they may not see is not shown).
    Two queries: the entries naming the job (audit_annotated_target_idx), the visible
    annotating jobs with their owners."""
    rows = list(
        AuditLog.objects.alias(target=ANNOTATED_TARGET)
        .filter(event_type=ANNOTATED, target=str(job.id), job_id__in=visible.values("id"))
        .only("job_id", "ts", "payload")
        .order_by("-id")[:limit]
    )
    owners = dict(
        Job.objects.filter(id__in={r.job_id for r in rows}).values_list("id", "owner__username")
    )
    found: list[Annotation] = []
    for row in rows:
        data = _payload_data(row.payload)
        seq = data.get("target_seq")
        if row.job_id not in owners or not isinstance(seq, int):
            continue  # its job went meanwhile; or an entry not written by this app
        found.append(
            Annotation(
                job_id=row.job_id,
                owner=str(owners[row.job_id]),
                ts=row.ts,
                target_seq=seq,
                target_hash=str(data.get("target_hash") or ""),
                label=str(data.get("label") or ""),
                note=str(data.get("note") or ""),
            )
        )
    return found


def _payload_data(payload: str) -> dict[str, Any]:
    try:
        data = json.loads(payload).get("data") or {}
    except (ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}
