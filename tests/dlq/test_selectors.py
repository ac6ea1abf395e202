"""Reads for the DLQ pages: overview, grouping by error code, filters."""

from __future__ import annotations

import pytest

from dlq.selectors import dead_letters_by_error_code, dead_letters_list, dlq_overview
from jobs.models import DeadLetter
from tests.factories import job_in_state
from tests.queues import worker_dead_letter

pytestmark = pytest.mark.django_db


def test_overview_gives_broker_depth_and_open_rows_per_dlq(amqp):
    worker_dead_letter(amqp)
    job_in_state("failed", reason="worker_lost")
    overview = {o["queue"]: o for o in dlq_overview()}
    assert (overview["sim_dlq"]["depth"], overview["sim_dlq"]["open"]) == (1, 2)
    assert (overview["erp_dlq"]["depth"], overview["erp_dlq"]["open"]) == (0, 0)
    assert overview["sim_dlq"]["broker_error"] is None


def test_overview_renders_with_the_broker_unreachable(broker, settings):
    job_in_state("failed", reason="worker_lost")
    settings.BROKER_URL = "amqp://guest:guest@127.0.0.1:1/nowhere"
    overview = {o["queue"]: o for o in dlq_overview()}
    assert overview["sim_dlq"]["depth"] is None and overview["sim_dlq"]["open"] == 1
    assert overview["sim_dlq"]["broker_error"]


def test_open_dead_letters_grouped_by_error_code_and_filtered(broker):
    for _ in range(3):
        job_in_state("failed", reason="worker_lost")
    job = job_in_state("failed", reason="worker_lost")
    DeadLetter.objects.filter(job=job).update(error_code="OTHER")
    groups = dead_letters_by_error_code(queue="sim_dlq")
    assert [(g["error_code"], g["count"]) for g in groups] == [(None, 3), ("OTHER", 1)]
    assert dead_letters_list(error_code="OTHER").get().job_id == job.id
    assert dead_letters_list(reason="worker_lost", queue="sim_dlq").count() == 4
    assert dead_letters_list(state="replayed").count() == 0
    assert dead_letters_list(state=None).count() == 4
