"""dlq_depth and queue_depth come from the broker, read by the dispatcher's depth step."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from jobs.integrations.backpressure import queue_depths_refresh
from jobs.models import Job
from tests.factories import make_job
from tests.queues import dead_letter_by_reject, publish_job_message

pytestmark = pytest.mark.django_db


def _gauge(name: str, queue: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"queue": queue})


def test_depth_gauges_follow_the_broker(amqp):
    job = make_job(job_type="sim")
    dead_letter_by_reject(amqp, Job.objects.get(id=job.id))  # one copy in sim_dlq
    publish_job_message(Job.objects.get(id=job.id))  # one waiting in sim
    depths = queue_depths_refresh(min_interval=0)
    assert depths["sim"] == 1 and "sim_dlq" not in depths  # backpressure sees primaries
    assert _gauge("dlq_depth", "sim_dlq") == 1
    assert _gauge("queue_depth", "sim") == 1
    amqp.queue_purge("sim_dlq")
    queue_depths_refresh(min_interval=0)
    assert _gauge("dlq_depth", "sim_dlq") == 0
