"""A published job message says what happened before in its headers."""

from __future__ import annotations

import pytest

from jobs.integrations.topology import dlq_name
from tests.factories import job_in_state, make_job
from tests.queues import dead_letter_by_reject, get_one

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_first_attempt_carries_its_ids_and_attempt(amqp):
    from jobs.integrations.publisher import message_publish

    job = make_job(job_type="sim")
    amqp.queue_purge(job.queue)  # the creation's own publish
    message_publish(job=job)
    message = get_one(amqp, job.queue)
    headers = message.headers
    amqp.basic_ack(message.delivery_tag)
    assert headers["job_id"] == str(job.id)
    assert headers["attempt"] == 1
    assert "last_error_code" not in headers and "last_error_class" not in headers


def test_the_arguments_celery_shows_name_the_job_but_never_its_params(amqp):
    from jobs.integrations.publisher import message_publish

    job = make_job(job_type="ai", params={"text": "patient 4711 s3cret diagnosis"})
    amqp.queue_purge(job.queue)  # the creation's own publish
    message_publish(job=job)
    message = get_one(amqp, job.queue)
    headers, body = message.headers, message.body
    amqp.basic_ack(message.delivery_tag)
    assert headers["argsrepr"] == f"[{{'job_id': '{job.id}', 'type': 'ai', 'attempt': 1}}]"
    assert headers["kwargsrepr"] == "{}"
    assert not any("s3cret" in str(v) for v in headers.values())
    assert "s3cret" in str(body)  # the worker still gets its params


def test_a_retry_names_the_last_error_code_and_class_but_not_its_text(amqp):
    job = job_in_state(
        "retrying",
        error_code="TRANSIENT_EXTERNAL",
        error_message="ConnectionError: https://erp.example/api?token=s3cret refused",
    )
    amqp.queue_purge(job.queue)  # the creation's own publish, attempt 1
    # Read where an operator reads it: the copy in the DLQ, as a peek would show it.
    dead_letter_by_reject(amqp, job)
    copy = get_one(amqp, dlq_name(job.queue))
    headers = copy.headers
    amqp.basic_ack(copy.delivery_tag)
    assert headers["attempt"] == 2
    assert headers["last_error_code"] == "TRANSIENT_EXTERNAL"
    assert headers["last_error_class"] == "ConnectionError"
    assert not any("s3cret" in str(v) for v in headers.values())


def test_an_error_message_without_a_class_prefix_sends_only_the_code(amqp):
    from jobs.integrations.publisher import message_headers

    job = make_job(job_type="sim")
    job.last_error_code = "WORKER_LOST"
    job.last_error_message = "the worker was lost on attempt 3 of 3"
    headers = message_headers(job)
    assert headers["last_error_code"] == "WORKER_LOST"
    assert "last_error_class" not in headers
