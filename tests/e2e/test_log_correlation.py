"""One request id, followed from the API's log line to the worker's and the ERP bridge's.

Each process renders through core/logging.py: the API (this process) and the bridge
(run here too) into a JSON buffer, the worker (a real Celery subprocess) to its log.
"""

from __future__ import annotations

import pytest
import structlog

from core.logging import MASK, configure_masking
from jobs.models import Job
from jobs.processes.erp_bridge import erp_bridge_run
from jobs.processes.events import outbox_relay_once
from jobs.services import publish_due_once
from tests.erp_receiver import Receiver
from tests.factories import UserFactory, client_for
from tests.polling import wait_for
from tests.processes import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)
REQUEST_ID = "follow-me-7f3a"


def test_one_request_id_runs_through_api_worker_and_erp_bridge(erp_queues, json_log_lines):
    client = client_for(UserFactory())
    with celery_worker(queues=("sim",), name="follow") as worker:
        response = client.post(
            "/api/v1/jobs",
            {"type": "sim", "params": {"steps": 1, "step_seconds": 0}},
            format="json",
            HTTP_X_REQUEST_ID=REQUEST_ID,
        )
        assert response.status_code == 201
        job_id = response.json()["id"]
        publish_due_once()  # the dispatcher's step: the request never publishes
        wait_for(lambda: Job.objects.get(id=job_id).status == "succeeded", timeout=30)

        def lines_of_the_job() -> list[str] | None:
            # The pool child's lines reach the file on their own schedule, not with the
            # commit that the status poll sees.
            lines = [line for line in worker.log_text().splitlines() if job_id in line]
            wanted = ("job_started", "job_succeeded")
            return lines if all(any(e in line for line in lines) for e in wanted) else None

        try:
            worker_lines = wait_for(lines_of_the_job, timeout=10, what="the worker's lines")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{worker.log_text()[-3000:]}") from None
    api_line = next(line for line in json_log_lines() if line["event"] == "job_created")
    assert api_line["request_id"] == REQUEST_ID and api_line["job_id"] == job_id

    for event in ("job_started", "job_succeeded"):
        line = next(line for line in worker_lines if event in line)
        assert f"request_id={REQUEST_ID}" in line and "attempt=1" in line and "queue=sim" in line

    outbox_relay_once()
    with Receiver() as erp:
        erp_bridge_run(url=erp.url, idle_timeout=1.0)
    delivered = [line for line in json_log_lines() if line["event"] == "erp_event_delivered"]
    assert delivered and all(line["request_id"] == REQUEST_ID for line in delivered)
    assert {line["job_id"] for line in delivered} == {job_id}


def test_configured_personal_data_fields_are_masked(json_log_lines):
    configure_masking(["iban"])
    try:
        structlog.get_logger("tests").info("payout", customer_iban="DE89370400440532013000")
    finally:
        configure_masking([])
    (line,) = [line for line in json_log_lines() if line["event"] == "payout"]
    assert line["customer_iban"] == MASK
