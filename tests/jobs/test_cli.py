"""manage.py submit_job and job_status [--follow]."""

from __future__ import annotations

import io
import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from audit.services import Actor
from jobs.models import Job
from jobs.services import transition
from jobs.states import Status
from tests.factories import UserFactory, make_job


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_submit_job_prints_the_id_and_status():
    owner = UserFactory(username="alice")
    out, _ = run("submit_job", "--type", "sim", "--params", '{"steps": 2}', "--owner", "alice")
    job = Job.objects.get()
    assert out.strip().startswith(f"{job.id} pending (created")
    # Stored as validated: what the handler will receive, defaults filled in.
    assert job.owner == owner and job.params == {"steps": 2, "step_seconds": 0.5, "seed": 0}


@pytest.mark.django_db
def test_submit_job_with_a_key_returns_the_same_job_and_defaults_to_the_admin():
    admin = UserFactory(username="root", is_superuser=True, is_staff=True)
    first, _ = run("submit_job", "--type", "report", "--key", "nightly")
    again, _ = run("submit_job", "--type", "report", "--key", "nightly")
    assert first.split()[0] == again.split()[0]
    assert "(exists" in again
    assert Job.objects.get().owner == admin


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--type", "sim", "--params", "{nope"], "not valid JSON"),
        (["--type", "nope"], "ERR-JOB-400"),
        (["--type", "sim", "--params", '{"steps": 0}'], "ERR-JOB-422"),
        (["--type", "sim", "--key", "caf\u00e9"], "ERR-JOB-400"),
        (["--type", "sim", "--owner", "ghost"], "No user 'ghost'"),
    ],
)
def test_submit_job_errors_are_clear_with_a_nonzero_exit(args, message):
    UserFactory(username="alice")
    owner = [] if "--owner" in args else ["--owner", "alice"]
    with pytest.raises(CommandError) as raised:
        run("submit_job", *args, *owner)
    assert message in str(raised.value)
    assert raised.value.returncode == 2
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_job_status_describes_a_job():
    job = make_job()
    Job.objects.filter(id=job.id).update(progress_percent=30, progress_step="meshing")
    out, _ = run("job_status", str(job.id))
    assert f"id:        {job.id}" in out
    assert "status:    pending" in out and "progress:  30% meshing" in out


@pytest.mark.django_db
def test_job_status_json_prints_the_api_body():
    import json

    job = make_job()
    out, _ = run("job_status", str(job.id), "--json")
    assert json.loads(out)["id"] == str(job.id)


@pytest.mark.django_db
@pytest.mark.parametrize("job_id", ["not-a-uuid", "8d8b5a4e-9a59-4b1e-9a77-1f0a0c1d2e3f"])
def test_job_status_of_an_unknown_job_exits_2(job_id):
    with pytest.raises(CommandError) as raised:
        run("job_status", job_id)
    assert raised.value.returncode == 2


def _drive(job_id, *, end: str) -> threading.Thread:
    """Move a job through its life from another thread (another DB connection)."""

    def body() -> None:
        try:
            system = Actor.system()
            time.sleep(0.1)
            transition(job_id=job_id, target=Status.RUNNING, actor=system,
                       claim_for="w1")  # fmt: skip
            for percent in (25, 60):
                time.sleep(0.1)
                Job.objects.filter(id=job_id).update(progress_percent=percent, progress_step="step")
            time.sleep(0.1)
            transition(job_id=job_id, target=end, actor=system)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_follow_shows_progress_and_exits_0_when_the_job_succeeds():
    job = make_job()
    thread = _drive(job.id, end=Status.SUCCEEDED)
    out, err = run("job_status", str(job.id), "--follow", "--interval", "0.02")
    thread.join()
    assert "status:    succeeded" in out
    assert "60%" in err or "25%" in err  # the bar was drawn while the job ran
    assert "succeeded" in err  # the bar's last frame names the end state


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("end", [Status.FAILED, Status.CANCELLED])
def test_follow_exits_1_when_the_job_fails_or_is_cancelled(end):
    job = make_job()
    thread = _drive(job.id, end=end)
    with pytest.raises(CommandError) as raised:
        run("job_status", str(job.id), "--follow", "--interval", "0.02")
    thread.join()
    assert raised.value.returncode == 1
    assert end in str(raised.value)
