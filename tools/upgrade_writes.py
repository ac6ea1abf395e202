"""The writes of tools/upgrade_check.sh: audit chains written by one version of jobops,
continued by another (docs/development.md#checks-against-an-older-release).

Run inside `manage.py shell` of the code under test, so that every import resolves to
that code (the old release's tree, then the current checkout):

    UPGRADE_PHASE=old|rolling|new python manage.py shell -c \\
        "import runpy; runpy.run_path('tools/upgrade_writes.py', run_name='__main__')"

`old` leaves jobs in every state a job can wait in (pending, running, retrying, failed
with an open dead letter, scheduled) beside ended ones, entries on the ops chain and a
signed checkpoint; `rolling` (the old code again, after the new release migrated: a
rolling upgrade's old process) runs a job and cancels one; `new` moves each waiting
job on through the services of the code it runs in, creates and runs new jobs, singly
and in batches, and writes a checkpoint.
Only the services' public names are used, the ones both versions keep.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from audit.checkpoints import checkpoint_write
from audit.services import Actor
from jobs.models import Job
from jobs.services import (
    WORKER,
    Fence,
    Finish,
    job_cancel,
    job_cancel_confirm,
    job_claim,
    job_create,
    job_fail_with_dead_letter,
    job_progress_write,
    job_retry,
    job_retry_failed,
    job_succeed,
    jobs_claim,
    jobs_finish,
)
from jobs.services.queues import queue_pause, queue_resume
from jobs.services.scheduling import promote_due_jobs
from jobs.states import Status
from tenants.models import Role
from tenants.services import default_organisation_ensure, member_add

PARAMS = {"steps": 2, "step_seconds": 0}
OPERATOR = Actor.system("upgrade-check")


def users() -> tuple[Any, Any]:
    """The jobs' owner, a member of the default organisation (audited on the ops chain
    as any membership), and an operator who may retry a failed job."""
    model = get_user_model()
    owner, created = model.objects.get_or_create(username="upgrade-owner")
    if created:
        org, _ = default_organisation_ensure(actor=OPERATOR)
        member_add(org=org, user=owner, role=Role.MEMBER, actor=OPERATOR)
    operator, created = model.objects.get_or_create(username="upgrade-operator", is_staff=True)
    if created:
        operator.user_permissions.add(*Permission.objects.filter(codename="replay_deadletter"))
    return owner, operator


def create(owner: Any, key: str, **extra: Any) -> Job:
    job, _ = job_create(
        owner=owner, job_type="sim", params=PARAMS, idempotency_key=f"upgrade-{key}", **extra
    )
    return job


def by_key(key: str) -> Job:
    return Job.objects.get(idempotency_key=f"upgrade-{key}")


def claim(job: Job, worker: str) -> Fence:
    claimed = job_claim(job_id=job.id, locked_by=worker)
    assert claimed is not None, f"job {job.id} ({job.status}) was not claimed"
    return Fence(worker, claimed.attempts)


def run_to_success(job: Job, worker: str) -> None:
    fence = claim(job, worker)
    job_progress_write(job_id=job.id, fence=fence, percent=50, step="half", message="Grüße")
    job_succeed(job_id=job.id, fence=fence, result={"rows": 2, "note": "ünïcode"})


def ops_entries(note: str) -> None:
    queue_pause(queue="sim", reason=f"upgrade check {note}", actor=OPERATOR)
    queue_resume(queue="sim", reason=f"upgrade check {note}", actor=OPERATOR)


def old_phase() -> None:
    owner, _operator = users()
    run_to_success(create(owner, "done"), "old-worker")
    retried = create(owner, "retrying")
    job_retry(
        job_id=retried.id,
        fence=claim(retried, "old-worker"),
        delay=0,
        error_code="TEMPORARY",
        error_message="later",
    )
    failed = create(owner, "failed")
    job_fail_with_dead_letter(
        job_id=failed.id,
        reason="fatal",
        actor=WORKER,
        error_code="BAD_INPUT",
        error_message="bad input",
        fence=claim(failed, "old-worker"),
    )
    running = create(owner, "running")
    job_progress_write(
        job_id=running.id, fence=claim(running, "old-worker"), percent=10, step="a", message=None
    )
    create(owner, "pending-1")
    create(owner, "pending-2", priority=7)
    job_cancel(job_id=create(owner, "cancelled").id, actor=Actor.user(owner))
    create(owner, "scheduled", run_at=timezone.now() + timedelta(hours=1))
    ops_entries("old")


def rolling_phase() -> None:
    """The old release's process still running after the new release migrated (a
    rolling upgrade): it must still write chains that verify."""
    owner, _operator = users()
    run_to_success(create(owner, "rolling-done"), "old-worker")
    job_cancel(job_id=create(owner, "rolling-cancelled").id, actor=Actor.user(owner))


def new_phase() -> None:
    owner, operator = users()
    # Jobs the old release left waiting, moved on by this one.
    run_to_success(by_key("retrying"), "new-worker")
    job_retry_failed(
        job_id=by_key("failed").id,
        actor=Actor.operator(operator),
        user=operator,
        justification="upgrade check",
    )
    running = by_key("running")
    fence = Fence(running.locked_by or "", running.attempts)
    job_progress_write(job_id=running.id, fence=fence, percent=60, step="b", message="x")
    job_cancel(job_id=running.id, actor=Actor.user(owner))
    job_cancel_confirm(job_id=running.id, fence=fence)
    assert promote_due_jobs(now=timezone.now() + timedelta(hours=2)) == 1
    # New jobs, singly and in a batch with the old pending ones (and the replayed job).
    run_to_success(create(owner, "new-single"), "new-worker")
    for n in range(3):
        create(owner, f"new-batch-{n}")
    claimed = jobs_claim(queues=["sim"], locked_by="new-host", limit=50)
    assert len(claimed) == 7, [job.idempotency_key for job in claimed]
    finishes = [
        Finish(job_id=job.id, attempt=job.attempts, target=Status.SUCCEEDED, result={"n": n})
        if n % 3
        else Finish(
            job_id=job.id,
            attempt=job.attempts,
            target=Status.RETRYING,
            error_code="TEMPORARY",
            error_message="later",
            delay=0,
        )
        for n, job in enumerate(claimed)
    ]
    assert jobs_finish(finishes=finishes, locked_by="new-host") == []
    ops_entries("new")


def main() -> None:
    phase = os.environ.get("UPGRADE_PHASE")
    phases = {"old": old_phase, "rolling": rolling_phase, "new": new_phase}
    if phase not in phases:
        sys.exit(f"UPGRADE_PHASE must be one of {', '.join(phases)}")
    phases[phase]()
    checkpoint = checkpoint_write()
    assert checkpoint is not None
    counts = {s: Job.objects.filter(status=s).count() for s in Status.values}
    print(f"upgrade check, {phase} writes done: {counts}")
    print(f"checkpoint {checkpoint.checkpoint_hash}")


if __name__ == "__main__":
    main()
