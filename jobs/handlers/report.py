"""`report`: a CSV of jobs (optionally filtered by status and type) saved as an artefact."""

from __future__ import annotations

import csv
import io
from typing import Any

from jobs.models import Job


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    jobs = Job.objects.order_by("-created_at")
    if params.get("status"):
        jobs = jobs.filter(status=params["status"])
    if params.get("type"):
        jobs = jobs.filter(type=params["type"])
    rows = jobs.values_list("id", "type", "status", "attempts", "created_at", "updated_at")[
        : int(params.get("limit", 1000))
    ]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["id", "type", "status", "attempts", "created_at", "updated_at"])
    count = 0
    for job_id, job_type, status, attempts, created, updated in rows.iterator():
        writer.writerow(
            [job_id, job_type, status, attempts, created.isoformat(), updated.isoformat()]
        )
        count += 1
    ctx.progress(80, step="written", message=f"{count} rows")
    artefact = ctx.save_artefact("report", "jobs.csv", buffer.getvalue(), content_type="text/csv")
    return {"rows": count, "artefact_id": str(artefact.id), "sha256": artefact.sha256}
