"""The payload version of a job message (docs/operations/upgrading.md): a worker runs its
own version and the previous one (a message without `v` counts as the previous), and
fails a job whose message carries any other with an UNSUPPORTED_VERSION dead letter,
before the claim and without running the handler."""

from __future__ import annotations

import uuid

import pytest
from celery.exceptions import Reject

from jobs.integrations.publisher import wire_payload
from jobs.integrations.wire import PAYLOAD_VERSION, payload_version_problem
from jobs.models import DeadLetter, Job
from jobs.processes.runtime import job_execute
from tests.factories import job_in_state
from tests.processes import assert_chain_valid, job_events, scripted_table

pytestmark = pytest.mark.django_db

RAN: list[uuid.UUID] = []


def records_its_run(ctx, params):
    RAN.append(ctx.job_id)
    return {"ran": True}


@pytest.fixture
def queued(settings):
    RAN.clear()
    scripted_table(settings, cam={"handler": f"{__name__}.records_its_run"})
    return job_in_state("queued", job_type="cam", params={"do": "records_its_run"})


def test_the_publisher_sends_the_current_version(queued):
    assert wire_payload(queued)["v"] == PAYLOAD_VERSION


@pytest.mark.parametrize(
    "version", [PAYLOAD_VERSION, PAYLOAD_VERSION - 1, None], ids=["current", "previous", "none"]
)
def test_a_worker_runs_its_own_version_the_previous_one_and_an_unversioned_message(queued, version):
    payload = wire_payload(queued)
    if version is None:
        del payload["v"]  # as every message published before payloads had a version
    else:
        payload["v"] = version
    assert job_execute(payload=payload, hostname="t")["outcome"] == "succeeded"
    assert RAN == [queued.id]


# The job contract's context, added to the payload without a new version: a worker of
# this release (or the one before) reads none of it.
ADDITIVE = ("project_id", "actor_type", "idempotency_key_sha256", "scheduled_for")


@pytest.mark.parametrize("with_context", [True, False], ids=["with", "without"])
def test_the_additive_fields_change_nothing_for_a_worker(queued, with_context):
    payload = wire_payload(queued)
    assert set(ADDITIVE) <= set(payload)
    if not with_context:  # as every message published before they were added
        for name in ADDITIVE:
            del payload[name]
    assert job_execute(payload=payload, hostname="t")["outcome"] == "succeeded"
    assert RAN == [queued.id]
    assert Job.objects.get(id=queued.id).status == "succeeded"


@pytest.mark.parametrize(
    "version",
    [PAYLOAD_VERSION + 1, PAYLOAD_VERSION - 2, str(PAYLOAD_VERSION), True, None, 2.0, [2]],
)
def test_an_unknown_version_fails_the_job_with_a_dead_letter_and_never_runs_it(queued, version):
    payload = {**wire_payload(queued), "v": version}
    with pytest.raises(Reject) as rejected:
        job_execute(payload=payload, hostname="t")
    assert rejected.value.requeue is False  # the broker's copy goes to the DLQ
    assert RAN == []
    stored = Job.objects.get(id=queued.id)
    assert (stored.status, stored.last_error_code, stored.attempts) == (
        "failed",
        "UNSUPPORTED_VERSION",
        0,  # never claimed: no attempt spent
    )
    assert "payload version" in stored.last_error_message
    letter = DeadLetter.objects.get(job_id=queued.id)
    assert (letter.reason, letter.error_code, letter.state) == (
        "nonretryable",
        "UNSUPPORTED_VERSION",
        "open",
    )
    assert job_events(queued.id)[-1] == "failed"
    assert_chain_valid(queued.id)


def test_an_unknown_version_for_a_job_running_elsewhere_leaves_that_run_alone():
    job = job_in_state("running", worker="w1")
    payload = {**wire_payload(job), "v": PAYLOAD_VERSION + 1}
    assert job_execute(payload=payload, hostname="t")["outcome"] == "dropped"
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.locked_by, stored.attempts) == ("running", "w1", 1)
    assert not DeadLetter.objects.filter(job_id=job.id).exists()


def test_an_unknown_version_naming_no_known_job_is_rejected_without_requeue():
    payload = {"v": PAYLOAD_VERSION + 1, "job_id": str(uuid.uuid4())}
    with pytest.raises(Reject) as rejected:
        job_execute(payload=payload, hostname="t")
    assert rejected.value.requeue is False


def test_the_refusal_names_the_version_and_what_the_worker_reads():
    problem = payload_version_problem({"v": 99})
    assert problem is not None and "99" in problem and str(PAYLOAD_VERSION) in problem
    assert payload_version_problem({"v": PAYLOAD_VERSION}) is None
