"""manage.py submit_job and job_status [--follow]."""

from __future__ import annotations

import io
import re
import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from audit.services import Actor
from jobs.domain.states import Status
from jobs.management.commands.job_status import RATE_MIN_SECONDS, progress_rate
from jobs.models import Job
from jobs.services import (
    job_cancel,
    job_cancel_confirm,
    job_claim,
    job_fail_with_dead_letter,
    job_progress_write,
    job_succeed,
)
from tests.factories import UserFactory, fence_of, job_in_state, make_job
from tests.polling import wait_for


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


JOBS_FILE = "\n".join(
    [
        '{"type": "sim", "params": {"steps": 2, "step_seconds": 0}}',
        "",  # blank: skipped, the numbers stay the file's
        '{"type": "sim", "params": {"steps": "two"}}',
        "not json",
        "[1, 2]",
        '{"type": "report", "params": {}, "idempotency_key": "own"}',
        '{"type": "sim", "params": {}, "status": "succeeded"}',
    ]
)


@pytest.mark.django_db
def test_submit_job_file_reports_bad_lines_by_number_and_submits_the_others(tmp_path):
    UserFactory(username="alice")
    path = tmp_path / "jobs.jsonl"
    path.write_text(JOBS_FILE + "\n", encoding="utf-8")
    with pytest.raises(CommandError) as refused:
        run("submit_job", "--file", str(path), "--owner", "alice", "--key", "load-1")
    assert refused.value.returncode == 2
    assert "4 line(s) failed" in str(refused.value)
    jobs = {j.idempotency_key: j for j in Job.objects.all()}
    assert set(jobs) == {"load-1:1", "own"}
    assert jobs["load-1:1"].params["steps"] == 2
    # A second run with the same key creates nothing twice, and says so line by line.
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("submit_job", "--file", str(path), "--owner", "alice", "--key", "load-1",
                     stdout=out)  # fmt: skip
    lines = out.getvalue().splitlines()
    assert lines[0] == f"1 {jobs['load-1:1'].id} existing"
    assert lines[1].startswith("3 error ERR-JOB-422")
    assert lines[2].startswith("4 error ERR-JOB-400: Malformed JSON")
    assert lines[3].startswith("5 error ERR-JOB-400")
    assert lines[4] == f"6 {jobs['own'].id} existing"
    assert lines[5].startswith("7 error ERR-JOB-400") and "status" in lines[5]
    assert lines[6] == "2 of 6 jobs submitted (owner alice)"
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_submit_job_file_bounds_a_line_and_the_file(tmp_path, settings, monkeypatch):
    UserFactory(username="alice")
    settings.JOBOPS_MAX_PAYLOAD_BYTES = 200
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"type": "ai", "params": {"text": "' + "x" * 300 + '"}}\n', encoding="utf-8")
    with pytest.raises(CommandError):
        run("submit_job", "--file", str(path), "--owner", "alice")
    monkeypatch.setattr("jobs.management.commands.submit_job.MAX_FILE_LINES", 2)
    path.write_text('{"type": "report", "params": {}}\n' * 3, encoding="utf-8")
    with pytest.raises(CommandError, match="3 jobs, at most 2"):
        run("submit_job", "--file", str(path), "--owner", "alice")
    assert Job.objects.count() == 0
    with pytest.raises(CommandError, match="No such file"):
        run("submit_job", "--file", str(tmp_path / "missing"), "--owner", "alice")


@pytest.mark.django_db
def test_submit_job_file_submits_in_batches_of_the_bound(tmp_path, settings):
    UserFactory(username="alice")
    settings.JOBOPS_BATCH_CREATE_MAX = 2
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"type": "report", "params": {}}\n' * 5, encoding="utf-8")
    out, _ = run("submit_job", "--file", str(path), "--owner", "alice", "--key", "b")
    assert out.splitlines()[-1] == "5 of 5 jobs submitted (owner alice)"
    assert sorted(Job.objects.values_list("idempotency_key", flat=True)) == [
        f"b:{n}" for n in range(1, 6)
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--type", "sim", "--params", "{nope"], "not valid JSON"),
        (["--type", "sim", "--params", '{"steps": 1' + "0" * 5000 + "}"], "more than 4300"),
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
def test_job_status_says_which_attempt_the_progress_belongs_to():
    job = job_in_state("running")
    job_progress_write(job_id=job.id, fence=fence_of(job), percent=30, step="meshing", message=None)
    out, _ = run("job_status", str(job.id))
    assert "progress:  30% meshing (attempt 1 of 6)" in out


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


def _drive(job_id, *, end: str, follower: io.StringIO) -> threading.Thread:
    """Move a job through its life from another thread (another DB connection), one
    step each time the follower's bar (its stderr) has shown the one before."""

    def shown(text: str) -> None:
        wait_for(lambda: text in follower.getvalue(), timeout=10, what=f"the bar to show {text}")

    def body() -> None:
        try:
            shown(str(job_id)[:8])  # the bar's first frame
            fence = fence_of(job_claim(job_id=job_id, locked_by="w1"))
            shown("running")
            for percent in (25, 60):
                job_progress_write(
                    job_id=job_id, fence=fence, percent=percent, step="step", message=None
                )
                shown(f"{percent}%")
            if end == Status.SUCCEEDED:
                job_succeed(job_id=job_id, fence=fence, result={"ok": True})
            elif end == Status.FAILED:
                job_fail_with_dead_letter(
                    job_id=job_id, reason="fatal", actor=Actor.system("worker"), fence=fence
                )
            else:
                job_cancel(job_id=job_id, actor=Actor.system("test"))
                job_cancel_confirm(job_id=job_id, fence=fence)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def follow(job_id, *, err: io.StringIO | None = None, timeout: float = 30) -> str:
    """`job_status --follow` polling fast, with a deadline so a stuck job fails the test;
    returns its stdout (the bar goes to `err`)."""
    out = io.StringIO()
    call_command(
        "job_status", str(job_id), "--follow", "--interval", "0.02", "--timeout", str(timeout),
        stdout=out, stderr=err or io.StringIO(),
    )  # fmt: skip
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_follow_shows_progress_and_exits_0_when_the_job_succeeds():
    job = make_job()
    err = io.StringIO()
    thread = _drive(job.id, end=Status.SUCCEEDED, follower=err)
    out = follow(job.id, err=err)
    thread.join()
    assert "status:    succeeded" in out
    assert "25%" in err.getvalue() and "60%" in err.getvalue()  # drawn while the job ran
    assert "running attempt 1/6 step" in err.getvalue()  # and whose attempt it is
    assert "succeeded" in err.getvalue()  # the bar's last frame names the end state


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("end", [Status.FAILED, Status.CANCELLED])
def test_follow_exits_1_when_the_job_fails_or_is_cancelled(end):
    job = make_job()
    err = io.StringIO()
    thread = _drive(job.id, end=end, follower=err)
    with pytest.raises(CommandError) as raised:
        follow(job.id, err=err)
    thread.join()
    assert raised.value.returncode == 1
    assert end in str(raised.value)


@pytest.mark.django_db
def test_follow_gives_up_after_its_timeout_with_exit_3_naming_the_state():
    job = job_in_state("running")
    started = time.monotonic()
    with pytest.raises(CommandError) as raised:
        follow(job.id, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 5
    assert raised.value.returncode == 3
    assert f"job {job.id} still running after 0.3s (--timeout)" in str(raised.value)


@pytest.mark.django_db
def test_follow_shows_no_rate_it_cannot_know():
    """Progress made before the follow started is no rate: a job found at 100 % drew
    "4883778%/s" (100 points over the microseconds since the bar was created)."""
    job = job_in_state("succeeded")
    err = io.StringIO()
    follow(job.id, err=err)
    assert "100%" in err.getvalue() and "succeeded" in err.getvalue()
    assert "/s" not in err.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("first", "last", "rate"),
    [
        ((10.0, 20), (14.0, 60), 10.0),  # 40 points in 4 s
        ((10.0, 20), (11.0, 60), None),  # too short a time base
        ((10.0, 20), (20.0, 20), None),  # no progress: no rate, not 0 %/s forever
        ((10.0, 60), (20.0, 0), None),  # a retry started again from 0
    ],
)
def test_the_rate_is_points_per_second_between_two_samples_of_the_attempt(first, last, rate):
    assert progress_rate(first, last) == rate


@pytest.mark.django_db(transaction=True)
def test_follow_shows_the_rate_of_the_progress_it_saw():
    job = job_in_state("running")
    fence = fence_of(job)
    job_progress_write(job_id=job.id, fence=fence, percent=20, step="s", message=None)
    err = io.StringIO()

    def advance() -> None:
        try:
            wait_for(lambda: "20/100%" in err.getvalue(), timeout=10)
            job_progress_write(job_id=job.id, fence=fence, percent=60, step="s", message=None)
        finally:
            connection.close()

    thread = threading.Thread(target=advance)
    thread.start()
    with pytest.raises(CommandError):  # --timeout: the job goes on
        follow(job.id, err=err, timeout=RATE_MIN_SECONDS + 1)
    thread.join()
    rates = [float(r) for r in re.findall(r"([0-9.]+)%/s", err.getvalue())]
    # 40 points over the follow's 2-3 s, never a figure beyond what was seen.
    assert rates and all(40 / (RATE_MIN_SECONDS + 1.5) <= r <= 40 / RATE_MIN_SECONDS for r in rates)
