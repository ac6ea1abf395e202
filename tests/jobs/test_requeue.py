"""Putting an ended job back in line is one rule (jobs.services.requeue): an operator's
replay, an owner's retry and a fix-forward move the job through its one write, with the
same reset, budget, dead-letter close and lock order; a re-run locks its original the
same way. Their entries stay as they were (tests/dlq, tests/jobs/test_retry_rerun.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dlq.services.fix_forward import fix_forward_request
from dlq.services.replay import dead_letters_replay
from jobs.domain.states import Status
from jobs.models import DeadLetter, DeadLetterState, Job, ParamsEdit, ParamsEditState
from jobs.services import job_rerun, job_retry_failed
from jobs.services import requeue as requeue_module
from jobs.services.requeue import Resolution
from tenants.selectors import actor_for
from tests.factories import OperatorFactory, job_failed, job_in_state

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def writes(monkeypatch):
    """Every statement the requeue service sends: (event type, job ids)."""
    seen: list[tuple[str, list]] = []
    many, one = requeue_module.jobs_requeue, requeue_module.job_requeue_with_params

    def spy_many(**kwargs):
        seen.append((kwargs["event_type"], list(kwargs["job_ids"])))
        return many(**kwargs)

    def spy_one(**kwargs):
        seen.append((kwargs["event_type"], [kwargs["job_id"]]))
        return one(**kwargs)

    monkeypatch.setattr(requeue_module, "jobs_requeue", spy_many)
    monkeypatch.setattr(requeue_module, "job_requeue_with_params", spy_one)
    return seen


# What going back in line resets besides the status: the previous run's leftovers.
REQUEUE_FIELDS = {
    "dead_letter_queue": None,
    "next_run_at": None,
    "result": None,
    "progress_percent": 0,
    "progress_step": None,
    "progress_message": None,
}


def _leftovers(job: Job) -> None:
    # What the previous run left on the row: going back in line clears all of it.
    Job.objects.filter(id=job.id).update(
        result={"partial": True}, progress_percent=40, progress_step="s", progress_message="m"
    )


def _assert_back_in_line(job: Job, *, budget_before: int) -> None:
    after = Job.objects.get(id=job.id)
    assert after.status == Status.PENDING
    assert after.max_attempts == budget_before * 2  # a fresh budget of the type's size
    for name, value in REQUEUE_FIELDS.items():
        assert getattr(after, name) == value, name
    row = DeadLetter.objects.get(job_id=job.id)
    assert row.state == DeadLetterState.REPLAYED


def test_a_replay_a_retry_and_a_fix_forward_all_write_through_the_one_service(writes):
    operator = OperatorFactory()
    replayed, retried, fixed = job_failed(), job_failed(), job_failed()
    for job in (replayed, retried, fixed):
        _leftovers(job)
    budget = Job.objects.get(id=replayed.id).max_attempts

    dead_letters_replay(actor_user=operator, justification="upstream back", job_ids=[replayed.id])
    job_retry_failed(
        job_id=retried.id, actor=actor_for(retried.owner), user=retried.owner, justification="r"
    )
    edit = fix_forward_request(
        dead_letter_id=DeadLetter.objects.get(job=fixed).id,
        actor_user=operator,
        params={"steps": 7, "step_seconds": 0},
        reason="a typo",
    )

    assert [(event, ids) for event, ids in writes] == [
        ("dlq_replayed", [replayed.id]),
        ("retried", [retried.id]),
        ("dlq_fixed_forward", [fixed.id]),
    ]
    for job in (replayed, retried, fixed):
        _assert_back_in_line(job, budget_before=budget)
    assert Job.objects.get(id=fixed.id).params["steps"] == 7
    edit.refresh_from_db()
    # The edit applied is not the one a closed row rejects: it was applied first.
    assert edit.state == ParamsEditState.APPLIED
    assert not ParamsEdit.objects.filter(job=fixed, state=ParamsEditState.REJECTED).exists()


def test_a_replay_of_jobs_of_two_types_takes_one_statement_per_type(writes):
    operator = OperatorFactory()
    sims = [job_failed(), job_failed()]
    other = job_failed(job_type="erp")
    result = dead_letters_replay(
        actor_user=operator,
        justification="again",
        job_ids=[job.id for job in (*sims, other)],
    )
    assert sorted(result.job_ids) == sorted(str(job.id) for job in (*sims, other))
    statements = sorted((event, sorted(map(str, ids))) for event, ids in writes)
    assert statements == sorted(
        [
            ("dlq_replayed", sorted(str(job.id) for job in sims)),
            ("dlq_replayed", [str(other.id)]),
        ]
    )


def test_a_job_no_longer_failed_under_the_lock_is_left_as_it_is():
    job = job_in_state("succeeded")
    by = Resolution(actor=actor_for(job.owner), actor_user=job.owner, justification="x")
    moved = requeue_module.jobs_requeue_locked(
        jobs=[Job.objects.only("id", "type").get(id=job.id)],
        by=by,
        event_type="retried",
        audit_data={job.id: by.audit_data(None)},
        rows={job.id: []},
    )
    assert moved == {}
    assert Job.objects.get(id=job.id).status == Status.SUCCEEDED


def test_a_rerun_locks_its_original_through_the_same_lock_order(monkeypatch):
    operator = OperatorFactory()
    original = job_in_state("succeeded")
    locked: list = []
    real = requeue_module.lock_jobs_then_open_rows

    def spy(**kwargs):
        locked.append(list(kwargs["job_ids"]))
        return real(**kwargs)

    monkeypatch.setattr(requeue_module, "lock_jobs_then_open_rows", spy)
    new = job_rerun(job_id=original.id, actor_user=operator, justification="once more")
    assert locked == [[original.id]]
    assert new.rerun_of_id == original.id


def test_dead_letters_are_locked_in_one_place_only():
    """The lock order (jobs, then dead letters) is stated once: no other module locks a
    dead letter row itself."""
    lockers = []
    for path in [*ROOT.joinpath("jobs").rglob("*.py"), *ROOT.joinpath("dlq").rglob("*.py")]:
        if "migrations" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        if "DeadLetter.objects.select_for_update" in text:
            lockers.append(path.relative_to(ROOT).as_posix())
    assert lockers == ["jobs/services/dead_letters.py"]


def test_only_the_requeue_service_moves_a_failed_job_back_to_pending():
    """`failed` -> `pending` is the SQL function jobs_requeue (and its fix-forward form);
    any other caller of it would be a second copy of the rule."""
    callers = []
    for path in [*ROOT.joinpath("jobs").rglob("*.py"), *ROOT.joinpath("dlq").rglob("*.py")]:
        if "migrations" in path.parts or path.name == "transitions.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(getattr(node, "func", None), "id", None)
            if isinstance(node, ast.Call) and name in _REQUEUES:
                callers.append(path.relative_to(ROOT).as_posix())
    assert sorted(set(callers)) == ["jobs/services/requeue.py"]


_REQUEUES = {"jobs_requeue", "job_requeue_with_params"}
