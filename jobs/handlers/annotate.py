"""`annotate` (category audit_enrichment, docs/architecture.md#annotations): appends one
`annotated` entry to this job's own audit chain, naming another job's entry (its seq
and hash) with a label and a note. The annotated job is only read, never changed, and
its chain never appended to.

Creation checked that the owner may see the target in the job's organisation; here the
target must still be there (purged since: a non-retryable failure). Idempotent: a run
after a lost worker finds the entry its earlier attempt appended.
"""

from __future__ import annotations

from typing import Any

from jobs.services.annotations import annotation_target_entry, job_annotate


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    target = annotation_target_entry(
        org_id=ctx.org_id,
        target_job_id=params["target_job_id"],
        target_seq=params["target_seq"],
    )
    ctx.check_cancel()
    entry = job_annotate(
        job_id=ctx.job_id,
        fence=ctx.fence,
        target=target,
        label=params["label"],
        note=params.get("note", ""),
    )
    return {
        "target_job_id": params["target_job_id"],
        "target_seq": target.seq,
        "target_hash": target.chain_hash,
        "annotated_seq": entry.seq,
    }
