"""`manage.py dlq`: list, peek, replay, discard for operators."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from jobs.domain.states import Status
from jobs.models import DeadLetter, Job
from tests.factories import OperatorFactory, UserFactory, job_in_state
from tests.polling import wait_for
from tests.queues import depth, worker_dead_letter

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("dlq", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_list_shows_depths_open_rows_and_error_codes(amqp):
    worker_dead_letter(amqp, code="UPSTREAM_500")
    worker_dead_letter(amqp, code="UPSTREAM_500")
    job_in_state("failed", reason="worker_lost")
    out = _run("list")
    assert "sim_dlq                     2          3" in out
    assert "2  sim_dlq" in out and "UPSTREAM_500" in out
    data = json.loads(_run("list", "--json"))
    sim = next(q for q in data["queues"] if q["queue"] == "sim_dlq")
    assert (sim["depth"], sim["open"]) == (2, 3)


def test_peek_prints_messages_and_consumes_nothing(amqp):
    job = worker_dead_letter(amqp)
    out = _run("peek", "sim", "--limit", "5")
    assert f"job {job.id} task jobs.sim attempt 1 routing_key sim reason rejected" in out
    assert "open" in out
    # Nothing consumed. A quorum DLQ takes a peeked message back through its log after
    # the peek's answer: the depth is 1 again shortly, not at that instant.
    wait_for(lambda: depth(amqp, "sim_dlq") == 1, timeout=10, what="the peeked message back")


def test_replay_dry_run_then_for_real(amqp):
    job = worker_dead_letter(amqp)
    operator = OperatorFactory(username="alice")
    out = _run("replay", "sim_dlq", "--as", "alice", "--justification", "fixed", "--dry-run")
    assert "dry run: 1 dead letter(s) would replay" in out and str(job.id) in out
    assert Job.objects.get(id=job.id).status == Status.FAILED

    out = _run("replay", "sim_dlq", "--as", "alice", "--justification", "fixed")
    assert "replayed 1 dead letter(s)" in out and "broker copies acked: 1" in out
    assert Job.objects.get(id=job.id).status in (Status.PENDING, Status.QUEUED)
    assert DeadLetter.objects.get(job=job).resolved_by == operator


def test_discard_of_selected_jobs(amqp):
    keep, drop = (
        job_in_state("failed", reason="worker_lost"),
        job_in_state("failed", reason="worker_lost"),
    )
    OperatorFactory(username="bob")
    out = _run("discard", "sim", "--as", "bob", "--justification", "dup", "--job", str(drop.id))
    assert "discarded 1 dead letter(s)" in out
    assert DeadLetter.objects.get(job=drop).state == "discarded"
    assert DeadLetter.objects.get(job=keep).state == "open"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replay", "sim", "--as", "carol", "--justification", "  "], "ERR-DLQ-422"),
        (["replay", "nope_dlq", "--as", "carol", "--justification", "x"], "unknown queue"),
        (["replay", "sim", "--as", "ghost", "--justification", "x"], "no user"),
        (["discard", "sim", "--as", "dave", "--justification", "x"], "ERR-DLQ-403"),
        (["replay", "sim", "--as", "carol", "--justification", "x", "--job", "42"], "Not job"),
        (["peek", "sim", "--limit", "0"], "--limit"),
    ],
)
def test_bad_input_is_a_clear_error(broker, args, message):
    OperatorFactory(username="carol")
    UserFactory(username="dave")
    with pytest.raises(CommandError, match=message):
        _run(*args)


def test_a_replay_dry_run_says_which_dead_letters_it_cannot_take(broker):
    from tests.factories import dead_letter_without_job

    dead_letter_without_job()
    job_in_state("failed", reason="worker_lost")
    operator = OperatorFactory()
    out = _run("replay", "sim", "--as", operator.username, "--justification", "x", "--dry-run")
    assert "1 dead letter names no job: it can only be discarded." in out
    assert "dry run: 1 dead letter(s) would replay" in out


@pytest.mark.parametrize("action", ["replay", "discard"])
def test_a_dry_run_needs_neither_an_operator_nor_a_justification(broker, action):
    """A dry run writes nothing: nobody to name, nothing to justify."""
    job = job_in_state("failed", reason="worker_lost")
    out = _run(action, "sim", "--dry-run")
    assert f"dry run: 1 dead letter(s) would {action}" in out and str(job.id) in out
    assert Job.objects.get(id=job.id).status == Status.FAILED
    assert DeadLetter.objects.get(job=job).state == "open"
    # Named, the operator's own scope and permission apply, as for the run.
    UserFactory(username="erin")
    with pytest.raises(CommandError, match="ERR-DLQ-403"):
        _run(action, "sim", "--as", "erin", "--dry-run")


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ([], "--as and --justification needed"),
        (["--as", "frank"], "--justification needed"),
        (["--justification", "fixed"], "--as needed"),
    ],
)
def test_a_real_run_still_needs_an_operator_and_a_justification(broker, given, missing):
    job = job_in_state("failed", reason="worker_lost")
    OperatorFactory(username="frank")
    for action in ("replay", "discard"):
        with pytest.raises(CommandError, match=missing):
            _run(action, "sim", *given)
    assert DeadLetter.objects.get(job=job).state == "open"


def test_a_dry_run_without_an_operator_checks_the_selection(broker):
    with pytest.raises(CommandError, match="unknown queue"):
        _run("replay", "nope", "--dry-run")
    with pytest.raises(CommandError, match="Not job"):
        _run("replay", "sim", "--dry-run", "--job", "42")
