"""The completer counts a batch's ends against their connectors' breakers and resolves
what depends on the breaker in the same transaction (jobs.services.completion,
docs/connectors.md): one update of a breaker row for all of its ends in the batch,
counted in the batch's order as one-by-one counting would, a connector failure held for
the probe once its breaker holds jobs, the others retried or dead-lettered as the rules
say. Real PostgreSQL rows; handlers of this module run in this process."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor
from audit.verification import audit_verify
from jobs.domain.errors import TransientExternalError
from jobs.domain.states import Status
from jobs.models import ConnectorBreaker, DeadLetter, Job
from jobs.processes.executor import run_claimed
from jobs.services import Finish, job_cancel, jobs_claim, jobs_complete, jobs_finish
from jobs.services.connectors import breakers_forget
from tests.factories import job_in_state
from tests.processes import scripted_table

pytestmark = pytest.mark.django_db

HOST = "completer-host"
COOLDOWN = 60.0
# What each erp job's handler does, by job id ("ok" or "503").
PLAN: dict[Any, str] = {}


def erp_planned(ctx: Any, params: Any) -> dict[str, Any]:
    if PLAN.get(ctx.job_id, PLAN.get("*")) == "503":
        raise TransientExternalError("the ERP answered 503", code="ERP_503")
    return {"posted": True}


@pytest.fixture
def erp(settings: Any) -> Any:
    """The erp connector opens at its `failures`-th failure in a row (no jitter: a held
    job's wait is the rest of the cool-down); its jobs run `erp_planned`."""

    def configure(failures: int) -> None:
        settings.JOBOPS_CONNECTORS = {
            "erp": {
                "failures": failures,
                "cooldown_seconds": COOLDOWN,
                "probe_wait_seconds": 1.0,
                "jitter_seconds": 0.0,
            }
        }

    settings.JOBOPS_CONNECTOR_CACHE_SECONDS = 0
    settings.JOBOPS_BACKOFF_BASE_SECONDS = 0  # a retry nobody holds is due at once
    scripted_table(settings, erp={"handler": f"{__name__}.erp_planned"})
    PLAN.clear()
    breakers_forget()
    yield configure
    breakers_forget()
    PLAN.clear()


def erp_jobs(plan: list[str]) -> list[Job]:
    """Pending erp jobs, created in this order, each with what its handler does."""
    jobs = [
        job_in_state(Status.PENDING, job_type="erp", params={"event": "invoice.paid"}) for _ in plan
    ]
    PLAN.update({job.id: what for job, what in zip(jobs, plan, strict=True)})
    return jobs


def claimed_in_order(jobs: list[Job]) -> list[Job]:
    held = {job.id: job for job in jobs_claim(queues=["erp"], locked_by=HOST, limit=50)}
    assert set(held) == {job.id for job in jobs}
    return [held[job.id] for job in jobs]


def breaker_updates() -> int:
    """Rows of connector_breakers updated in this transaction so far (the test's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'connector_breakers'"
        )
        return int(cursor.fetchone()[0])


def set_breaker(**fields: Any) -> None:
    ConnectorBreaker.objects.update_or_create(
        name="erp", defaults={"changed_at": timezone.now(), **fields}
    )


def ops(event_type: str) -> list[dict[str, Any]]:
    rows = AuditLog.objects.filter(chain=OPS_CHAIN, event_type=event_type).order_by("seq")
    return [json.loads(row.payload)["data"] for row in rows]


def retry_entry(job: Job) -> dict[str, Any]:
    [entry] = AuditLog.objects.filter(job_id=job.id, event_type="retrying")
    return json.loads(entry.payload)["data"]


def seconds_until_run(job: Job) -> float:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM next_run_at - now()) FROM jobs WHERE id = %s", [job.id]
        )
        return float(cursor.fetchone()[0])


def test_several_failures_of_one_connector_in_a_window_count_in_one_update_of_its_row(erp):
    erp(3)
    jobs = erp_jobs(["503"] * 4)
    finishes = [run_claimed(job, HOST, process=False) for job in claimed_in_order(jobs)]
    assert all(isinstance(f, Finish) and f.connector == "erp" for f in finishes)
    assert not ConnectorBreaker.objects.filter(name="erp").exists()  # not counted yet
    updates = breaker_updates()
    assert jobs_finish(finishes=finishes, locked_by=HOST) == []
    assert breaker_updates() - updates == 1
    row = ConnectorBreaker.objects.get(name="erp")
    assert (row.state, row.failures, row.last_error_code) == ("open", 4, "ERP_503")
    # It opened at its third failure, once: that job tipped it, at three in a row.
    [opened] = ops("connector_opened")
    assert (opened["failures"], opened["job_id"], opened["cause"]) == (
        3,
        str(jobs[2].id),
        "failures",
    )
    assert opened["from"] == "closed" and opened["error_code"] == "ERP_503"
    # The two that failed before it opened retry on their backoff; the one that opened
    # it and the one after wait for the probe.
    for job in jobs[:2]:
        assert "breaker" not in retry_entry(job)
        assert seconds_until_run(job) < 5
    for job in jobs[2:]:
        assert retry_entry(job)["breaker"] == "open"
        assert COOLDOWN - 5 < seconds_until_run(job) <= COOLDOWN
    assert {job.status for job in Job.objects.filter(id__in=[j.id for j in jobs])} == {"retrying"}
    assert audit_verify().ok


def test_a_mixed_window_counts_its_ends_in_order_a_success_resetting_the_count(erp):
    erp(2)
    # failure (1), success (back to 0), failure (1), failure (2: opens)
    jobs = erp_jobs(["503", "ok", "503", "503"])
    finishes = [run_claimed(job, HOST, process=False) for job in claimed_in_order(jobs)]
    assert [f.target for f in finishes] == ["retrying", "succeeded", "retrying", "retrying"]
    updates = breaker_updates()
    completion = jobs_complete(finishes=finishes, locked_by=HOST)
    assert completion.lost == [] and breaker_updates() - updates == 1
    assert [f.breaker for f in completion.written] == [None, None, None, "open"]
    row = ConnectorBreaker.objects.get(name="erp")
    assert (row.state, row.failures) == ("open", 2)
    [opened] = ops("connector_opened")
    assert (opened["failures"], opened["job_id"]) == (2, str(jobs[3].id))
    stored = {job.id: job.status for job in Job.objects.filter(id__in=[j.id for j in jobs])}
    assert [stored[job.id] for job in jobs] == ["retrying", "succeeded", "retrying", "retrying"]
    assert audit_verify().ok


def test_a_window_with_only_successes_resets_a_count_and_locks_nothing_when_there_is_none(erp):
    erp(3)
    set_breaker(state="closed", failures=2, reason="")
    first = erp_jobs(["ok", "ok"])
    finishes = [run_claimed(job, HOST, process=False) for job in claimed_in_order(first)]
    updates = breaker_updates()
    assert jobs_finish(finishes=finishes, locked_by=HOST) == []
    assert breaker_updates() - updates == 1
    assert ConnectorBreaker.objects.get(name="erp").failures == 0
    second = erp_jobs(["ok"])
    finishes = [run_claimed(job, HOST, process=False) for job in claimed_in_order(second)]
    updates = breaker_updates()
    assert jobs_finish(finishes=finishes, locked_by=HOST) == []
    assert breaker_updates() == updates  # closed with no failures: nothing to write
    assert ops("connector_opened") == ops("connector_closed") == []


def test_a_held_retry_and_a_dead_letter_in_one_window(erp, settings):
    erp(2)
    settings.JOB_TYPES["erp"]["max_retries"] = 0  # every run is its job's last attempt
    jobs = erp_jobs(["503", "503"])
    assert {job.max_attempts for job in jobs} == {1}
    finishes = [run_claimed(job, HOST, process=False) for job in claimed_in_order(jobs)]
    # Decided on their last attempt: failed, unless the breaker holds them.
    assert [(f.target, f.reason) for f in finishes] == [("failed", "exhausted")] * 2
    completion = jobs_complete(finishes=finishes, locked_by=HOST)
    assert completion.lost == []
    first, second = completion.written
    # The first failure found the breaker closed (one in a row): its dead letter.
    assert (first.target, first.reason) == ("failed", "exhausted")
    [dead] = DeadLetter.objects.filter(job_id=jobs[0].id)
    assert (dead.reason, dead.error_code, dead.broker_copy) == ("exhausted", "ERP_503", False)
    # The second opened it: held for the probe, its budget grown by one, no dead letter.
    assert (second.target, second.breaker, second.extend_attempts) == ("retrying", "open", 1)
    held = Job.objects.get(id=jobs[1].id)
    assert (held.status, held.attempts, held.max_attempts) == ("retrying", 1, 2)
    assert not DeadLetter.objects.filter(job_id=jobs[1].id).exists()
    assert retry_entry(jobs[1])["attempts_extended"] == 1
    assert COOLDOWN - 5 < seconds_until_run(jobs[1]) <= COOLDOWN
    assert Job.objects.get(id=jobs[0].id).status == "failed"
    assert len(ops("connector_opened")) == 1
    assert audit_verify().ok


def test_failures_of_a_window_written_in_one_statement_each_with_its_dead_letter(erp, settings):
    """Failures without a connector's verdict (and a lost one) in one window: each job's
    last progress value, then its `failed` entry, and its dead letter row."""
    erp(5)
    jobs = erp_jobs(["503", "503", "503"])
    claimed = claimed_in_order(jobs)
    progress = {"percent": 40, "step": "posting", "message": None}
    finishes = [
        Finish(
            job.id,
            job.attempts,
            Status.FAILED,
            error_code="BAD",
            error_message="bad",
            reason="nonretryable",
            progress=progress if n == 0 else None,
        )
        for n, job in enumerate(claimed)
    ]
    lost = Finish(jobs[2].id, 7, Status.FAILED, error_code="BAD", reason="fatal")
    completion = jobs_complete(finishes=[*finishes[:2], lost], locked_by=HOST)
    assert completion.lost == [lost]
    assert [f.job_id for f in completion.written] == [jobs[0].id, jobs[1].id]
    rows = {row.job_id: row for row in DeadLetter.objects.filter(job_id__in=[j.id for j in jobs])}
    assert set(rows) == {jobs[0].id, jobs[1].id}
    assert {(r.reason, r.queue, r.broker_copy) for r in rows.values()} == {
        ("nonretryable", "erp_dlq", False)
    }
    events = list(
        AuditLog.objects.filter(job_id=jobs[0].id)
        .order_by("seq")
        .values_list("event_type", flat=True)
    )
    assert events[-2:] == ["progress", "failed"]
    assert Job.objects.get(id=jobs[0].id).progress_percent == 40
    assert Job.objects.get(id=jobs[2].id).status == "running"  # its fence held elsewhere
    assert not ConnectorBreaker.objects.filter(name="erp").exists()  # no connector's verdict
    assert audit_verify().ok


def test_a_run_worker_probe_s_success_closes_the_breaker_when_the_completer_writes_it(erp):
    """Under run_worker the end is written after the run (by the host's completer): the
    probe is not released meanwhile, so its success still closes the breaker."""
    erp(1)
    set_breaker(state="half_open", failures=1, reason="")
    [probe] = erp_jobs(["ok"])
    [claimed] = claimed_in_order([probe])
    finish = run_claimed(claimed, HOST, process=False)
    assert isinstance(finish, Finish) and finish.target == "succeeded"
    row = ConnectorBreaker.objects.get(name="erp")
    assert (row.state, row.probe_job_id) == ("half_open", probe.id)  # still its probe
    assert jobs_finish(finishes=[finish], locked_by=HOST) == []
    row = ConnectorBreaker.objects.get(name="erp")
    assert (row.state, row.failures, row.probe_job_id) == ("closed", 0, None)
    [closed] = ops("connector_closed")
    assert (closed["cause"], closed["job_id"], closed["from"]) == (
        "probe_succeeded",
        str(probe.id),
        "half_open",
    )


def test_a_probe_that_ends_without_a_verdict_is_released_at_once(erp, settings):
    """A cancelled probe tells the breaker nothing: the run releases it as it ends (the
    next job that comes due probes), before any completer writes its end."""
    erp(1)
    settings.JOBOPS_CANCEL_CHECK_SECONDS = 0
    set_breaker(state="half_open", failures=1, reason="")
    [probe] = erp_jobs(["ok"])
    [claimed] = claimed_in_order([probe])
    job_cancel(job_id=probe.id, actor=Actor.system("test-canceller"))
    finish = run_claimed(claimed, HOST, process=False)
    assert isinstance(finish, Finish) and finish.target == "cancelled"
    assert finish.connector is None
    row = ConnectorBreaker.objects.get(name="erp")
    assert (row.state, row.probe_job_id) == ("half_open", None)


def test_breakers_count_takes_arrays_and_no_switch_and_writes_a_row_once():
    """The rules of the transition functions (tests/jobs/test_transition_functions.py)
    hold for the breakers' count too: at most 12 arguments, arrays for the batch, no
    argument that switches behaviour; one UPDATE per breaker row."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.pronargs, p.proargnames, "
            "ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t), p.prosrc "
            "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proname = 'breakers_count'"
        )
        [(nargs, names, types, source)] = cursor.fetchall()
    assert nargs <= 12
    assert all(t.endswith("[]") for t in types) and "boolean[]" not in types
    for arg in names[:nargs]:
        assert not re.search(rf"\b{arg}\s+IS\s+(NOT\s+)?NULL", source, re.IGNORECASE), arg
        assert not re.search(rf"coalesce\([^)]*\b{arg}\b", source, re.IGNORECASE), arg
        assert not re.search(rf"\b{arg}\s*(->>|->|\?)", source), arg
    assert source.count("UPDATE connector_breakers") == 1
    assert "FOR UPDATE" in source and "ORDER BY k.name" in source  # locked in name order


@pytest.mark.django_db(transaction=True)
def test_a_run_worker_host_counts_an_outage_and_its_probe_through_its_completer(erp, settings):
    """A host (thread runners, committed rows): the ERP down, its first failure retries
    on its backoff, the second opens the breaker (one entry) and every later one waits
    for the probe; once the probe is due the ERP is back, one job probes, its success
    closes the breaker when the completer writes it, and every job succeeds."""
    from jobs.processes.executor import Host
    from tests.jobs.test_executor_host import running
    from tests.polling import wait_for

    erp(2)
    settings.JOBOPS_QUEUE_EXECUTORS = {**settings.JOBOPS_QUEUE_EXECUTORS, "erp": "postgres"}
    PLAN["*"] = "503"
    jobs = erp_jobs(["503"] * 4)
    ids = [job.id for job in jobs]

    def retries() -> list[dict[str, Any]]:
        rows = AuditLog.objects.filter(job_id__in=ids, event_type="retrying")
        return [json.loads(row.payload)["data"] for row in rows]

    with running(Host(queues=["erp"], concurrency=2, pool="threads", prefetch=4)):
        wait_for(
            lambda: not Job.objects.filter(id__in=ids, status__in=["pending", "running"]).exists(),
            timeout=30,
            what="every job to have run once or been held",
        )
        ran = retries()
        row = ConnectorBreaker.objects.get(name="erp")
        assert (row.state, row.failures) == ("open", len(ran))
        [opened] = ops("connector_opened")
        assert opened["failures"] == 2
        # Counted one by one in the order they ended: only the first found it closed.
        assert sorted(str(r.get("breaker")) for r in ran) == ["None"] + ["open"] * (len(ran) - 1)
        for id_ in ids:  # PLAN["*"] decides from now on: the ERP is back
            PLAN.pop(id_)
        PLAN["*"] = "ok"
        with connection.cursor() as cursor:
            cursor.execute("UPDATE connector_breakers SET probe_at = now() WHERE name = 'erp'")
            cursor.execute("UPDATE jobs SET next_run_at = now() WHERE id = ANY(%s)", [ids])
        wait_for(
            lambda: Job.objects.filter(id__in=ids, status="succeeded").count() == len(ids),
            timeout=30,
            what="every job to succeed after the probe",
        )
    row = ConnectorBreaker.objects.get(name="erp")
    assert (row.state, row.failures, row.probe_job_id) == ("closed", 0, None)
    [closed] = ops("connector_closed")
    assert closed["cause"] == "probe_succeeded" and closed["job_id"] in {str(i) for i in ids}
    assert len(ops("connector_opened")) == 1
    assert audit_verify().ok
