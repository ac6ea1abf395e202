"""Fix-forward: a dead job replayed with edited params (docs/operator-controls.md).

An operator edits the params of a dead job, the type's schema validates them, and the
job is replayed with them: its params (and params_hash) change in the same statement
as its `failed` -> `pending` transition (audited `dlq_fixed_forward`). The chain holds
the old and new params' sha256 (the job's params_hash of each), the changed paths and
the reason, never the values (they may be personal data); the full diff stays beside
it in the ordinary table `params_edits` (jobs.models.ParamsEdit).

With JOBOPS_REPLAY_APPROVAL an edit is only requested (audited
`fix_forward_requested`, no status change); a second operator approves it (then it is
applied) or rejects it (audited `fix_forward_rejected`); the requester can do neither
to approve (four eyes), though they may withdraw it by a rejection.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import Actor
from dlq.errors import (
    DeadLetterNotFoundError,
    DeadLetterPermissionError,
    FixForwardConflictError,
    FixForwardInputError,
    FourEyesError,
)
from dlq.services.locks import lock_jobs_then_open_rows
from dlq.services.replay import ResolveResult, broker_copies_ack_resolved
from dlq.services.selection import PERMISSIONS
from jobs.domain.states import Status
from jobs.models import DeadLetter, DeadLetterState, Job, ParamsEdit, ParamsEditState
from jobs.services import job_audit, params_hash, validate_params
from jobs.services.requeue import (
    NewParams,
    Resolution,
    clean_reason,
    jobs_requeue_locked,
    operator_may_requeue,
)
from tenants.selectors import operator_org_ids

# Changed paths listed per edit: a rewrite of a huge list is summarised by its parent.
MAX_PATHS = 200


def params_diff(old: Any, new: Any, path: str = "") -> list[str]:
    """The JSON Pointers (RFC 6901) where `new` differs from `old`: added, removed or
    changed leaves; a value that changes kind (object, list, scalar) is one path."""
    if isinstance(old, dict) and isinstance(new, dict):
        paths: list[str] = []
        for key in sorted(set(old) | set(new)):
            escaped = str(key).replace("~", "~0").replace("/", "~1")
            child = f"{path}/{escaped}"
            if key not in old or key not in new:
                paths.append(child)
            else:
                paths.extend(params_diff(old[key], new[key], child))
        return paths
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        pairs = enumerate(zip(old, new, strict=True))
        return [p for i, (a, b) in pairs for p in params_diff(a, b, f"{path}/{i}")]
    # JSON has one number type (1 and 1.0 are the same value), but a bool is an int in
    # Python: True == 1, and they are different JSON values.
    numbers = (int, float)
    if isinstance(old, numbers) and isinstance(new, numbers):
        if isinstance(old, bool) == isinstance(new, bool) and old == new:
            return []
        return [path or "/"]
    if type(old) is not type(new) or old != new:
        return [path or "/"]
    return []


_MISSING = object()


def pointer_get(value: Any, path: str) -> Any:
    """The value at JSON Pointer `path` in `value`, or "(absent)" (for showing a diff)."""
    if path == "/":
        return value
    for part in path.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            value = value.get(key, _MISSING)
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            value = _MISSING
        if value is _MISSING:
            return "(absent)"
    return value


def diff_rows(old: Any, new: Any, paths: list[str]) -> list[dict[str, Any]]:
    """Each changed path with its old and new values, for the operator's page (never
    for the chain)."""
    return [{"path": p, "old": pointer_get(old, p), "new": pointer_get(new, p)} for p in paths]


def _check_operator(actor_user: Any) -> None:
    if not operator_may_requeue(actor_user, PERMISSIONS["replay"]):
        raise DeadLetterPermissionError()


def _visible_rows(actor_user: Any) -> Any:
    # A staff member limited to some organisations edits only their jobs' dead letters.
    rows = DeadLetter.objects.filter(job__isnull=False)
    org_ids = operator_org_ids(actor_user)
    if org_ids is not None:
        rows = rows.filter(job__org_id__in=org_ids)
    return rows


def _visible_edits(actor_user: Any) -> Any:
    edits = ParamsEdit.objects.select_related("dead_letter", "job")
    org_ids = operator_org_ids(actor_user)
    if org_ids is not None:
        edits = edits.filter(job__org_id__in=org_ids)
    return edits


def fix_forward_preview(*, dead_letter_id: int, actor_user: Any, params: Any) -> dict[str, Any]:
    """What an edit would do, nothing written: the validated new params (the schema's
    value: defaults filled in, numbers normalised), the changed paths, both hashes."""
    _check_operator(actor_user)
    row = _visible_rows(actor_user).select_related("job").filter(id=dead_letter_id).first()
    if row is None or row.job is None:
        raise DeadLetterNotFoundError()
    job = row.job
    new = validate_params(job.type, params, owner=job.owner, staff=True, org_id=job.org_id)
    paths = params_diff(job.params, new)
    if not paths:
        raise FixForwardInputError(
            "The edited params are the job's params: replay it instead.",
            details={"params": ["No change."]},
        )
    if len(paths) > MAX_PATHS:
        raise FixForwardInputError(details={"params": [f"At most {MAX_PATHS} changed paths."]})
    return {
        "row": row,
        "job": job,
        "new_params": new,
        "changed_paths": paths,
        "old_params_sha256": job.params_hash,
        "new_params_sha256": params_hash(job.type, new),
    }


def fix_forward_request(
    *, dead_letter_id: int, actor_user: Any, params: Any, reason: Any
) -> ParamsEdit:
    """Edit a dead job's params and replay it with them (without approval), or request
    that (JOBOPS_REPLAY_APPROVAL: a second operator decides).

    1. An operator (jobs.replay_deadletter) who may see the row; a reason (bounded).
    2. The new params pass the type's schema and change something (else 422).
    3. The job must be `failed` with this row open (else 409).
    4. The ParamsEdit row with the full diff; then, without approval, `fix_forward_apply`.
    """
    _check_operator(actor_user)
    text = clean_reason(reason, field="reason", required=True)
    preview = fix_forward_preview(
        dead_letter_id=dead_letter_id, actor_user=actor_user, params=params
    )
    row, job = preview["row"], preview["job"]
    if row.state != DeadLetterState.OPEN or job.status != Status.FAILED:
        raise FixForwardConflictError(
            "Only an open dead letter of a failed job can be fixed forward.",
            details={"state": row.state, "status": job.status},
        )
    approval = settings.JOBOPS_REPLAY_APPROVAL
    with transaction.atomic():
        # The row must still be open once locked: a discard that closed it meanwhile
        # settled the edits it saw, and would never see this one.
        if not lock_jobs_then_open_rows(job_ids=[job.id], dead_letter_ids=[row.id]).open_rows:
            raise FixForwardConflictError(
                "Only an open dead letter of a failed job can be fixed forward.",
                details={"state": "closed", "status": job.status},
            )
        if ParamsEdit.objects.filter(dead_letter=row, state=ParamsEditState.REQUESTED).exists():
            raise FixForwardConflictError(
                "An edit of this dead letter is waiting for approval: decide it first."
            )
        edit = ParamsEdit.objects.create(
            dead_letter=row,
            job=job,
            requested_by=actor_user,
            old_params=job.params,
            new_params=preview["new_params"],
            old_params_sha256=preview["old_params_sha256"],
            new_params_sha256=preview["new_params_sha256"],
            changed_paths=preview["changed_paths"],
            reason=text,
        )
        if approval:
            job_audit(
                job_id=job.id,
                event_type="fix_forward_requested",
                actor=Actor.operator(actor_user),
                data=_audit_data(edit),
            )
    if not approval:
        return fix_forward_apply(edit=edit, actor_user=actor_user)
    return edit


def _audit_data(edit: ParamsEdit) -> dict[str, Any]:
    """What the chain holds of an edit: hashes, paths and the reason; never a value."""
    return {
        "params_edit_id": edit.id,
        "dead_letter_id": edit.dead_letter_id,
        "old_params_sha256": edit.old_params_sha256,
        "new_params_sha256": edit.new_params_sha256,
        "changed_paths": edit.changed_paths,
        "reason": edit.reason,
        "requested_by": str(edit.requested_by_id),
        "approved_by": None if edit.approved_by_id is None else str(edit.approved_by_id),
    }


def fix_forward_approve(*, edit_id: int, actor_user: Any) -> ParamsEdit:
    """A second operator approves a requested edit: it is applied at once. The requester
    cannot approve their own edit (403)."""
    _check_operator(actor_user)
    edit = _visible_edits(actor_user).filter(id=edit_id).first()
    if edit is None:
        raise DeadLetterNotFoundError("No such params edit.")
    if edit.requested_by_id == actor_user.pk:
        raise FourEyesError()
    if edit.state != ParamsEditState.REQUESTED:
        raise FixForwardConflictError(f"The edit is {edit.state} already.")
    edit.approved_by = actor_user
    return fix_forward_apply(edit=edit, actor_user=actor_user)


def fix_forward_reject(*, edit_id: int, actor_user: Any) -> ParamsEdit:
    """An operator rejects a requested edit (the requester may withdraw theirs this
    way): nothing runs, the dead letter stays open."""
    _check_operator(actor_user)
    with transaction.atomic():
        # The job first, then the edit: the order of a replay or discard, which rejects
        # the edits waiting on the rows it closes (jobs.services.params_edits_settle).
        job_id = _visible_edits(actor_user).filter(id=edit_id).values_list("job_id", flat=True)
        lock_jobs_then_open_rows(job_ids=list(job_id))
        edit = _visible_edits(actor_user).select_for_update(of=("self",)).filter(id=edit_id).first()
        if edit is None:
            raise DeadLetterNotFoundError("No such params edit.")
        if edit.state != ParamsEditState.REQUESTED:
            raise FixForwardConflictError(f"The edit is {edit.state} already.")
        edit.state = ParamsEditState.REJECTED
        edit.decided_at = timezone.now()
        edit.rejected_by = actor_user
        edit.save(update_fields=["state", "decided_at", "rejected_by"])
        job_audit(
            job_id=edit.job_id,
            event_type="fix_forward_rejected",
            actor=Actor.operator(actor_user),
            data={"params_edit_id": edit.id, "dead_letter_id": edit.dead_letter_id},
        )
    return edit


def fix_forward_apply(*, edit: ParamsEdit, actor_user: Any) -> ParamsEdit:
    """Apply an edit in one transaction: lock the job, then its row (the order of every
    dead-letter writer); the job must still be `failed` with the params the edit was
    made from and the row open; one statement moves it to `pending` with the new
    params, a fresh retry budget and its `dlq_fixed_forward` entry; the row ->
    `replayed` by the operator who applied it, with the reason; the edit -> `applied`.
    After the commit, the row's broker copy is acked away (best effort)."""
    with transaction.atomic():
        locked = lock_jobs_then_open_rows(
            job_ids=[edit.job_id],
            job_fields=("id", "type", "status", "params_hash"),
            dead_letter_ids=[edit.dead_letter_id],
        )
        job: Job | None = locked.jobs.get(edit.job_id)
        current = ParamsEdit.objects.select_for_update().get(id=edit.id)
        if (
            job is None
            or not locked.open_rows
            or job.status != Status.FAILED
            or job.params_hash != edit.old_params_sha256
            or current.state != ParamsEditState.REQUESTED
        ):
            raise FixForwardConflictError()
        row = locked.open_rows[0]
        now = timezone.now()
        edit.state = ParamsEditState.APPLIED
        edit.decided_at = edit.decided_at or now
        edit.applied_at = now
        # Applied before its row closes: closing a row rejects the edits still waiting
        # on it, and this one is not waiting any more.
        edit.save(update_fields=["state", "decided_at", "applied_at", "approved_by"])
        moved = jobs_requeue_locked(
            jobs=[job],
            by=Resolution(
                actor=Actor.operator(actor_user), actor_user=actor_user, justification=edit.reason
            ),
            event_type="dlq_fixed_forward",
            audit_data={
                job.id: _audit_data(edit) | {"queue": row.queue, "message_id": row.message_id}
            },
            rows={job.id: [row.id]},
            new_params=NewParams(edit.new_params, edit.new_params_sha256),
            now=now,
        )
        if job.id not in moved:  # it was failed under the lock: it moves
            raise FixForwardConflictError()
    broker_copies_ack_resolved(
        result=ResolveResult(action="replay", dry_run=False), queues=[row.queue]
    )
    return edit
