from __future__ import annotations

import json

import pytest
from django.db import connection

from audit.models import AuditLog
from audit.services import Actor
from jobs.domain.exceptions import (
    IdempotencyKeyInvalidError,
    IdempotencyMismatchError,
    JobLost,
    JobParamsInvalidError,
    JobTypeUnknownError,
    PayloadTooLargeError,
    TransitionRefusedError,
)
from jobs.domain.states import ALLOWED, Status
from jobs.models import EventOutbox, Job
from jobs.services import (
    Fence,
    job_cancel,
    job_claim,
    job_create,
    job_fail_with_dead_letter,
    job_succeed,
    jobs_claim_delivered,
    transitions,
)
from jobs.services.transitions import change
from tests.factories import OrganisationFactory, UserFactory, job_in_state, make_job
from tests.processes import assert_chain_valid, job_events
from tests.threads import run_in_threads

pytestmark = pytest.mark.django_db
SYSTEM = Actor.system()


def test_create_makes_pending_job_with_created_audit_and_event():
    job = make_job()
    assert job.status == Status.PENDING
    assert job.max_attempts == 6  # sim: 5 retries + 1
    assert job.queue == "sim"
    assert job_events(job.id) == ["created"]
    event = EventOutbox.objects.get(job_id=job.id)
    assert event.seq == 1
    assert event.payload["status"] == "pending"
    assert event.payload["previous_status"] is None


def test_same_key_same_params_returns_existing_job():
    owner = UserFactory()
    first, created = job_create(
        owner=owner, job_type="sim", params={"steps": 3}, idempotency_key="k1"
    )
    again, created_again = job_create(
        owner=owner, job_type="sim", params={"steps": 3}, idempotency_key="k1"
    )
    assert (created, created_again) == (True, False)
    assert again.id == first.id
    assert Job.objects.count() == 1
    assert job_events(first.id) == ["created"]


def test_a_repeat_reads_the_job_and_its_artefacts_in_one_statement(django_assert_num_queries):
    from jobs.services import artefact_save

    owner = UserFactory()
    job, _ = job_create(owner=owner, job_type="sim", params={"steps": 3}, idempotency_key="k1")
    job_claim(job_id=job.id, locked_by="w")
    artefact_save(job_id=job.id, kind="report", name="a.csv", data=b"x", fence=Fence("w", 1))
    # The insert that finds the key taken, then one read of the job with its artefacts.
    with django_assert_num_queries(2):
        again, created = job_create(
            owner=owner, job_type="sim", params={"steps": 3}, idempotency_key="k1"
        )
    assert (created, again.id, again.status) == (False, job.id, Status.RUNNING)
    assert [(a.kind, a.name, a.size) for a in again.artefact_list] == [("report", "a.csv", 1)]


def test_a_key_released_between_the_insert_and_the_read_makes_a_new_job():
    owner = UserFactory()
    old, _ = job_create(owner=owner, job_type="sim", params={}, idempotency_key="k")
    released = []

    def release_after_the_refused_insert(execute, sql, params, many, context):
        rows = execute(sql, params, many, context)
        if "INSERT INTO jobs (" in sql and not rows and not released:
            # What the expired-key sweep does, landing between the two statements.
            released.append(Job.objects.filter(id=old.id).update(idempotency_key=None))
        return rows

    with connection.execute_wrapper(release_after_the_refused_insert):
        new, created = job_create(owner=owner, job_type="sim", params={}, idempotency_key="k")
    assert released == [1]
    assert created is True and new.id != old.id
    assert Job.objects.get(idempotency_key="k").id == new.id


def test_same_key_other_params_is_a_mismatch_and_writes_nothing():
    owner = UserFactory()
    job_create(owner=owner, job_type="sim", params={"steps": 3}, idempotency_key="k1")
    with pytest.raises(IdempotencyMismatchError):
        job_create(owner=owner, job_type="sim", params={"steps": 4}, idempotency_key="k1")
    with pytest.raises(IdempotencyMismatchError):
        job_create(owner=owner, job_type="report", params={}, idempotency_key="k1")
    assert Job.objects.count() == 1


def test_keys_are_scoped_to_the_owner():
    a, _ = job_create(owner=UserFactory(), job_type="sim", params={}, idempotency_key="shared")
    b, _ = job_create(owner=UserFactory(), job_type="sim", params={}, idempotency_key="shared")
    assert a.id != b.id


def test_no_key_always_creates():
    owner = UserFactory()
    ids = {job_create(owner=owner, job_type="sim", params={})[0].id for _ in range(3)}
    assert len(ids) == 3


def test_expired_key_is_released_and_reuse_creates_a_new_job():
    owner = UserFactory()
    old, _ = job_create(owner=owner, job_type="sim", params={}, idempotency_key="k")
    Job.objects.filter(id=old.id).update(idempotency_expires_at="2000-01-01T00:00:00Z")
    new, created = job_create(owner=owner, job_type="sim", params={"steps": 9}, idempotency_key="k")
    assert created and new.id != old.id
    old.refresh_from_db()
    assert old.idempotency_key is None


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there", "new\nline"])
def test_bad_keys_are_refused(key):
    with pytest.raises(IdempotencyKeyInvalidError):
        job_create(owner=UserFactory(), job_type="sim", params={}, idempotency_key=key)
    assert Job.objects.count() == 0


def test_unknown_type_and_bad_params_are_refused_with_details():
    owner = UserFactory()
    with pytest.raises(JobTypeUnknownError):
        job_create(owner=owner, job_type="nope", params={})
    with pytest.raises(JobParamsInvalidError) as exc:
        job_create(owner=owner, job_type="sim", params={"steps": -1, "bogus": 1})
    assert set(exc.value.details) == {"steps", "bogus"}
    with pytest.raises(JobParamsInvalidError):
        job_create(owner=owner, job_type="sim", params=[1, 2])
    assert Job.objects.count() == 0


def test_oversized_params_are_refused(settings):
    settings.JOBOPS_MAX_PAYLOAD_BYTES = 100
    with pytest.raises(PayloadTooLargeError):
        job_create(owner=UserFactory(), job_type="ai", params={"text": "x" * 200})


def test_transition_applies_and_audits_once():
    job = make_job()
    rows = change("jobs_mark_queued", job_ids=[job.id], actor=SYSTEM, source=Status.PENDING)
    [moved] = transitions.moved("jobs_mark_queued", rows)
    assert moved.status == Status.QUEUED
    assert moved.version == job.version + 1
    assert job_events(job.id) == ["created", "queued"]
    last = EventOutbox.objects.filter(job_id=job.id).order_by("-seq").first()
    assert (last.payload["previous_status"], last.payload["status"], last.seq) == (
        "pending",
        "queued",
        2,
    )


def test_refused_transition_changes_nothing():
    job = make_job()
    rows = change(
        "jobs_succeed",
        job_ids=[job.id],
        actor=SYSTEM,
        attempts=[0],
        locked_by="w1",
        results=[None],
        progress=[None],
    )
    assert rows == []
    assert job_events(job.id) == ["created"]
    assert Job.objects.get(id=job.id).version == job.version


def test_a_failure_from_a_state_not_in_the_table_is_refused_before_any_sql():
    job = make_job()
    with pytest.raises(TransitionRefusedError) as exc:
        job_fail_with_dead_letter(
            job_id=job.id, reason="rejected", actor=SYSTEM, sources=[Status.SUCCEEDED]
        )
    assert exc.value.target == "failed" and exc.value.current == "succeeded"
    assert Job.objects.get(id=job.id).status == Status.PENDING


def test_every_table_entry_names_known_states():
    for target, sources in ALLOWED.items():
        assert target in Status.values and sources <= set(Status.values)


def test_a_delivered_claim_of_several_jobs_claims_each_with_its_own_entry(
    django_assert_num_queries,
):
    """A threads-pool worker's batch (jobs.execution.claim): the jobs of one
    organisation's messages in one statement, each audited on its own chain and returned
    by its id; a job not claimable, or of another organisation, is simply not returned,
    and an id named twice is claimed once."""
    owner = UserFactory()
    queued = [job_in_state("queued", owner=owner) for _ in range(3)]
    retrying = job_in_state("retrying", owner=owner)  # due at once, its attempt 1 spent
    running = job_in_state("running", owner=owner, worker="w1")
    elsewhere = job_in_state("queued", owner=UserFactory(org=OrganisationFactory()))
    ids = [*(j.id for j in queued), retrying.id, running.id, elsewhere.id, queued[0].id]
    with django_assert_num_queries(1):
        claimed = jobs_claim_delivered(job_ids=ids, locked_by="w2", org_id=queued[0].org_id)
    expected = {**{j.id: ("queued", 1) for j in queued}, retrying.id: ("retrying", 2)}
    assert set(claimed) == set(expected)
    for job_id, (source, attempt) in expected.items():
        job = claimed[job_id]
        assert (job.id, job.status, job.locked_by, job.attempts) == (
            job_id,
            Status.RUNNING,
            "w2",
            attempt,
        )
        stored = Job.objects.get(id=job_id)
        assert (stored.status, stored.locked_by, stored.attempts) == ("running", "w2", attempt)
        entry = AuditLog.objects.filter(job_id=job_id).order_by("seq").last()
        assert entry.event_type == "started"
        data = json.loads(entry.payload)["data"]
        assert (data["from"], data["to"], data["attempt"]) == (source, "running", attempt)
        assert job_events(job_id).count("started") == attempt  # queued[0]: named twice
        assert_chain_valid(job_id)
    assert Job.objects.get(id=running.id).locked_by == "w1"  # untouched
    assert job_events(running.id).count("started") == 1
    assert Job.objects.get(id=elsewhere.id).status == Status.QUEUED
    assert job_events(elsewhere.id) == ["created", "queued"]


def test_fenced_write_after_reclaim_raises_job_lost():
    job = job_in_state("running", worker="w1")
    assert job.attempts == 1
    # someone else reclaims the job behind the worker's back
    Job.objects.filter(id=job.id).update(locked_by="w2", attempts=2)
    with pytest.raises(JobLost):
        job_succeed(job_id=job.id, fence=Fence("w1", 1), result=None)
    assert Job.objects.get(id=job.id).status == Status.RUNNING
    assert job_events(job.id) == ["created", "queued", "started"]


def test_cancel_before_start_cancels_at_once_and_is_idempotent():
    job = make_job()
    cancelled = job_cancel(job_id=job.id, actor=SYSTEM)
    again = job_cancel(job_id=job.id, actor=SYSTEM)
    assert cancelled.status == again.status == Status.CANCELLED
    assert job_events(job.id) == ["created", "cancel_requested", "cancelled"]


def test_cancel_running_job_only_raises_the_flag():
    job = job_in_state("running")
    result = job_cancel(job_id=job.id, actor=SYSTEM)
    assert result.status == Status.RUNNING and result.cancel_requested
    assert job_events(job.id) == ["created", "queued", "started", "cancel_requested"]


@pytest.mark.django_db(transaction=True)
def test_fifty_threads_with_one_key_make_one_job():
    owner = UserFactory()
    results = []

    def submit(_: int) -> None:
        results.append(
            job_create(owner=owner, job_type="sim", params={"steps": 5}, idempotency_key="same")
        )

    errors = run_in_threads(submit, 50)
    assert errors == []
    assert len({job.id for job, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Job.objects.count() == 1
    assert AuditLog.objects.filter(event_type="created").count() == 1
    connection.close()


def test_artefact_save_is_an_upsert_that_replaces_the_file():
    from jobs.services import artefact_save

    job = make_job()
    first = artefact_save(job_id=job.id, kind="report", name="jobs.csv", data=b"a,b\n")
    second = artefact_save(job_id=job.id, kind="report", name="jobs.csv", data="a,b\n1,2\n")
    assert first.id == second.id
    assert job.artefacts.count() == 1
    second.refresh_from_db()
    assert second.size == 8
    assert second.file.read() == b"a,b\n1,2\n"
    import hashlib

    assert second.sha256 == hashlib.sha256(b"a,b\n1,2\n").hexdigest()
    assert Job.objects.get(id=job.id).version > job.version


def test_job_ids_are_time_ordered_so_new_index_entries_land_together():
    owner = UserFactory()
    jobs = [make_job(owner) for _ in range(5)]
    assert {job.id.version for job in jobs} == {7}
    assert [job.id for job in jobs] == sorted(job.id for job in jobs)
    chains = list(
        AuditLog.objects.filter(job_id__in=[j.id for j in jobs])
        .order_by("chain")
        .values_list("job_id", flat=True)
    )
    assert chains == [job.id for job in jobs]  # the chain index in creation order too
