"""Idempotency keys after creation (docs/api.md#idempotency): a repeat within the TTL
reads the job and marks the key seen; a key past its TTL is released, by the
dispatcher's release_keys step in batches, or by a create that finds it first.

A release is not audited, as it never was: the audit chain records the job's life
(its transitions and what someone did to it), and a release changes neither. It only
ends the deduplication whose end the job's creation already fixed
(idempotency_expires_at). It does bump the version: the key leaves the job's body.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import structlog
from django.db import connection
from django.utils import timezone

from core.db import execute_prepared
from jobs.models import Job
from jobs.queries import QUERIES
from jobs.selectors import job_from_rows

log = structlog.get_logger("jobs.keys")

# Keys released per transaction: short row locks (SKIP LOCKED: a create or another
# dispatcher holding a row never waits for a batch, the batch passes it by).
KEY_RELEASE_BATCH = 500
# Batches per run of the step, so that a backlog (the first run after an outage) does
# not hold the loop; the loop runs a step that found work again soon after.
KEY_RELEASE_BATCHES = 10


def job_key_repeat(
    *,
    owner: Any,
    org_id: int,
    key: str,
    params_hash: str,
    project_id: int | None,
    now: datetime,
) -> Job | None:
    """The job `owner` made in the organisation under `key`, with its artefacts, or
    None: what a repeated
    create answers, in one statement. A repeat (the key within its TTL at `now`, the
    same params_hash and project) marks the key seen in that statement, to the second
    (job_repeat_by_key, jobs/queries.sql, says why)."""
    params = {
        "org": org_id,
        "owner": owner.pk,
        "key": key,
        "params_hash": params_hash,
        "project": project_id,
        "now": now,
    }
    return job_from_rows(execute_prepared(QUERIES["job_repeat_by_key"], params))


def job_release_idempotency_keys(
    *,
    job_ids: Iterable[uuid.UUID] | None = None,
    batch: int = KEY_RELEASE_BATCH,
    batches: int = KEY_RELEASE_BATCHES,
) -> int:
    """Release the keys past their TTL, so that a create with one makes a new job; of
    `job_ids` only, else up to `batches` batches of `batch` keys. Returns how many."""
    # The TTL counts from the job's creation (idempotency_expires_at, jobs.services.
    # creation); once jobs can be scheduled it counts from the later of creation and
    # run_at, which is decided where idempotency_expires_at is set, not here.
    before = timezone.now()
    if job_ids is not None:
        return sum(
            len(execute_prepared(QUERIES["key_release"], {"job_id": job_id, "before": before}))
            for job_id in job_ids
        )
    released = 0
    for _ in range(batches):
        # Outside a transaction each statement commits by itself: one batch each.
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["keys_release_due"], {"before": before, "limit": batch})
            count = cursor.rowcount
        released += count
        if count < batch:
            break
    if released:
        log.info("idempotency_keys_released", count=released)
    return released


def release_keys_once() -> int:
    """The dispatcher's release_keys step (docs/architecture.md#the-dispatcher)."""
    return job_release_idempotency_keys()
