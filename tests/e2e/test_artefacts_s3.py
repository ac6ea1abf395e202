"""Artefacts in object storage end to end (docs/operations/deploying.md#storage): a real
worker runs `report` with ARTEFACT_STORAGE=s3 against the S3-compatible server of
tests.s3, with a media root of its own that the API never sees; a storage that is down
makes the job retry until it is back, and nothing is lost."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.factories import UserFactory, client_for, make_job
from tests.polling import wait_for
from tests.processes import celery_worker, dispatcher_process, free_port, job_finished, together
from tests.s3 import s3_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]


def _download(job_id, owner):
    """The report through the API (this process: the S3 storage of the `s3` fixture)."""
    api = client_for(owner)
    (listed,) = api.get(f"/api/v1/jobs/{job_id}").json()["artefacts"]
    response = api.get(listed["url"])
    assert response.status_code == 200
    return listed, b"".join(response.streaming_content)


def test_a_worker_writes_a_report_to_the_bucket_and_the_api_serves_it(s3, tmp_path):
    worker_media = tmp_path / "worker-media"
    owner = UserFactory()
    env = s3.env(JOBOPS_MEDIA_ROOT=str(worker_media))
    # The worker's exporter adds up its pool child's values (the put is the child's).
    metered = {
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"),
        "JOBOPS_METRICS_PORT": str(free_port()),
    }
    with together(
        celery_worker(queues=["report"], env={**env, **metered}, name="s3-report"),
        dispatcher_process(env=env),
    ) as (worker, _):
        report = make_job(owner, job_type="report", params={"limit": 10})
        done = job_finished(report.id)
        assert worker.metric("s3_operation_duration_seconds_count", operation="put") == 1
        # Counted once the success committed, which the row may show a moment earlier.
        succeeded = {"type": "report", "job_type": "report", "queue": "report"}
        wait_for(
            lambda: worker.metric("jobs_succeeded_total", **succeeded) == 1,
            timeout=10,
            what="the worker to count the success",
        )
    assert done.status == "succeeded", done.last_error_message
    listed, body = _download(report.id, owner)
    assert listed["s3_key"].startswith(f"artefacts/{report.id}/report/")
    assert s3.object_bytes(listed["s3_key"]) == body
    assert hashlib.sha256(body).hexdigest() == listed["sha256"] == done.result["sha256"]
    assert listed["size"] == len(body) and str(report.id) in body.decode()
    assert not worker_media.exists()  # nothing went to the worker's disk


def test_a_storage_that_is_down_retries_the_job_until_it_is_back(s3, settings):
    # Enough attempts to outlast the S3 server's start (backoff 0.2 s doubling).
    types = {"report": {"max_retries": 12, "backoff_cap": 2}}
    settings.JOB_TYPES = {**settings.JOB_TYPES, "report": {**settings.JOB_TYPES["report"]}}
    settings.JOB_TYPES["report"].update(types["report"])
    port = free_port()  # nothing listens there yet
    env = s3.env(
        ARTEFACT_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        ARTEFACT_S3_TIMEOUT_SECONDS="1",
        JOBOPS_JOB_TYPES=json.dumps(types),
    )
    owner = UserFactory()
    with together(
        celery_worker(queues=["report"], env=env, name="s3-down"), dispatcher_process(env=env)
    ):
        report = make_job(owner, job_type="report", params={"limit": 5})

        def failed_on_storage():
            report.refresh_from_db()
            return report.last_error_code == "STORAGE_UNAVAILABLE"

        wait_for(failed_on_storage, timeout=60, what="an attempt failing on the storage")
        assert report.status in ("retrying", "queued", "running")
        assert not report.artefacts.exists()
        with s3_server(port=port) as back:
            done = job_finished(report.id, timeout=90)
            assert done.status == "succeeded", done.last_error_message
            assert done.attempts >= 2
            artefact = done.artefacts.get()
            stored = back.object_bytes(artefact.file.name)
    assert hashlib.sha256(stored).hexdigest() == artefact.sha256
    assert str(report.id) in stored.decode()
