"""Fix-forward (docs/operator-controls.md#fix-forward): a dead letter's job replayed with
edited params, the hashes and paths in the chain, the values in params_edits, and four
eyes with JOBOPS_REPLAY_APPROVAL."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from audit.models import AuditLog
from audit.services import job_chain
from audit.verification import audit_verify
from dlq.services.fix_forward import (
    fix_forward_approve,
    fix_forward_reject,
    fix_forward_request,
    params_diff,
)
from jobs.domain.states import Status
from jobs.models import DeadLetter, DeadLetterState, Job, ParamsEdit
from jobs.services import params_hash
from tenants.models import OperatorScope
from tests.factories import (
    OperatorFactory,
    OrganisationFactory,
    StaffFactory,
    job_failed,
    otp_login,
    role_user,
)

pytestmark = pytest.mark.django_db

SECRET = "sensitive-value-4711"


def failed_with_label() -> Job:
    job = job_failed(code="BAD_INPUT")
    # The params as a bad client sent them: a value the operator must correct.
    Job.objects.filter(id=job.id).update(params={"steps": 2, "step_seconds": 0, "label": "wrong"})
    return Job.objects.get(id=job.id)


def entries(job: Job) -> list[AuditLog]:
    return list(AuditLog.objects.filter(chain=job_chain(job.id)).order_by("seq"))


def data(entry: AuditLog) -> dict:
    return json.loads(entry.payload)["data"]


def test_params_diff_names_changed_added_and_removed_paths():
    old = {"a": 1, "b": {"c": [1, 2], "d": True}, "gone": 0, "x/y": 1}
    new = {"a": 1, "b": {"c": [1, 3], "d": 1}, "added": None, "x/y": 2}
    assert params_diff(old, new) == ["/added", "/b/c/1", "/b/d", "/gone", "/x~1y"]
    assert params_diff({"l": [1]}, {"l": [1, 2]}) == ["/l"]
    assert params_diff({"n": 1}, {"n": 1.0}) == []
    assert params_diff(old, old) == []


def test_an_edited_replay_runs_the_job_with_the_new_params_and_audits_hashes_only():
    job = job_failed(code="BAD_INPUT")
    row = DeadLetter.objects.get(job=job)
    operator = OperatorFactory()
    new_params = {"steps": 7, "step_seconds": 0}
    edit = fix_forward_request(
        dead_letter_id=row.id, actor_user=operator, params=new_params, reason=f"typo {SECRET}"
    )
    assert edit.state == "applied" and edit.approved_by_id is None
    after = Job.objects.get(id=job.id)
    assert after.status == Status.PENDING and after.params["steps"] == 7
    assert after.params_hash == params_hash("sim", after.params)
    assert after.max_attempts == job.max_attempts * 2 and after.attempts == job.attempts
    row.refresh_from_db()
    assert row.state == DeadLetterState.REPLAYED and row.resolved_by_id == operator.pk
    stored = ParamsEdit.objects.get(id=edit.id)
    assert stored.old_params == job.params and stored.new_params == after.params
    assert stored.changed_paths == ["/steps"] and stored.applied_at is not None
    entry = entries(job)[-1]
    assert entry.event_type == "dlq_fixed_forward" and entry.actor_type == "operator"
    audited = data(entry)
    assert audited["old_params_sha256"] == job.params_hash
    assert audited["new_params_sha256"] == after.params_hash
    assert audited["changed_paths"] == ["/steps"] and SECRET in audited["reason"]
    # Never the values: neither the old nor the new params appear in the chain.
    assert '"steps":7' not in entry.payload and '"steps":2' not in entry.payload
    assert audit_verify(job_ids=[job.id]).ok


def test_values_stay_out_of_the_chain():
    job = failed_with_label()
    row = DeadLetter.objects.get(job=job)
    new = {**job.params, "label": SECRET}
    with pytest.raises(Exception) as unknown:  # sim has no `label`: the schema refuses it
        fix_forward_request(
            dead_letter_id=row.id, actor_user=OperatorFactory(), params=new, reason="r"
        )
    assert unknown.value.code == "ERR-JOB-422"
    assert not any(SECRET in e.payload for e in entries(job))


@pytest.mark.parametrize(
    "params, reason, code",
    [
        ({"steps": "many", "step_seconds": 0}, "r", "ERR-JOB-422"),
        ({"steps": 0, "step_seconds": 0}, "r", "ERR-JOB-422"),
        (["not", "an", "object"], "r", "ERR-JOB-422"),
        ({"steps": 2, "step_seconds": 0}, "r", "ERR-DLQ-422"),  # no change
        ({"steps": 9, "step_seconds": 0}, "", "ERR-JOB-400"),  # reason required
        ({"steps": 9, "step_seconds": 0}, "x" * 1001, "ERR-JOB-400"),
    ],
)
def test_invalid_edits_are_refused_and_change_nothing(params, reason, code):
    job = job_failed()
    row = DeadLetter.objects.get(job=job)
    with pytest.raises(Exception) as refused:
        fix_forward_request(
            dead_letter_id=row.id, actor_user=OperatorFactory(), params=params, reason=reason
        )
    assert refused.value.code == code
    assert Job.objects.get(id=job.id).status == Status.FAILED
    assert not ParamsEdit.objects.exists()


def test_only_operators_within_their_organisations_edit():
    job = job_failed()
    row = DeadLetter.objects.get(job=job)
    edit = {"params": {"steps": 9, "step_seconds": 0}, "reason": "r"}
    with pytest.raises(Exception) as viewer:
        fix_forward_request(dead_letter_id=row.id, actor_user=StaffFactory(), **edit)
    assert viewer.value.code == "ERR-DLQ-403"
    limited = OperatorFactory()
    OperatorScope.objects.create(user=limited).organisations.add(OrganisationFactory())
    with pytest.raises(Exception) as hidden:
        fix_forward_request(dead_letter_id=row.id, actor_user=limited, **edit)
    assert hidden.value.code == "ERR-DLQ-404"
    assert Job.objects.get(id=job.id).status == Status.FAILED


def test_with_approval_the_requester_cannot_approve_and_a_second_operator_can(settings):
    settings.JOBOPS_REPLAY_APPROVAL = True
    job = job_failed()
    row = DeadLetter.objects.get(job=job)
    requester, second = OperatorFactory(), OperatorFactory()
    edit = fix_forward_request(
        dead_letter_id=row.id,
        actor_user=requester,
        params={"steps": 5, "step_seconds": 0},
        reason="fix",
    )
    assert edit.state == "requested"
    assert Job.objects.get(id=job.id).status == Status.FAILED  # nothing runs yet
    assert entries(job)[-1].event_type == "fix_forward_requested"
    with pytest.raises(Exception) as own:
        fix_forward_approve(edit_id=edit.id, actor_user=requester)
    assert own.value.code == "ERR-DLQ-403"
    assert Job.objects.get(id=job.id).status == Status.FAILED
    approved = fix_forward_approve(edit_id=edit.id, actor_user=second)
    assert (approved.state, approved.approved_by_id) == ("applied", second.pk)
    after = Job.objects.get(id=job.id)
    assert after.status == Status.PENDING and after.params["steps"] == 5
    assert data(entries(job)[-1])["approved_by"] == str(second.pk)
    with pytest.raises(Exception) as twice:
        fix_forward_approve(edit_id=edit.id, actor_user=OperatorFactory())
    assert twice.value.code == "ERR-DLQ-409"
    assert audit_verify(job_ids=[job.id]).ok


def test_a_rejected_edit_runs_nothing(settings):
    settings.JOBOPS_REPLAY_APPROVAL = True
    job = job_failed()
    row = DeadLetter.objects.get(job=job)
    edit = fix_forward_request(
        dead_letter_id=row.id,
        actor_user=OperatorFactory(),
        params={"steps": 5, "step_seconds": 0},
        reason="fix",
    )
    rejected = fix_forward_reject(edit_id=edit.id, actor_user=OperatorFactory())
    assert rejected.state == "rejected"
    assert Job.objects.get(id=job.id).status == Status.FAILED
    row.refresh_from_db()
    assert row.state == DeadLetterState.OPEN
    assert entries(job)[-1].event_type == "fix_forward_rejected"
    with pytest.raises(Exception) as late:
        fix_forward_approve(edit_id=edit.id, actor_user=OperatorFactory())
    assert late.value.code == "ERR-DLQ-409"


def test_an_edit_made_stale_by_a_replay_does_not_apply(settings):
    settings.JOBOPS_REPLAY_APPROVAL = True
    from jobs.services import job_retry_for_user

    job = job_failed()
    row = DeadLetter.objects.get(job=job)
    edit = fix_forward_request(
        dead_letter_id=row.id,
        actor_user=OperatorFactory(),
        params={"steps": 5, "step_seconds": 0},
        reason="fix",
    )
    job_retry_for_user(job_id=job.id, user=job.owner)
    with pytest.raises(Exception) as stale:
        fix_forward_approve(edit_id=edit.id, actor_user=OperatorFactory())
    assert stale.value.code == "ERR-DLQ-409"
    assert Job.objects.get(id=job.id).params["steps"] == 2


def test_the_portal_previews_the_diff_then_requests_and_a_second_operator_approves(settings):
    settings.JOBOPS_REPLAY_APPROVAL = True
    job = job_failed()
    row = DeadLetter.objects.get(job=job)
    first = otp_login(Client(), role_user("operator"))
    detail = reverse("admin:jobs_deadletter_change", args=[row.id])
    page = reverse("admin:jobs_deadletter_fix_forward", args=[row.id])
    assert b'id="fix-forward"' in first.get(detail).content
    form = first.get(page)
    assert form.status_code == 200 and b"&quot;steps&quot;: 2" in form.content
    bad = first.post(page, {"params": "{not json", "reason": "r", "preview": "1"})
    assert b'id="fix-forward-error"' in bad.content
    edited = json.dumps({"steps": 4, "step_seconds": 0})
    preview = first.post(page, {"params": edited, "reason": "r", "preview": "1"})
    assert preview.context["diff"] == [{"path": "/steps", "old": 2, "new": 4}]
    assert Job.objects.get(id=job.id).status == Status.FAILED  # a preview writes nothing
    done = first.post(page, {"params": edited, "reason": "fix the steps", "confirm": "1"})
    assert done.status_code == 302
    edit = ParamsEdit.objects.get(job=job)
    mine = first.get(detail).content.decode()
    assert f'id="approve-edit-{edit.id}"' not in mine  # the requester is offered no approve
    approve = reverse("admin:jobs_deadletter_params_edit_decide", args=[edit.id, "approve"])
    assert first.post(approve).status_code == 403
    second = otp_login(Client(), role_user("operator"))
    assert f'id="approve-edit-{edit.id}"' in second.get(detail).content.decode()
    assert second.post(approve).status_code == 302
    assert Job.objects.get(id=job.id).status == Status.PENDING
    viewer = otp_login(Client(), role_user("viewer"))
    assert viewer.get(page).status_code == 403


def _preview(params_text: str):
    """The portal's "Show the changes" for a failed job's dead letter, as an operator."""
    row = DeadLetter.objects.get(job=job_failed())
    page = reverse("admin:jobs_deadletter_fix_forward", args=[row.id])
    client = otp_login(Client(raise_request_exception=False), role_user("operator"))
    return client.post(page, {"params": params_text, "reason": "r", "preview": "1"})


@pytest.mark.parametrize(
    ("params_text", "said"),
    [
        ('{"a":' * 5000 + "1" + "}" * 5000, "nested deeper than 32 levels"),
        ("[" * 5000 + "]" * 5000, "nested deeper than 32 levels"),
        ('{"steps": 2, "label": "a\\u0000b"}', "NUL character"),
        ('{"steps": 2, "label": "' + "a" * 300_000 + '"}', "at most 262144 are accepted"),
        ('{"steps": ' + "9" * 5000 + "}", "more than 4300 digits"),
    ],
    ids=["5000-deep-object", "5000-deep-list", "nul", "oversize", "long-number"],
)
def test_show_the_changes_refuses_what_the_api_refuses_in_words(params_text, said):
    """The API's JSON bounds (core/api/parsers.py) hold on the portal's form too: a 200
    page that says what is wrong, never a 500 (issue 37, M2)."""
    answer = _preview(params_text)
    assert answer.status_code == 200
    error = answer.content.decode()
    assert 'id="fix-forward-error"' in error and said in error


def test_a_schema_error_is_shown_as_field_and_message_not_a_python_repr():
    """Issue 37, M3: `steps: A valid integer is required.`, not `{'steps': [ErrorDetail(...)]}`."""
    answer = _preview(json.dumps({"steps": "many", "step_seconds": 0}))
    text = answer.content.decode()
    assert answer.status_code == 200 and 'id="fix-forward-error"' in text
    assert "ErrorDetail" not in text and "{&#x27;" not in text
    assert "steps: A valid integer is required." in text
