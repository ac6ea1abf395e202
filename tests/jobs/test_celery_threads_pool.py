"""The Celery adapter under the threads pool, in process (jobs.processes.runtime,
jobs.execution.claim.Claimer, jobs.execution.complete.Completer): deliveries that start
together are claimed in one statement per organisation, each job answered to its own
task (a job not claimable: the task reads why, as after its own claim); tasks that end
together share one transaction and none returns (so none is acked) before it committed;
a batch of claims or a window of ends the database refuses hands every task's message
back; a run past its hard limit is abandoned by the heartbeat loop. The real worker's
runs are tests/e2e/test_celery_threads.py's."""

from __future__ import annotations

import math
import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import structlog
from celery.exceptions import Reject
from django.db import OperationalError, connection

from jobs.domain.exceptions import JobLost
from jobs.execution import batches, claim, complete
from jobs.execution.context import JobContext
from jobs.execution.heartbeat import HeartbeatLoop
from jobs.models import Job
from jobs.processes import runtime
from jobs.processes.runtime import job_execute
from jobs.services import Fence, job_claim
from tests.factories import OrganisationFactory, UserFactory, job_in_state
from tests.polling import wait_for
from tests.processes import (
    assert_chain_valid,
    entries_per_transaction,
    job_events,
    scripted_table,
)

pytestmark = pytest.mark.django_db(transaction=True)


def succeeds(ctx, params):
    return {"ok": True}


def _pool(settings, monkeypatch, concurrency: int):
    """This process as a threads-pool worker of `concurrency` threads."""
    scripted_table(settings, cam={"handler": f"{__name__}.succeeds"})
    settings.JOBOPS_DB_DOWN_REQUEUE_DELAY_SECONDS = 0
    pool = runtime._ThreadsPool(concurrency=concurrency, hostname="threads-test")
    monkeypatch.setattr(runtime, "THREADS", pool)
    yield pool
    for thread in (pool.claimer, pool.completer):
        thread.stop(timeout=5)  # each closes its own connection
    pool.heartbeats.stop(timeout=5)


@pytest.fixture
def threads_pool(settings, monkeypatch):
    """This process as a threads-pool worker of three threads."""
    yield from _pool(settings, monkeypatch, 3)


@pytest.fixture
def wide_pool(settings, monkeypatch):
    """This process as a threads-pool worker of eight threads (the Procfile's)."""
    yield from _pool(settings, monkeypatch, 8)


def _payload(job: Job, org_id: int | None = None) -> dict:
    """The job's message as the publisher writes it (its organisation: `org_id`, else the
    job's own)."""
    return {"job_id": str(job.id), "org_id": org_id if org_id is not None else job.org_id}


def _deliver(messages: list[Job | dict]) -> list[tuple[float, object]]:
    """Each message's delivery (a job: its publisher's message) in a thread of its own,
    as the pool runs them: when each returned, and what (its summary, or what it
    raised)."""

    def one(message: Job | dict) -> tuple[float, object]:
        payload = _payload(message) if isinstance(message, Job) else message
        try:
            answer: object = job_execute(payload=payload, hostname="t")
        except Reject as exc:
            answer = exc
        finally:
            connection.close()  # this thread's own
        return time.monotonic(), answer

    with ThreadPoolExecutor(max_workers=len(messages)) as pool:
        return list(pool.map(one, messages))


class Claims:
    """The pool's claimer with its claims recorded (`calls`: each group's organisation
    and job ids) and a way to make deliveries meet in one batch without counting on
    timing: `held(n)` keeps the claimer's thread busy on a claim of its own until `n`
    claims wait behind it, which it then takes as one batch. `refuse` makes each
    recorded claim raise that error instead."""

    GATE = uuid.UUID(int=0)

    def __init__(self, claimer: claim.Claimer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.claimer = claimer
        self.calls: list[tuple[int, list[str]]] = []
        self.refuse: BaseException | None = None
        self._holding = threading.Event()
        self._until = 0
        real = claim.jobs_claim_delivered

        def recorded(*, job_ids, locked_by, org_id):
            if job_ids == [self.GATE]:
                self._holding.set()
                wait_for(lambda: claimer.queued() >= self._until, timeout=20)
                return {}
            self.calls.append((org_id, [str(job_id) for job_id in job_ids]))
            if self.refuse is not None:
                raise self.refuse
            return real(job_ids=job_ids, locked_by=locked_by, org_id=org_id)

        monkeypatch.setattr(claim, "jobs_claim_delivered", recorded)

    def held(self, n: int, deliver) -> object:
        """`deliver()` while the claimer is held until `n` claims wait; what it returns."""
        self._until = n
        self._holding.clear()
        gate = threading.Thread(
            target=self.claimer.claim, kwargs={"job_id": self.GATE, "org_id": 0, "locked_by": "g"}
        )
        gate.start()
        wait_for(self._holding.is_set, timeout=20, what="the claimer held by the gate claim")
        try:
            return deliver()
        finally:
            gate.join(timeout=20)


@pytest.fixture
def claims(wide_pool, monkeypatch) -> Claims:
    return Claims(wide_pool.claimer, monkeypatch)


def test_deliveries_starting_together_are_claimed_in_one_statement_per_organisation(claims):
    mine = UserFactory()
    theirs = UserFactory(org=OrganisationFactory())
    jobs = [
        job_in_state("queued", owner=owner, job_type="cam", params={"do": "succeeds"})
        for owner in (mine, theirs, mine, theirs, mine)
    ]
    returned = claims.held(len(jobs), lambda: _deliver(jobs))
    assert [answer["outcome"] for _, answer in returned] == ["succeeded"] * 5
    # One batch: one call per organisation, each with that organisation's jobs.
    by_org = {org_id: sorted(ids) for org_id, ids in claims.calls}
    assert len(claims.calls) == 2 and by_org == {
        job.org_id: sorted(str(j.id) for j in jobs if j.org_id == job.org_id) for job in jobs
    }
    assert sorted(entries_per_transaction([job.id for job in jobs], "started")) == [2, 3]
    for job in jobs:
        stored = Job.objects.get(id=job.id)
        assert (stored.status, stored.attempts) == ("succeeded", 1)
        assert job_events(job.id) == ["created", "queued", "started", "succeeded"]
        assert_chain_valid(job.id)


def test_in_a_batch_a_job_not_claimable_is_answered_none_and_the_others_run_once(claims):
    owner = UserFactory()
    cam = {"job_type": "cam", "params": {"do": "succeeds"}}
    claimable = [job_in_state("queued", owner=owner, **cam) for _ in range(2)]
    running = job_in_state("running", owner=owner, worker="elsewhere", **cam)
    done = job_in_state("succeeded", owner=owner, **cam)
    foreign = job_in_state("queued", owner=UserFactory(org=OrganisationFactory()), **cam)
    messages = [
        _payload(claimable[0]),
        _payload(running),
        _payload(claimable[1]),
        _payload(done),
        _payload(claimable[0]),  # delivered twice: a duplicate
        _payload(foreign, org_id=owner.memberships.get().organisation_id),  # not its org
    ]
    returned = claims.held(len(messages), lambda: _deliver(messages))
    answers = [answer for _, answer in returned]
    # One statement for the six: the message's organisation is the group's.
    assert len(claims.calls) == 1 and len(claims.calls[0][1]) == 6
    assert answers[2]["outcome"] == "succeeded"
    # The job delivered twice runs for whichever delivery asked first.
    assert sorted(answers[n]["outcome"] for n in (0, 4)) == ["dropped", "succeeded"]
    # Not claimed: each read why, as after a claim of its own (runtime._not_claimed).
    assert answers[1] == {"job_id": str(running.id), "outcome": "dropped"}
    assert answers[3] == {"job_id": str(done.id), "outcome": "dropped"}
    assert isinstance(answers[5], Reject) and not answers[5].requeue  # TENANT_MISMATCH
    for job in claimable:
        assert job_events(job.id) == ["created", "queued", "started", "succeeded"]
        assert_chain_valid(job.id)
    stored = Job.objects.get(id=running.id)
    assert (stored.status, stored.locked_by, stored.attempts) == ("running", "elsewhere", 1)
    assert job_events(done.id).count("started") == 1
    stored = Job.objects.get(id=foreign.id)
    assert (stored.status, stored.attempts, stored.last_error_code) == (
        "failed",
        0,
        "TENANT_MISMATCH",
    )
    for job in (running, done, foreign):
        assert_chain_valid(job.id)


def test_a_batch_of_claims_the_database_refuses_hands_every_message_back(claims):
    jobs = [job_in_state("queued", job_type="cam", params={"do": "succeeds"}) for _ in range(4)]
    claims.refuse = OperationalError("the database is away")
    returned = claims.held(len(jobs), lambda: _deliver(jobs))
    assert len(claims.calls) == 1 and len(claims.calls[0][1]) == 4  # one batch for the four
    assert all(isinstance(answer, Reject) and answer.requeue for _, answer in returned)
    # Nothing claimed: the redelivered messages claim them.
    for job in jobs:
        stored = Job.objects.get(id=job.id)
        assert (stored.status, stored.attempts) == ("queued", 0)
        assert job_events(job.id) == ["created", "queued"]
    claims.refuse = None
    returned = _deliver(jobs)
    assert [answer["outcome"] for _, answer in returned] == ["succeeded"] * 4


def test_a_message_without_an_organisation_claims_alone(claims):
    job = job_in_state("queued", job_type="cam", params={"do": "succeeds"})
    ((_, answer),) = _deliver([{"job_id": str(job.id)}])
    assert answer["outcome"] == "succeeded"
    assert claims.calls == []  # job_claim's own statement, not the claimer's


def test_the_claimer_takes_what_is_queued_and_waits_for_nothing_more():
    """A window of 0 s (the claimer's): the first request and those already behind it,
    at most `batch`; a request that comes later is the next window's."""
    items: queue.SimpleQueue = queue.SimpleQueue()
    for name in "abc":
        items.put((time.monotonic(), name))
    served: list[list[str]] = []

    def serve(window):
        served.append([name for _, name in window])
        if len(served) == 2:
            items.put((time.monotonic(), "d"))
            items.put(None)

    batches.windows(items, serve, batch=2, seconds=0.0)
    assert served == [["a", "b"], ["c"], ["d"]]
    assert claim.Claimer(batch=8).window_seconds() == 0.0


def test_tasks_ending_together_share_a_transaction_and_return_after_its_commit(
    threads_pool, monkeypatch
):
    # A long window: it closes because every thread of the pool waits on it.
    monkeypatch.setattr(complete, "COMPLETE_WINDOW_SECONDS", 5.0)
    jobs = [job_in_state("queued", job_type="cam", params={"do": "succeeds"}) for _ in range(3)]
    batches: list[tuple[set[str], str, float]] = []
    jobs_complete = complete.jobs_complete

    def counted(*, finishes, locked_by):
        completion = jobs_complete(finishes=finishes, locked_by=locked_by)
        batches.append(({str(f.job_id) for f in finishes}, locked_by, time.monotonic()))
        return completion

    monkeypatch.setattr(complete, "jobs_complete", counted)
    started = time.monotonic()
    returned = _deliver(jobs)
    assert [answer["outcome"] for _, answer in returned] == ["succeeded"] * 3
    # One window, one lock holder for the process, well before the window's 5 s.
    assert [(ids, holder) for ids, holder, _ in batches] == [
        ({str(job.id) for job in jobs}, threads_pool.locked_by)
    ]
    committed = batches[0][2]
    assert committed - started < 4
    assert all(at >= committed for at, _ in returned)  # none returned (acked) before
    assert set(
        Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True)
    ) == {"succeeded"}


def test_a_window_the_database_refuses_hands_every_message_back(threads_pool, monkeypatch):
    monkeypatch.setattr(complete, "COMPLETE_WINDOW_SECONDS", 5.0)
    jobs = [job_in_state("queued", job_type="cam", params={"do": "succeeds"}) for _ in range(3)]
    calls = []

    def down(**_):
        calls.append(1)
        raise OperationalError("the database is away")

    monkeypatch.setattr(complete, "jobs_complete", down)
    returned = _deliver(jobs)
    assert len(calls) == 1  # one window for the three
    assert all(isinstance(answer, Reject) and answer.requeue for _, answer in returned)
    # Nothing decided: the reaper reclaims them once their locks are stale.
    assert set(
        Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True)
    ) == {"running"}


def test_a_run_past_its_hard_limit_is_abandoned_without_waiting_for_a_heartbeat(settings):
    settings.JOBOPS_HEARTBEAT_SECONDS = 30  # the limit comes long before any beat
    job = job_claim(job_id=job_in_state("queued").id, locked_by="limits-test")
    assert job is not None
    ctx = JobContext(job=job, fence=Fence("limits-test", job.attempts), log=structlog.get_logger())
    loop = HeartbeatLoop(hard_limits=True)
    loop.start()
    try:
        # The thread asleep until its next beat, 30 s away (it sets when it wakes next,
        # then waits).
        wait_for(lambda: loop._wake_at != math.inf, timeout=5, what="the loop's thread to wait")
        ctx.deadline = time.monotonic() + 0.3
        loop.add(ctx)
        wait_for(ctx._lost.is_set, timeout=5, what="the hard limit to abandon the run")
        assert ctx.job_id not in loop._members  # no more beats: the lock goes stale
        with pytest.raises(JobLost):
            ctx.progress(50)  # the handler's next call stops it
    finally:
        loop.stop(timeout=5)


def test_a_loop_without_hard_limits_never_abandons(settings):
    """run_worker's host and a prefork child: the limits are enforced elsewhere. The
    loop's passes show in the lock each beat refreshes: two beats after the run's
    deadline, it is still beating the run."""
    settings.JOBOPS_HEARTBEAT_SECONDS = 0.1
    job = job_claim(job_id=job_in_state("queued").id, locked_by="limits-test")
    assert job is not None
    ctx = JobContext(job=job, fence=Fence("limits-test", job.attempts), log=structlog.get_logger())
    ctx.deadline = time.monotonic() - 1
    loop = HeartbeatLoop()

    def locked_at():
        return Job.objects.values_list("locked_at", flat=True).get(id=job.id)

    loop.add(ctx)
    try:
        for _ in range(2):
            before = locked_at()
            wait_for(lambda b=before: locked_at() > b, timeout=5, what="the loop's next beat")
        assert not ctx._lost.is_set() and ctx.job_id in loop._members
    finally:
        loop.stop(timeout=5)


def test_a_caller_whose_completer_thread_died_is_not_left_waiting(monkeypatch):
    completer = complete.Completer(batch=2)
    monkeypatch.setattr(completer, "_start", lambda: None)  # as if it died at once
    end = complete.End(finish=None, log=structlog.get_logger(), job_type="cam")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="completer thread ended"):
        completer.write(end, locked_by="t")
