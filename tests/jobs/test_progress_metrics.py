"""`ctx.progress(..., metrics={...})` (docs/architecture.md#the-handler-contract): bounded,
stored on the job row with its progress value, shown in the API and on the portal's job
page, coalesced with the progress, and never in the hashed `progress` audit entry."""

from __future__ import annotations

import json

import pytest
from celery.exceptions import Reject
from django.urls import reverse

from audit.models import AuditLog
from audit.verification import audit_verify
from jobs.domain import progress as bounds
from jobs.domain.errors import FatalError, ProgressMetricsError
from jobs.models import Job
from jobs.processes.runtime import JobContext, job_execute
from jobs.services import job_claim, job_progress_write, job_retry, job_succeed
from tests.factories import client_for, fence_of, job_in_state
from tests.processes import scripted_table

pytestmark = pytest.mark.django_db

GOOD = {"loss": 0.25, "points": 3, "rate.x": -1e-3}


def running_ctx() -> tuple[Job, JobContext]:
    job = job_in_state("running", worker="w1")
    return job, JobContext(job=job, fence=fence_of(job), log=None)


def progress_entries(job_id) -> list[dict]:
    return [
        json.loads(e.payload)
        for e in AuditLog.objects.filter(job_id=job_id, event_type="progress").order_by("seq")
    ]


@pytest.mark.parametrize(
    ("metrics", "problem"),
    [
        ({f"m{n}": n for n in range(21)}, "21 keys"),
        ({"loss": "0.5"}, "not a number"),
        ({"loss": float("nan")}, "finite"),
        ({"loss": float("inf")}, "finite"),
        ({"loss": float("-inf")}, "finite"),
        ({"done": True}, "not a number"),
        ({"loss": None}, "not a number"),
        ({"loss": [1]}, "not a number"),
        ({"n": 2**53}, "2\\*\\*53"),
        ({"1st": 1}, "not an identifier"),
        ({"a b": 1}, "not an identifier"),
        ({"": 1}, "not an identifier"),
        ({"x" * 65: 1}, "not an identifier"),
        ({1: 1}, "not an identifier"),
        ([("loss", 1)], "must be a mapping"),
    ],
)
def test_metrics_beyond_their_bounds_are_refused_and_nothing_is_written(settings, metrics, problem):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 0
    job, ctx = running_ctx()
    with pytest.raises(ProgressMetricsError, match=problem) as refused:
        ctx.progress(50, step="s", metrics=metrics)
    assert refused.value.code == "PROGRESS_METRICS_INVALID" and not refused.value.retryable
    row = Job.objects.get(id=job.id)
    assert (row.progress_percent, row.progress_step, row.progress_metrics) == (0, None, None)
    assert row.version == job.version and progress_entries(job.id) == []
    assert ctx.take_pending_progress() is None  # nothing of the refused value kept


def test_the_service_bounds_metrics_too_whoever_calls_it():
    job = job_in_state("running", worker="w1")
    with pytest.raises(ProgressMetricsError, match="finite"):
        job_progress_write(
            job_id=job.id, fence=fence_of(job), percent=5, step=None, message=None,
            measured={"loss": float("nan")},
        )  # fmt: skip
    assert Job.objects.get(id=job.id).version == job.version


def test_metrics_over_4_kb_of_json_are_refused(settings, monkeypatch):
    # 20 keys of at most 64 characters stay under 2 KB: the byte bound is checked on
    # its own (for when the others change), so it is tested with a lower one.
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 0
    assert bounds.MAX_METRICS_BYTES == 4096
    big = {f"{'k' * 60}{n:02d}": 1.0 / 3 for n in range(20)}
    size = len(json.dumps(big, separators=(",", ":")))
    assert bounds.metrics_checked(big) == big  # under 4 KB: taken
    monkeypatch.setattr(bounds, "MAX_METRICS_BYTES", size - 1)
    _, ctx = running_ctx()
    with pytest.raises(ProgressMetricsError, match=rf"{size} bytes of JSON \(at most {size - 1}\)"):
        ctx.progress(50, metrics=big)


def test_metrics_on_the_row_the_api_and_the_page_and_not_in_the_audit_entry(
    settings, otp_admin_client
):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 0
    job, ctx = running_ctx()
    ctx.progress(40, step="fit", metrics=GOOD)
    row = Job.objects.get(id=job.id)
    assert (row.progress_percent, row.progress_step, row.progress_metrics) == (40, "fit", GOOD)
    assert row.version > job.version

    body = client_for(job.owner).get(f"/api/v1/jobs/{job.id}").json()
    assert body["progress"]["metrics"] == GOOD and body["progress"]["percent"] == 40

    page = otp_admin_client.get(reverse("admin:jobs_job_change", args=[job.id])).content.decode()
    assert 'id="progress-metrics"' in page
    assert "<dt>loss</dt><dd><code>0.25</code></dd>" in page
    assert "<dt>rate.x</dt>" in page

    (entry,) = progress_entries(job.id)
    assert entry["data"]["percent"] == 40
    assert "metrics" not in json.dumps(entry) and "0.25" not in json.dumps(entry)
    assert audit_verify(job_ids=[job.id]).ok


def test_metrics_coalesce_with_their_progress_and_the_last_is_flushed_at_the_end(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 3600
    job, ctx = running_ctx()
    ctx.progress(10, step="a", metrics={"loss": 1.0})  # the first value: written at once
    ctx.progress(30, step="b", metrics={"loss": 0.5})  # coalesced: waits
    ctx.progress(60, step="c", metrics={"loss": 0.125, "n": 7})
    row = Job.objects.get(id=job.id)
    assert (row.progress_percent, row.progress_metrics) == (10, {"loss": 1.0})
    assert len(progress_entries(job.id)) == 1
    pending = ctx.take_pending_progress()
    assert pending == {"percent": 60, "step": "c", "message": None,
                       "metrics": {"loss": 0.125, "n": 7}}  # fmt: skip
    done = job_succeed(job_id=job.id, fence=fence_of(job), result={"ok": 1}, progress=pending)
    assert (done.progress_percent, done.progress_step) == (100, "c")
    assert Job.objects.get(id=job.id).progress_metrics == {"loss": 0.125, "n": 7}
    assert audit_verify(job_ids=[job.id]).ok


def test_a_value_without_metrics_clears_them_and_a_new_attempt_starts_without(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 0
    job, ctx = running_ctx()
    ctx.progress(20, metrics={"loss": 2.0})
    ctx.progress(30, step="next")  # a progress value is replaced whole, as its step is
    assert Job.objects.get(id=job.id).progress_metrics is None
    ctx.progress(40, metrics={"loss": 1.0})
    job_retry(job_id=job.id, fence=ctx.fence, delay=0, error_code="X", error_message="x")
    assert Job.objects.get(id=job.id).progress_metrics == {"loss": 1.0}  # kept while retrying
    again = job_claim(job_id=job.id, locked_by="w2")
    assert again is not None and again.progress_metrics is None  # the attempt's own


# Handlers of a `cam` job run in this process by job_execute, as a worker runs them.
def reports_a_string_metric(ctx, params):
    ctx.progress(10, metrics={"loss": "low"})
    return {"unreachable": True}


def reports_metrics_then_fails(ctx, params):
    ctx.progress(40, step="half", metrics={"loss": 0.5})  # written at once
    ctx.progress(70, step="most", metrics={"loss": 0.25})  # coalesced: flushed at the end
    raise FatalError("planned fatal error", code="PLANNED_FATAL")


def executed(settings, handler):
    scripted_table(settings, cam={"handler": f"{__name__}.{handler.__name__}"})
    job = job_in_state("queued", job_type="cam", params={"do": handler.__name__})
    with pytest.raises(Reject) as rejected:  # failed for good: its message dead-letters
        job_execute(payload={"job_id": str(job.id)}, hostname="test-host")
    assert rejected.value.requeue is False
    return Job.objects.get(id=job.id)


def test_bad_metrics_fail_the_job_with_a_clear_error_not_the_worker(settings):
    job = executed(settings, reports_a_string_metric)
    assert (job.status, job.last_error_code) == ("failed", "PROGRESS_METRICS_INVALID")
    assert "metric 'loss' is a str, not a number" in job.last_error_message
    assert job.result is None and job.progress_metrics is None
    assert audit_verify(job_ids=[job.id]).ok


def test_the_last_metrics_are_written_before_a_job_is_dead_lettered(settings):
    settings.JOBOPS_PROGRESS_INTERVAL_SECONDS = 60
    job = executed(settings, reports_metrics_then_fails)
    assert (job.status, job.progress_percent, job.progress_step) == ("failed", 70, "most")
    assert job.progress_metrics == {"loss": 0.25}
    assert [e["data"]["percent"] for e in progress_entries(job.id)] == [40, 70]
    assert all("metrics" not in json.dumps(e) for e in progress_entries(job.id))
    assert audit_verify(job_ids=[job.id]).ok


def test_the_previous_releases_progress_write_is_the_same_write_without_metrics():
    """jobs_progress, the progress write of the release before metrics, stays one
    release for its processes: it writes the value, its entry and its job.progress
    event as jobs_progress_with_metrics does, and clears the row's metrics."""
    from django.db import connection
    from django.utils import timezone

    from audit.services import Actor, format_ts
    from jobs.models import EventOutbox
    from jobs.services.transitions import Progress, job_progress_audit

    job, ctx = running_ctx()
    job_progress_audit(
        job_id=job.id,
        fence=ctx.fence,
        progress=Progress(20, metrics={"loss": 2.0}),
        actor=Actor.system("worker"),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM jobs_progress(%s::uuid[], %s::int[], %s, %s::int[],"
            " %s::text[], %s::text[], %s::jsonb[], 'system', 'worker', %s, NULL)",
            [[job.id], [job.attempts], ctx.fence.locked_by, [50], ["old"], ["m"], ["{}"],
             format_ts(timezone.now())],
        )  # fmt: skip
        assert cursor.fetchone()[0] == 1
    row = Job.objects.get(id=job.id)
    assert (row.progress_percent, row.progress_step, row.progress_metrics) == (50, "old", None)
    assert [e["data"]["percent"] for e in progress_entries(job.id)] == [20, 50]
    events = [
        json.loads(body) if isinstance(body, str) else body
        for body in EventOutbox.objects.filter(job_id=job.id)
        .order_by("id")
        .values_list("payload", flat=True)
    ]
    progress = [e for e in events if e["type"] == "job.progress"]
    assert [(e["progress"]["percent"], e.get("metrics")) for e in progress] == [
        (20, {"loss": 2.0}),
        (50, None),
    ]
    assert audit_verify(job_ids=[job.id]).ok
