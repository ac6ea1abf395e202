"""A bounded job message (docs/operations/deploying.md#message-size): the publisher
refuses one over JOBOPS_MAX_MESSAGE_BYTES before the broker, and the job fails with a
dead letter instead of being lost or waiting pending for ever."""

from __future__ import annotations

import json

import pytest
from django.conf import settings as django_settings
from django.db import connection

from audit.models import AuditLog
from jobs.integrations.publisher import (
    MessageTooLarge,
    MessageTooLargeError,
    message_body_size,
    messages_publish,
    wire_payload,
)
from jobs.models import DeadLetter, Job
from jobs.services import job_publish, publish_due_once
from tests.factories import backdate, make_job
from tests.queues import depth, get_one

pytestmark = pytest.mark.django_db


def _padded(job: Job, pad: int) -> Job:
    """The job's params as a larger message would carry them (the API's own 256 KiB
    bound is below the broker's, so a job this large only comes from elsewhere)."""
    params = {**job.params, "pad": "x" * pad}
    with connection.cursor() as cursor:
        cursor.execute("UPDATE jobs SET params = %s WHERE id = %s", [json.dumps(params), job.id])
    backdate(job, created_at=120)  # past the dispatcher's grace period
    return Job.objects.get(id=job.id)


def test_the_default_limit_is_ten_mib():
    assert django_settings.JOBOPS_MAX_MESSAGE_BYTES == 10 * 1024 * 1024


def test_the_measured_size_is_the_body_celery_sends(amqp):
    job = make_job()
    messages_publish(jobs=[job])
    message = get_one(amqp, "sim")
    assert len(message.body) == message_body_size(wire_payload(job))


def test_a_message_over_the_limit_never_reaches_the_broker_and_is_dead_lettered(amqp, settings):
    small, large = _padded(make_job(), 0), _padded(make_job(), 5000)
    settings.JOBOPS_MAX_MESSAGE_BYTES = message_body_size(wire_payload(small)) + 100
    assert publish_due_once() == 1
    assert depth(amqp, "sim") == 1  # the small one only
    assert get_one(amqp, "sim").headers["job_id"] == str(small.id)
    row = Job.objects.get(id=large.id)
    assert (row.status, row.last_error_code) == ("failed", "MESSAGE_TOO_LARGE")
    assert "exceeds JOBOPS_MAX_MESSAGE_BYTES" in row.last_error_message
    dead = DeadLetter.objects.get(job_id=large.id)
    assert (dead.state, dead.reason, dead.error_code) == (
        "open",
        "nonretryable",
        "MESSAGE_TOO_LARGE",
    )
    assert AuditLog.objects.filter(job_id=large.id, event_type="failed").exists()
    assert Job.objects.get(id=small.id).status == "queued"


def test_the_publisher_refuses_it_with_a_reason_no_retry_cures(amqp, settings):
    job = _padded(make_job(), 5000)
    settings.JOBOPS_MAX_MESSAGE_BYTES = 1000
    refused = messages_publish(jobs=[job])
    why = refused[str(job.id)]
    assert isinstance(why, MessageTooLarge)
    assert f"message of {message_body_size(wire_payload(job))} bytes" in why
    assert depth(amqp, "sim") == 0


def test_a_single_publish_raises_and_leaves_the_job_pending(amqp, settings):
    job = _padded(make_job(), 5000)
    settings.JOBOPS_MAX_MESSAGE_BYTES = 1000
    with pytest.raises(MessageTooLargeError):
        job_publish(job_id=job.id)
    assert Job.objects.get(id=job.id).status == "pending"
    assert depth(amqp, "sim") == 0


def test_the_key_travels_as_a_fixed_size_digest_whatever_its_length():
    short, long = make_job(key="k"), make_job(key="k" * 255)
    sizes = {message_body_size(wire_payload(job)) for job in (short, long)}
    assert len(sizes) == 1  # a 255-character key costs the message what a 1-character one does
    assert "k" * 255 not in json.dumps(wire_payload(long))
