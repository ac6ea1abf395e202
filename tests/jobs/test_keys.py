"""Idempotency keys after creation (docs/api.md#idempotency): a repeat within the TTL
marks the key seen; the dispatcher's release_keys step releases keys past their TTL in
batches, each release a new version of the job; a repeat after the TTL makes a new job."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from audit.models import AuditLog
from jobs.models import Job
from jobs.processes.dispatcher import dispatch_once, role_steps
from jobs.services import job_release_idempotency_keys
from tests.factories import UserFactory, backdate, make_job

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs"
SIM = {"type": "sim", "params": {"steps": 3, "step_seconds": 0}}
STEP = ("release_keys", "jobs.services.keys.release_keys_once")


def expired(job: Job) -> Job:
    """Its key's TTL ended a minute ago."""
    backdate(job, idempotency_expires_at=60)
    return job


def keyed(count: int) -> list[Job]:
    owner = UserFactory()
    return [make_job(owner=owner, key=f"key-{n}") for n in range(count)]


def test_the_step_releases_the_keys_past_their_ttl_in_batches_and_no_live_one():
    due = [expired(job) for job in keyed(5)]
    live = make_job(key="live")
    # Two batches of two, the most one run may take: one due key is left.
    assert job_release_idempotency_keys(batch=2, batches=2) == 4
    assert (
        Job.objects.filter(id__in=[j.id for j in due], idempotency_key__isnull=False).count() == 1
    )
    assert job_release_idempotency_keys(batch=2, batches=2) == 1  # a short batch ends the run
    for job in due:
        stored = Job.objects.get(id=job.id)
        assert (stored.idempotency_key, stored.idempotency_expires_at) == (None, None)
        # Moved (to the transaction's now(), the clock the transition functions use too).
        assert stored.version == job.version + 1 and stored.updated_at != job.updated_at
    stored = Job.objects.get(id=live.id)
    assert (stored.idempotency_key, stored.version) == ("live", live.version)
    assert job_release_idempotency_keys() == 0


def test_a_release_is_not_an_audit_entry():
    job = expired(make_job(key="k"))
    job_release_idempotency_keys()
    assert list(AuditLog.objects.filter(job_id=job.id).values_list("event_type", flat=True)) == [
        "created"
    ]


@pytest.mark.django_db(transaction=True)
def test_a_batch_skips_a_row_another_transaction_holds_without_waiting():
    held, free = [expired(job) for job in keyed(2)]
    with psycopg.connect(**connection.get_connection_params()) as other:
        other.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", [held.id])
        started = time.monotonic()
        assert job_release_idempotency_keys() == 1
        assert time.monotonic() - started < 2
        other.rollback()
    assert Job.objects.get(id=free.id).idempotency_key is None
    assert Job.objects.get(id=held.id).idempotency_key == "key-0"
    assert job_release_idempotency_keys() == 1  # the next run takes it


def test_the_dispatcher_runs_the_step_in_the_maintain_role_not_the_publisher():
    assert STEP in role_steps("maintain") and STEP in role_steps("all")
    assert STEP not in role_steps("publish")
    jobs = [expired(job) for job in keyed(3)]
    report = dispatch_once(steps=[s for s in role_steps("maintain") if s == STEP])
    assert report == {"release_keys": 3}
    assert not Job.objects.filter(id__in=[j.id for j in jobs], idempotency_key__isnull=False)


def test_a_released_key_answers_a_new_etag_not_a_304(api):
    created = api.post(JOBS, {**SIM, "idempotency_key": "etag-key"}, format="json")
    job_id, etag = created.json()["id"], created["ETag"]
    assert api.get(f"{JOBS}/{job_id}", HTTP_IF_NONE_MATCH=etag).status_code == 304
    expired(Job.objects.get(id=job_id))
    assert dispatch_once(steps=[STEP]) == {"release_keys": 1}
    after = api.get(f"{JOBS}/{job_id}", HTTP_IF_NONE_MATCH=etag)
    assert after.status_code == 200
    assert after["ETag"] != etag and after.json()["idempotency_key"] is None


def test_a_repeat_within_the_ttl_marks_the_key_seen_and_keeps_the_etag(api):
    first = api.post(JOBS, {**SIM, "idempotency_key": "seen"}, format="json")
    job = Job.objects.get(id=first.json()["id"])
    assert job.idempotency_last_seen_at is None  # first seen: its creation
    again = api.post(JOBS, {**SIM, "idempotency_key": "seen"}, format="json")
    assert again.status_code == 200 and again["ETag"] == first["ETag"]
    seen = Job.objects.get(id=job.id)
    assert seen.idempotency_last_seen_at > seen.created_at
    assert (seen.version, seen.updated_at) == (job.version, job.updated_at)
    # To the second: a repeat within a second of the last one writes nothing...
    assert api.post(JOBS, {**SIM, "idempotency_key": "seen"}, format="json").status_code == 200
    assert Job.objects.get(id=job.id).idempotency_last_seen_at == seen.idempotency_last_seen_at
    # ...one after it moves last seen again.
    backdate(job, idempotency_last_seen_at=2)
    assert api.post(JOBS, {**SIM, "idempotency_key": "seen"}, format="json").status_code == 200
    last = Job.objects.get(id=job.id)
    assert last.idempotency_last_seen_at > seen.idempotency_last_seen_at
    assert last.version == job.version


def test_a_mismatch_is_not_a_repeat_and_does_not_mark_the_key_seen(api):
    first = api.post(JOBS, {**SIM, "idempotency_key": "other"}, format="json")
    mismatch = {"type": "sim", "params": {"steps": 4}, "idempotency_key": "other"}
    assert api.post(JOBS, mismatch, format="json").status_code == 422
    assert Job.objects.get(id=first.json()["id"]).idempotency_last_seen_at is None


@pytest.mark.parametrize("released_by", ["the step", "the repeat"])
def test_a_repeat_after_the_ttl_creates_a_new_job(api, released_by):
    first = api.post(JOBS, {**SIM, "idempotency_key": "late"}, format="json")
    old = expired(Job.objects.get(id=first.json()["id"]))
    if released_by == "the step":
        dispatch_once(steps=[STEP])
    again = api.post(JOBS, {**SIM, "idempotency_key": "late"}, format="json")
    assert again.status_code == 201 and again.json()["id"] != str(old.id)
    assert again.json()["idempotency_key"] == "late"
    stored = Job.objects.get(id=old.id)
    assert stored.idempotency_key is None and stored.version == old.version + 1
