"""What verify_audit_chain checks about jobs besides their hash chains (AUDIT_VERIFY_CHECKS).

A chain whose tail was deleted (with the newest checkpoint, which named its head) still
links and hashes correctly; but the job row says where the chain should end. Each job's
status must be the status its chain's last transition leads to (jobs.states
STATUS_AFTER_EVENT): every transition writes both in one transaction, so anything else
is a chain that stops short, or a job row changed outside a transition.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import connection

from audit.verification import MAX_PROBLEMS, Problem, VerificationReport
from jobs.states import STATUS_AFTER_EVENT

_SQL = """
SELECT j.id::text, j.status, last.event_type, last.seq
FROM jobs j
LEFT JOIN LATERAL (
    SELECT a.event_type, a.seq FROM audit_logs a
    WHERE a.chain = 'job:' || j.id::text AND a.event_type = ANY(%(events)s)
    ORDER BY a.seq DESC LIMIT 1
) last ON true
LEFT JOIN unnest(%(events)s::text[], %(statuses)s::text[]) AS m(event, status)
    ON m.event = last.event_type
WHERE m.status IS DISTINCT FROM j.status {scope}
ORDER BY j.id
LIMIT %(limit)s
"""


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
        "ids": _job_ids(chains),
        "requested": _job_ids(requested),
        "since": since,
    }
    # uuid[] rather than id::text: the primary key index serves `--job` lookups.
    scope = ""
    if since is not None:
        scope = "AND (j.id = ANY(%(ids)s::uuid[]) OR j.updated_at >= %(since)s)"
        if requested is not None:
            scope += " AND j.id = ANY(%(requested)s::uuid[])"
    elif chains is not None:
        scope = "AND j.id = ANY(%(ids)s::uuid[])"
    with connection.cursor() as cursor:
        cursor.execute(_SQL.format(scope=scope), params)
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
