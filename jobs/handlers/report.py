"""`report`: a CSV of the owner's jobs (optionally filtered by status and type), saved as
an artefact. A handler sees only its owner's data, and never outside the job's own
organisation (docs/tenancy.md#execution): every owner's jobs of that organisation only
when a staff owner asked for `all_owners` (jobs.domain.params.ReportParams checks who may).
Rows are streamed to a temporary file, so memory stays flat whatever the limit.
"""

from __future__ import annotations

import csv
import io
import tempfile
from typing import Any

from jobs.models import Job

HEADER = ["id", "type", "status", "attempts", "created_at", "updated_at"]


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    # The tenant comes from the job's row (ctx.org_id), not from params: no caller can
    # name another organisation.
    jobs = Job.objects.filter(org_id=ctx.org_id).order_by("-created_at")
    if not params.get("all_owners"):
        jobs = jobs.filter(owner_id=ctx.owner_id)
    if params.get("status"):
        jobs = jobs.filter(status=params["status"])
    if params.get("type"):
        jobs = jobs.filter(type=params["type"])
    rows = jobs.values_list(*HEADER)[: params["limit"]]
    count = 0
    with tempfile.TemporaryFile() as spool:
        text = io.TextIOWrapper(spool, encoding="utf-8", newline="")
        writer = csv.writer(text)
        writer.writerow(HEADER)
        for job_id, job_type, status, attempts, created, updated in rows.iterator():
            writer.writerow(
                [job_id, job_type, status, attempts, created.isoformat(), updated.isoformat()]
            )
            count += 1
        text.flush()
        ctx.progress(80, step="written", message=f"{count} rows")
        spool.seek(0)
        artefact = ctx.save_artefact("report", "jobs.csv", spool, content_type="text/csv")
        text.detach()
    return {"rows": count, "artefact_id": str(artefact.id), "sha256": artefact.sha256}
