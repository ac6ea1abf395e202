"""What verify_audit_chain checks about jobs besides their hash chains (AUDIT_VERIFY_CHECKS).

A chain whose tail was deleted (with the newest checkpoint, which named its head) still
links and hashes correctly; but the job row says where the chain should end. Each job's
status must be the status its chain's last transition leads to (jobs.domain.states
STATUS_AFTER_EVENT): every transition writes both in one transaction, so anything else
is a chain that stops short, or a job row changed outside a transition.

A purged job has no row: its chain ends in `purged` (jobs/services/purge.py), appended
in the transaction that deleted it, and is complete without it. Any other job chain
whose row is missing names a job deleted outside the purge.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import connection

from audit.verification import MAX_PROBLEMS, Problem, VerificationReport
from jobs.domain.states import STATUS_AFTER_EVENT
from jobs.queries import QUERIES


def job_status_matches_chain(
    report: VerificationReport,
    chains: list[str] | None,
    *,
    requested: list[str] | None = None,
    since: datetime | None = None,
) -> None:
    """Report each job whose status is not where its audit chain says it should be.

    Which jobs: all; or those of `chains`; with `since`, also every job whose row
    changed since then, among those `requested` (None: all). A tail deleted after
    `since` leaves no audit row since then, so its chain is not among `chains`, but
    the job row still changed since then.
    """
    params: dict[str, Any] = {
        "events": list(STATUS_AFTER_EVENT),
        "statuses": [str(s) for s in STATUS_AFTER_EVENT.values()],
        "limit": MAX_PROBLEMS,
        # All jobs, or those of `chains` (and, with `since`, those changed since then).
        "ids": None if chains is None and since is None else _job_ids(chains),
        "since": since,
        # `requested` narrows a `since` verification only.
        "requested": None if requested is None or since is None else _job_ids(requested),
    }
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["status_against_chain"], params)
        rows = cursor.fetchall()
    for job_id, status, event, seq in rows:
        if event is None:
            message = f"the job is {status} but its chain records no transition at all"
        else:
            message = (
                f"the job is {status} but its chain ends at {event} (seq {seq}): the chain "
                "stops short, or the job row was changed outside a transition"
            )
        report.add(
            Problem(
                kind="status_mismatch",
                message=message,
                chain=f"job:{job_id}",
                job_id=job_id,
                seq=seq,
            )
        )


def job_rows_present(
    report: VerificationReport,
    chains: list[str] | None,
    *,
    requested: list[str] | None = None,
    since: datetime | None = None,
) -> None:
    """Report each job chain, not ending in `purged`, whose job row is missing.

    Which chains: all, or the job chains among `chains` (with `since`, those with an
    entry since then: a row deleted without a trace in the audit log is found by a
    verification that reads every chain)."""
    params = {"ids": None if chains is None else _job_ids(chains), "limit": MAX_PROBLEMS}
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["chains_without_job"], params)
        rows = cursor.fetchall()
    for job_id, event, seq in rows:
        report.add(
            Problem(
                kind="job_missing",
                message=(
                    f"the job row is missing but its chain ends at {event} (seq {seq}), "
                    "not purged: the job was deleted outside the purge"
                ),
                chain=f"job:{job_id}",
                job_id=job_id,
                seq=seq,
            )
        )


def _job_ids(chains: list[str] | None) -> list[str]:
    """The job ids of `job:<uuid>` chains (any other chain names no job)."""
    ids = []
    for chain in chains or []:
        if chain.startswith("job:"):
            try:
                ids.append(str(uuid.UUID(chain[4:])))
            except ValueError:
                continue
    return ids
