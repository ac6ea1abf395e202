"""Force-purge one job before its retention, an operator's decision about a straggler
(docs/operations/retention.md#stragglers): a job that holds an audit partition long
after that partition's retention ended.

It removes what the purge would (the job, its artefacts, closed dead letters, decided
edits, published outbox rows) and appends the same `purged` entry to the job's chain,
closing it, with `forced`, the operator and the justification: the decision is in the
hashed record. It overrides the retention and a live idempotency key only. An open
dead letter is an operator's decision of its own (discard or replay it on its page:
audited there), and so is a waiting fix-forward edit; an unfinished job is cancelled
first. Each of these is refused, saying so.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import structlog
from django.db import connection, transaction

from audit.services import Actor
from jobs.queries import QUERIES
from jobs.services.purge import PURGED, _after_commit, _category
from jobs.services.transitions import jobs_audit

log = structlog.get_logger("jobs.purge")

ENDED = ("succeeded", "failed", "cancelled")
MAX_JUSTIFICATION = 500


class ForcePurgeRefused(Exception):
    """The job cannot be force-purged (the message says why and what to do instead)."""


def job_force_purge(*, job_id: uuid.UUID, actor: Actor, justification: str) -> dict[str, Any]:
    """Purge the job `job_id` now, audited as forced by `actor` with `justification`."""
    justification = justification.strip()
    if not justification or len(justification) > MAX_JUSTIFICATION:
        raise ForcePurgeRefused(
            f"a justification of 1 to {MAX_JUSTIFICATION} characters is required"
        )
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["force_purge_lock"], {"id": job_id})
            row = cursor.fetchone()
        if row is None:
            raise ForcePurgeRefused(f"no job {job_id} (already purged?)")
        job_type, status, open_letter, held = row
        if status not in ENDED:
            raise ForcePurgeRefused(f"job {job_id} is {status}: cancel it first")
        if open_letter:
            raise ForcePurgeRefused(
                f"job {job_id} has an open dead letter: discard or replay it on its page first"
            )
        if held:
            raise ForcePurgeRefused(
                f"job {job_id} has a fix-forward edit waiting: reject it on its dead letter's page"
            )
        category = _category(job_type)
        jobs_audit(
            entries={
                job_id: {
                    "status": status,
                    "category": category,
                    "forced": True,
                    "justification": justification,
                }
            },
            event_type=PURGED,
            actor=actor,
        )
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["purge_delete"], {"ids": [job_id]})
            _jobs, dead_letters, _outbox, _edits, _unlinked, files = cursor.fetchone()
        per_category = Counter({category: 1})
        transaction.on_commit(lambda: _after_commit(files, per_category))
    log.info("job_force_purged", job_id=str(job_id), actor=actor.id, status=status)
    return {"job_id": str(job_id), "artefacts": len(files), "dead_letters": dead_letters}
