"""The planning types' results as artefacts (docs/architecture.md#planning-artefacts):
`model`, `cam` and `sim` each write one JSON artefact, the job's result, that the API and
the portal list and serve as they do `report`'s, and a retried attempt replaces it."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.urls import reverse

from jobs.domain.exceptions import JobLost
from jobs.handlers import cam, model, sim
from jobs.models import Artefact, Job
from jobs.processes.runtime import JobContext, job_execute
from jobs.services import job_claim, job_retry, validate_params
from tests.factories import client_for, fence_of, job_in_state

pytestmark = pytest.mark.django_db

PLANNING = {
    "model": {"points": [[0, 1], [1, 3], [2, 4], [3, 8]]},
    "cam": {"width": 100, "height": 50, "tool_diameter": 10, "stepover": 0.5},
    "sim": {"steps": 3, "step_seconds": 0, "seed": 7},
}
HANDLERS = {"model": model.run, "cam": cam.run, "sim": sim.run}


def stored_bytes(artefact: Artefact) -> bytes:
    with artefact.file.open("rb") as handle:
        return handle.read()


@pytest.mark.parametrize("job_type", sorted(PLANNING))
def test_a_planning_job_writes_its_result_as_one_json_artefact_listed_and_served(
    job_type, otp_admin_client, django_capture_on_commit_callbacks
):
    job = job_in_state("queued", job_type=job_type, params=PLANNING[job_type])
    summary = job_execute(payload={"job_id": str(job.id)}, hostname="test-host")
    assert summary["outcome"] == "succeeded"
    done = Job.objects.get(id=job.id)
    (artefact,) = Artefact.objects.filter(job_id=job.id)
    assert (artefact.kind, artefact.name) == ("result", f"{job_type}.json")
    assert artefact.content_type == "application/json"
    data = stored_bytes(artefact)
    assert artefact.sha256 == hashlib.sha256(data).hexdigest() and artefact.size == len(data)
    assert done.result and json.loads(data) == done.result

    # The API lists it in the job's body and serves its bytes, as it does report's.
    api = client_for(done.owner)
    (listed,) = api.get(f"/api/v1/jobs/{job.id}").json()["artefacts"]
    assert (listed["id"], listed["sha256"], listed["size"]) == (
        str(artefact.id),
        artefact.sha256,
        len(data),
    )
    response = api.get(listed["url"])
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert b"".join(response.streaming_content) == data

    # The portal's job page links it under Artefacts, and its link serves it.
    page = otp_admin_client.get(reverse("admin:jobs_job_change", args=[job.id]))
    link = reverse("admin:jobs_job_artefact", args=[job.id, artefact.id])
    assert f'href="{link}"' in page.content.decode()
    assert f"result/{job_type}.json" in page.content.decode()
    served = otp_admin_client.get(link)
    assert served.status_code == 200
    assert b"".join(served.streaming_content) == data


@pytest.mark.parametrize("job_type", sorted(PLANNING))
def test_a_retried_attempt_replaces_the_artefact_and_a_lost_one_writes_none(
    job_type, django_capture_on_commit_callbacks
):
    params = validate_params(job_type, PLANNING[job_type])
    run = HANDLERS[job_type]
    job = job_in_state("running", job_type=job_type, params=PLANNING[job_type])
    first = JobContext(job=job, fence=fence_of(job), log=None)
    with django_capture_on_commit_callbacks(execute=True):
        result = run(first, params)
    (before,) = Artefact.objects.filter(job_id=job.id)
    # The attempt failed after its artefact: retried, then claimed again.
    job_retry(job_id=job.id, fence=first.fence, delay=0, error_code="X", error_message="x")
    second_job = job_claim(job_id=job.id, locked_by="w2")
    assert second_job is not None and second_job.attempts == 2
    second = JobContext(job=second_job, fence=fence_of(second_job), log=None)
    with django_capture_on_commit_callbacks(execute=True):
        assert run(second, params) == result
    # The first attempt, still running somewhere, no longer holds the job: refused.
    with pytest.raises(JobLost):
        run(first, params)
    (after,) = Artefact.objects.filter(job_id=job.id)
    assert after.id == before.id and after.sha256 == before.sha256
    data = stored_bytes(after)
    assert hashlib.sha256(data).hexdigest() == after.sha256 and json.loads(data) == result
    # The replaced file was deleted once the switch committed: one file in storage.
    storage = after.file.storage
    _, files = storage.listdir(f"artefacts/{job.id}/result")
    assert files == [after.file.name.rsplit("/", 1)[1]]
