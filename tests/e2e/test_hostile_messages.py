"""Messages no API would send, published straight to a primary queue: each is dead-lettered
and recorded, the worker stays alive, and the next job still runs (issue: trust)."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from kombu import Connection, Exchange, Producer

from audit.services import Actor
from jobs.integrations.publisher import wire_payload
from jobs.integrations.topology import dlq_name
from jobs.integrations.wire import PAYLOAD_VERSION
from jobs.models import DeadLetter, Job
from jobs.services.queues import queue_pause, queue_resume
from tests.factories import UserFactory, make_job
from tests.polling import wait_for
from tests.processes import job_finished as finished
from tests.queues import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]


def dlq_bodies(queue: str) -> list[bytes]:
    bodies = [message.body for message in drain(dlq_name(queue))]
    return [body if isinstance(body, bytes) else body.encode() for body in bodies]


def publish_raw(queue: str, body: bytes, headers: dict | None, content_type: str) -> None:
    with Connection(settings.BROKER_URL) as conn:
        producer = Producer(conn.channel(), exchange=Exchange("jobs.direct", type="direct"))
        producer.publish(
            body,
            routing_key=queue,
            headers=headers or {},
            content_type=content_type,
            content_encoding="utf-8" if content_type == "application/json" else "binary",
            declare=[],
            serializer=None,
        )


def celery_headers(task: str = "jobs.ai") -> dict:
    return {"task": task, "id": "hostile-1", "lang": "py", "argsrepr": "", "kwargsrepr": ""}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth  # built as text: json.dumps itself would recurse


def _still_serving(worker) -> None:
    assert worker.alive(), worker.log_text()[-3000:]
    job = make_job(job_type="sim", params={"steps": 1, "step_seconds": 0})
    assert finished(job.id).status == "succeeded", worker.log_text()[-3000:]


def _null_job_rows(queue: str) -> list[DeadLetter]:
    return list(DeadLetter.objects.filter(job__isnull=True, queue=f"{queue}_dlq"))


@pytest.mark.parametrize("depth", [500, 3_000])
def test_a_deeply_nested_message_is_dead_lettered_and_the_worker_lives(shared_worker, depth):
    worker, _ = shared_worker
    job_id = "00000000-0000-0000-0000-000000000000"
    body = f'[[{{"job_id": "{job_id}", "deep": {nested(depth)}}}], {{}}, {{}}]'.encode()
    publish_raw("default", body, celery_headers(), "application/json")
    assert wait_for(lambda: dlq_bodies("default"), timeout=15) == [body]
    # The dispatcher's watcher recorded it: a row without a job, for an operator.
    (row,) = wait_for(lambda: _null_job_rows("default"), timeout=15)
    assert row.state == "open"
    _still_serving(worker)


@pytest.mark.parametrize(
    ("body", "headers", "content_type"),
    [
        (b"\xff\xfe not json at all", celery_headers(), "application/json"),
        (b'{"hello": "no celery headers"}', None, "application/json"),
        (b"\x80\x04pickle?", celery_headers(), "application/x-python-serialize"),
    ],
    ids=["not-json", "no-celery-headers", "pickle-refused"],
)
def test_an_undecodable_message_is_dead_lettered_not_acked(
    shared_worker, body, headers, content_type
):
    worker, _ = shared_worker
    publish_raw("default", body, headers, content_type)
    copies = wait_for(lambda: dlq_bodies("default"), timeout=15)
    assert copies == [body]
    (row,) = wait_for(lambda: _null_job_rows("default"), timeout=15)
    assert row.state == "open" and row.job_id is None
    _still_serving(worker)


def test_a_message_of_an_unknown_payload_version_is_dead_lettered_by_a_real_worker(
    shared_worker,
):
    """A dispatcher of a newer release (payload version + 1) ahead of this worker: the job
    fails with UNSUPPORTED_VERSION, its message lands in the DLQ, the worker goes on."""
    worker, _ = shared_worker
    # The sim queue paused: the shared dispatcher leaves the pending job alone, and only
    # the message below reaches the worker (which checks the version before the pause).
    operator = Actor.operator(UserFactory(is_staff=True))
    queue_pause(queue="sim", reason="test: one message only", actor=operator)
    try:
        job = make_job(job_type="sim", params={"steps": 1, "step_seconds": 0})
        payload = {**wire_payload(job), "v": PAYLOAD_VERSION + 1}
        body = json.dumps([[payload], {}, {"callbacks": None, "errbacks": None, "chain": None}])
        headers = {**celery_headers("jobs.sim"), "id": f"future-{job.id}", "job_id": str(job.id)}
        publish_raw("sim", body.encode(), headers, "application/json")
        stored = finished(job.id)
    finally:
        queue_resume(queue="sim", reason="test done", actor=operator)
    assert (stored.status, stored.last_error_code, stored.attempts) == (
        "failed",
        "UNSUPPORTED_VERSION",
        0,  # never claimed
    )
    assert Job.objects.get(id=job.id).result is None  # the handler never ran
    (copy,) = wait_for(lambda: dlq_bodies("sim"), timeout=15)
    assert str(job.id).encode() in copy
    _still_serving(worker)
