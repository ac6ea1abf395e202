"""The dispatcher's steps in process: publishing due jobs, the reaper, failing steps."""

from __future__ import annotations

import io
import os
import threading
import time
from datetime import timedelta
from itertools import pairwise

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from kombu import Connection

from jobs.integrations.liveness import live_processes
from jobs.integrations.topology import JOBS_EXCHANGE
from jobs.models import DeadLetter, Job
from jobs.processes.dispatcher import PendingListener, dispatch_forever, dispatch_once, found_work
from jobs.queries import PENDING_CHANNEL
from jobs.services import (
    job_heartbeat,
    job_publish,
    publish_due_once,
    reap_once,
    republish_queued,
)
from tests.factories import backdate, fence_of, job_in_state, make_job
from tests.polling import wait_for
from tests.processes import free_port, job_events
from tests.queues import drain

pytestmark = pytest.mark.django_db


def sql(statement, *params):
    with connection.cursor() as cursor:
        cursor.execute(statement, list(params))


def _backend_alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0] > 0


def stale_running():
    """A running job whose worker stopped heartbeating ten minutes ago."""
    job = job_in_state("running", worker="dead-worker")
    backdate(job, locked_at=600)
    return job


def _old(job):
    """Pending for two minutes: past the dispatcher's grace period."""
    backdate(job, created_at=120)
    return job


def test_reaper_reclaims_a_stale_lock_as_retrying_due_now(settings):
    settings.JOBOPS_LOCK_TIMEOUT = 60
    job = stale_running()
    assert reap_once() == {"reclaimed": 1, "worker_lost": 0}
    row = Job.objects.get(id=job.id)
    assert row.status == "retrying" and row.locked_by is None and row.next_run_at is not None
    assert job_events(job.id)[-1] == "reclaimed"
    assert reap_once() == {"reclaimed": 0, "worker_lost": 0}  # idempotent


def test_reaper_fails_a_job_with_no_attempts_left_as_worker_lost(settings):
    job = stale_running()
    sql("UPDATE jobs SET max_attempts = 1 WHERE id = %s", job.id)
    assert reap_once() == {"reclaimed": 0, "worker_lost": 1}
    row = Job.objects.get(id=job.id)
    assert (row.status, row.dead_letter_queue) == ("failed", "sim_dlq")
    dead = DeadLetter.objects.get(job_id=job.id)
    assert (dead.reason, dead.state, dead.broker_copy) == ("worker_lost", "open", False)


def test_reaper_leaves_live_locks_alone():
    job = job_in_state("running", worker="alive")
    assert reap_once() == {"reclaimed": 0, "worker_lost": 0}
    assert Job.objects.get(id=job.id).status == "running"


def test_dispatcher_publishes_due_retries_and_old_pending_jobs_only(broker, settings):
    settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS = 60
    fresh = make_job()  # pending, but younger than the grace period
    old = _old(make_job())
    due = job_in_state("retrying", retry_in=0)
    later = job_in_state("retrying", retry_in=3600)
    assert publish_due_once() == 2
    status = dict(Job.objects.values_list("id", "status"))
    assert status[old.id] == "queued" and status[due.id] == "queued"
    assert status[fresh.id] == "pending" and status[later.id] == "retrying"


def test_republish_queued_publishes_each_queued_job_again_oldest_first(broker):
    newer = job_in_state("queued")
    older = job_in_state("queued")
    backdate(older, created_at=60)
    others = [job_in_state(status) for status in ("pending", "running", "succeeded", "retrying")]
    trails = {job.id: job_events(job.id) for job in [newer, older, *others]}
    assert republish_queued(batch=1) == 2  # one job a batch: the keyset walks on
    sent = [message.headers["job_id"] for message in drain(newer.queue)]
    assert sent == [str(older.id), str(newer.id)]
    status = dict(Job.objects.values_list("id", "status"))
    assert status[older.id] == status[newer.id] == "queued"
    assert {job.id: job_events(job.id) for job in [newer, older, *others]} == trails


def test_run_dispatcher_republishes_the_queued_jobs_only_when_asked(broker, settings):
    settings.JOBOPS_DB_ALLOW_PRIVILEGED = True  # the test database's role owns everything
    job = job_in_state("queued")
    call_command("run_dispatcher", "--once", stdout=io.StringIO())
    assert drain(job.queue) == []
    call_command("run_dispatcher", "--once", "--republish-queued", stdout=io.StringIO())
    assert [message.headers["job_id"] for message in drain(job.queue)] == [str(job.id)]


def test_beside_a_publisher_the_dispatcher_takes_only_what_the_publisher_left(
    broker, settings, monkeypatch
):
    """`--role maintain` publishes pending jobs the publisher has not taken within
    OVERDUE_SECONDS, and due retries; a fresh job is the publisher's next batch."""
    from jobs.processes.dispatcher import OVERDUE_PUBLISH, role_steps
    from jobs.services import publishing

    # A minute, not the real second: on a loaded machine the fresh job must not age past
    # it between its creation and the step.
    monkeypatch.setattr(publishing, "OVERDUE_SECONDS", 60.0)
    settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS = 0
    fresh = make_job()
    left = make_job()
    backdate(left, created_at=61)
    due = job_in_state("retrying", retry_in=0)
    assert publishing.publish_overdue_once() == 2
    status = dict(Job.objects.values_list("id", "status"))
    assert status[left.id] == "queued" and status[due.id] == "queued"
    assert status[fresh.id] == "pending"
    assert ("publish", OVERDUE_PUBLISH) in role_steps("maintain")
    assert [name for name, _ in role_steps("maintain")] == [
        name for name, _ in settings.JOBOPS_DISPATCHER_STEPS
    ]
    assert role_steps("all") == list(settings.JOBOPS_DISPATCHER_STEPS)


def test_a_notify_publishes_the_new_jobs_and_leaves_due_retries_to_the_loop(broker, settings):
    from jobs.services.publishing import publish_pending_once

    settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS = 0
    new = make_job()
    due = job_in_state("retrying", retry_in=0)
    assert publish_pending_once() == 1
    status = dict(Job.objects.values_list("id", "status"))
    assert status[new.id] == "queued" and status[due.id] == "retrying"
    assert publish_due_once() == 1  # the loop's step takes the retry
    assert Job.objects.get(id=due.id).status == "queued"


def test_unroutable_publish_is_an_error_and_the_job_stays_pending(broker, settings):
    job = make_job(job_type="erp", params={"event": "x"})
    with Connection(connection_url := settings.BROKER_URL) as conn:
        channel = conn.channel()
        channel.queue_unbind("erp", JOBS_EXCHANGE.name, "erp")
    try:
        with pytest.raises(Exception, match=r"NO_ROUTE|312|route"):
            job_publish(job_id=job.id)
    finally:
        with Connection(connection_url) as conn:
            conn.channel().queue_bind("erp", JOBS_EXCHANGE.name, "erp")
    assert Job.objects.get(id=job.id).status == "pending"


def test_a_failing_step_is_reported_and_the_loop_goes_on():
    report = dispatch_once(
        steps=[("bad", "no.such.module.step"), ("reap", "jobs.services.reaper.reap_once")]
    )
    assert "error" in report["bad"]
    assert report["reap"] == {"reclaimed": 0, "worker_lost": 0}


CALLS: dict[str, list[float]] = {"busy": [], "idle": []}


def busy_step() -> int:
    CALLS["busy"].append(time.monotonic())
    return 3


def idle_step() -> dict[str, int]:
    CALLS["idle"].append(time.monotonic())
    return {"reclaimed": 0}


def test_each_step_keeps_its_own_clock(settings):
    """A step that found work runs again after the busy gap; one that found none waits
    for the interval, however busy the others are (a steady relay must not make the
    reaper, checkpoints and watcher run twenty times a second).

    Judged on the loop's own evidence (when each step ran), not on a sleep: the loop
    runs until the idle step has run three times, then every idle gap is at least the
    interval while the busy step ran many times within it."""
    settings.JOBOPS_DISPATCHER_STEPS = [
        ("busy", f"{__name__}.busy_step"),
        ("idle", f"{__name__}.idle_step"),
    ]
    for calls in CALLS.values():
        calls.clear()
    stop = threading.Event()
    loop = threading.Thread(
        target=dispatch_forever, kwargs={"interval": 0.5, "stop": stop, "role": "maintain"}
    )
    loop.start()
    try:
        wait_for(lambda: len(CALLS["idle"]) >= 3, what="the idle step's third pass")
    finally:
        stop.set()
        loop.join(timeout=5)
    assert not loop.is_alive()
    idle = CALLS["idle"][:3]
    assert all(later - earlier >= 0.5 for earlier, later in pairwise(idle)), idle
    busy_within = [t for t in CALLS["busy"] if idle[0] <= t <= idle[2]]
    # Every 0.05 s: about 20 passes in the (at least) 1 s between the idle step's first
    # and third runs; at the interval's pace it would be 3.
    assert len(busy_within) >= 8, len(busy_within)
    # Stopped cleanly, it no longer counts as a live dispatcher (other tests see none).
    assert os.getpid() not in [p["pid"] for p in live_processes().get("dispatcher", [])]


PASSES: list[float] = []


def counted_pass() -> int:
    PASSES.append(time.monotonic())
    return 1


def test_notified_publishing_answers_at_once_then_batches_for_the_gap(monkeypatch):
    """The first notification after a quiet spell is published at once; those that
    follow within PUBLISH_GAP_SECONDS wait for one pass at the gap's end."""
    import psycopg

    from jobs.processes import dispatcher
    from jobs.queries import PENDING_CHANNEL

    monkeypatch.setattr(dispatcher, "PUBLISH_STEPS", [("publish", f"{__name__}.counted_pass")])
    monkeypatch.setattr(dispatcher, "PUBLISH_GAP_SECONDS", 0.3)
    PASSES.clear()
    on_notify = dispatcher.NotifiedPublishing()
    stop = threading.Event()
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as sender:
        assert on_notify.listener._connect() is not None

        def notified_then_published() -> float:
            sender.execute(f"NOTIFY {PENDING_CHANNEL}")
            sent = time.monotonic()
            while not PASSES or PASSES[-1] < sent:
                on_notify.wait(until=time.monotonic() + 2, stop=stop)
                on_notify.publish()
            return PASSES[-1] - sent

        try:
            assert notified_then_published() < 0.1  # at once
            assert 0.2 < notified_then_published() < 0.5  # at the end of the gap
            # A quiet spell: longer than the gap since the last pass (its end measured
            # from that pass, the evidence, rather than slept for a guessed while).
            quiet_until = PASSES[-1] + 0.4
            wait_for(lambda: time.monotonic() >= quiet_until, what="a quiet spell", interval=0.01)
            assert notified_then_published() < 0.1  # a quiet spell: at once again
        finally:
            on_notify.listener.close()
    assert len(PASSES) == 3


def test_a_step_found_work_when_it_counted_something():
    assert found_work(2) and found_work({"reclaimed": 1, "worker_lost": 0})
    assert not found_work(0) and not found_work({"reclaimed": 0}) and not found_work({})
    assert not found_work(None) and not found_work(True) and not found_work({"error": "x"})


@pytest.fixture
def no_backoff():
    from jobs.services import publishing

    publishing._backoff.clear()
    yield publishing._backoff
    publishing._backoff.clear()


def test_one_unpublishable_job_does_not_block_the_ones_behind_it(broker, settings, no_backoff):
    settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS = 60
    stuck = _old(make_job(job_type="erp", params={"event": "x"}))  # the oldest: first in line
    behind = [_old(make_job()) for _ in range(3)]
    with Connection(url := settings.BROKER_URL) as conn:
        conn.channel().queue_unbind("erp", JOBS_EXCHANGE.name, "erp")
    try:
        assert publish_due_once() == 3
        assert publish_due_once() == 0  # the stuck one waits out its backoff
    finally:
        with Connection(url) as conn:
            conn.channel().queue_bind("erp", JOBS_EXCHANGE.name, "erp")
    status = dict(Job.objects.values_list("id", "status"))
    assert [status[j.id] for j in behind] == ["queued"] * 3
    assert status[stuck.id] == "pending" and str(stuck.id) in no_backoff
    no_backoff.clear()  # its backoff over, it goes once the route is back
    assert publish_due_once() == 1
    assert Job.objects.get(id=stuck.id).status == "queued"


def test_a_job_of_a_removed_type_is_dead_lettered_not_retried_forever(broker, settings, no_backoff):
    settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS = 60
    gone = _old(make_job())
    sql("UPDATE jobs SET type = 'retired' WHERE id = %s", gone.id)
    after = _old(make_job())
    assert publish_due_once() == 1
    row = Job.objects.get(id=gone.id)
    assert (row.status, row.last_error_code) == ("failed", "TYPE_UNKNOWN")
    dead = DeadLetter.objects.get(job_id=gone.id)
    assert (dead.state, dead.error_code) == ("open", "TYPE_UNKNOWN")
    assert Job.objects.get(id=after.id).status == "queued"


def test_the_retry_pass_runs_when_the_pending_pass_fails(
    broker, settings, no_backoff, json_log_lines
):
    settings.JOBOPS_DISPATCH_PENDING_AFTER_SECONDS = 60
    # A pending job of a retired type that already has an open dead letter (e.g. the
    # watcher recorded one): failing it is refused by the one-open-row index, which
    # ends the pending pass.
    stuck = _old(make_job())
    sql("UPDATE jobs SET type = 'retired' WHERE id = %s", stuck.id)
    DeadLetter.objects.create(job=stuck, queue="sim_dlq", reason="rejected")
    due = job_in_state("retrying", retry_in=0)

    assert publish_due_once() == 1

    assert Job.objects.get(id=due.id).status == "queued"
    failed = [
        line for line in json_log_lines() if line["event"] == "dispatcher_publish_pass_failed"
    ]
    assert [line["status"] for line in failed] == ["pending"]
    assert Job.objects.get(id=stuck.id).status == "pending"


def test_reaper_skips_a_lost_job_that_has_an_open_dead_letter_and_fails_the_others(
    json_log_lines,
):
    # Both stale on their last attempt; one already has an open dead letter (e.g. the
    # watcher recorded one). Failing that one is refused by the one-open-row index: its
    # whole failure rolls back and the pass goes on with the other.
    held, other = stale_running(), stale_running()
    sql("UPDATE jobs SET max_attempts = 1 WHERE id IN (%s, %s)", held.id, other.id)
    DeadLetter.objects.create(job=held, queue="sim_dlq", reason="rejected")

    assert reap_once() == {"reclaimed": 0, "worker_lost": 1}

    assert Job.objects.get(id=held.id).status == "running"
    assert job_events(held.id)[-1] == "started"
    assert DeadLetter.objects.filter(job_id=held.id).count() == 1
    assert Job.objects.get(id=other.id).status == "failed"
    exists = [line for line in json_log_lines() if line["event"] == "reaper_dead_letter_exists"]
    assert [line["job_id"] for line in exists] == [str(held.id)]


@pytest.mark.django_db(transaction=True)
def test_reaper_leaves_a_lost_job_alone_when_its_heartbeat_lands_first():
    """The reaper has read the lock as stale; the worker's heartbeat commits before the
    reaper's compare-and-set: the job stays with its worker, no dead letter."""
    job = stale_running()
    sql("UPDATE jobs SET max_attempts = 1 WHERE id = %s", job.id)
    counts: list[dict[str, int]] = []

    def reap() -> None:
        try:
            counts.append(reap_once())
        finally:
            connection.close()  # this thread's own connection

    reaper = threading.Thread(target=reap)
    with transaction.atomic():
        job_heartbeat(job_id=job.id, fence=fence_of(job))  # holds the row until commit
        reaper.start()
        # The reaper's compare-and-set waits for our row lock: it read the lock stale.
        wait_for(_waits_on_a_lock, what="the reaper to wait for the job's row")
    reaper.join(timeout=20)

    assert counts == [{"reclaimed": 0, "worker_lost": 0}]
    row = Job.objects.get(id=job.id)
    assert (row.status, row.locked_by) == ("running", job.locked_by)
    assert not DeadLetter.objects.filter(job_id=job.id).exists()


def _waits_on_a_lock() -> bool:
    """Whether another session of this database waits for a lock (the database's own
    view of its sessions)."""
    with connection.cursor() as cursor:
        # Inside a transaction the statistics views keep their first snapshot.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] > 0


def test_one_wake_up_answers_a_burst_of_notifications():
    """A burst (three notifications of one commit: PostgreSQL sends them to the
    listener together) wakes the loop once. The negative half is checked on evidence,
    not after a sleep: a marker notified afterwards must be the very next one the
    listener reads, so none of the burst was left behind for a second wake-up."""
    listener, stop = PendingListener(), threading.Event()
    params = connection.get_connection_params()

    def burst() -> None:
        with sender.transaction():
            for n in range(3):
                sender.execute(f"NOTIFY {PENDING_CHANNEL}, 'burst-{n}'")

    def next_is_the_marker() -> None:
        sender.execute(f"NOTIFY {PENDING_CHANNEL}, 'marker'")
        conn = listener._connect()
        assert conn is not None
        read = [n.payload for n in conn.notifies(timeout=5, stop_after=1)]
        assert read == ["marker"]

    with psycopg.connect(**params, autocommit=True) as sender:
        try:
            assert not listener.notified()  # connects and LISTENs; nothing yet
            burst()
            assert listener.wait(until=time.monotonic() + 5, stop=stop)
            assert not listener.notified()  # the one wake-up took all three
            next_is_the_marker()

            burst()
            wait_for(listener.notified, what="the second burst")
            assert not listener.notified()
            next_is_the_marker()
        finally:
            listener.close()


def test_without_a_database_to_listen_on_the_loop_falls_back_to_its_interval(
    monkeypatch, json_log_lines
):
    listener, stop = PendingListener(), threading.Event()
    # The listener's own connection goes to an address that refuses it; the loop's
    # steps (Django's connection, already open) are not concerned.
    monkeypatch.setitem(connection.settings_dict, "PORT", free_port())
    started = time.monotonic()
    assert not listener.wait(until=started + 0.6, stop=stop)  # the interval, no error
    assert time.monotonic() - started >= 0.6
    assert not listener.notified()
    failed = [line for line in json_log_lines() if line["event"] == "dispatcher_listen_failed"]
    assert failed, "the refused LISTEN is logged"

    monkeypatch.undo()  # the database is back: the next look listens again
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as sender:
        try:
            assert not listener.notified()
            sender.execute(f"NOTIFY {PENDING_CHANNEL}")
            assert listener.wait(until=time.monotonic() + 5, stop=stop)
        finally:
            listener.close()


def test_a_listener_whose_connection_is_cut_listens_again(json_log_lines):
    listener, stop = PendingListener(), threading.Event()

    def cut() -> None:
        # As a database restart or a failover does to every session; returns once the
        # session is gone (pg_terminate_backend gives up waiting after its timeout on a
        # loaded machine, so the test waits on the session itself).
        assert listener.connection is not None
        pid = listener.connection.info.backend_pid
        sql("SELECT pg_terminate_backend(%s, 5000)", pid)
        wait_for(lambda: not _backend_alive(pid), what=f"backend {pid} gone")

    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as sender:
        try:
            assert not listener.notified()
            cut()
            assert not listener.notified()  # the cut is seen, not raised
            assert not listener.notified()  # listening again
            sender.execute(f"NOTIFY {PENDING_CHANNEL}")
            assert listener.wait(until=time.monotonic() + 5, stop=stop)

            cut()
            # A wait across the cut listens again and goes on waiting until `until`.
            assert not listener.wait(until=time.monotonic() + 1, stop=stop)
            sender.execute(f"NOTIFY {PENDING_CHANNEL}")
            assert listener.wait(until=time.monotonic() + 5, stop=stop)
        finally:
            listener.close()
    failed = [line for line in json_log_lines() if line["event"] == "dispatcher_listen_failed"]
    assert len(failed) == 2


def _metric(client, name: str, **labels: str) -> float:
    """A sample of the page Prometheus scrapes (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    page = client.get("/metrics")
    assert page.status_code == 200
    for family in text_string_to_metric_families(page.content.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


@pytest.fixture
def clean_step_failures():
    from jobs.processes.step_failures import step_failures_forget

    step_failures_forget()
    yield
    step_failures_forget()


def test_a_failing_step_moves_its_counter_and_shows_on_the_dashboard(
    client, settings, clean_step_failures
):
    """The next table that names a job without purge knowing of it (issue 37, H1): the
    purge step fails on every pass. The failure is counted, shown at the top of the
    dashboard and on its Last purge tile, and forgotten once the step succeeds again."""
    from django.test import Client

    from config.dashboard import dashboard_overview
    from jobs.services.purge import purge_forget_clock
    from tests.factories import otp_login, role_user

    settings.METRICS_TOKEN = ""
    settings.JOB_TYPES = {
        name: {**spec, "retention": timedelta(minutes=1)}
        for name, spec in settings.JOB_TYPES.items()
    }
    job = job_in_state("succeeded")
    backdate(job, created_at=120, updated_at=120)
    # A foreign key purge does not name (not deferred: it fails at the DELETE, inside
    # this test's transaction, which rolls the table back).
    sql("CREATE TABLE probe_invoices (id serial PRIMARY KEY, job_id uuid REFERENCES jobs(id))")
    sql("INSERT INTO probe_invoices (job_id) VALUES (%s)", job.id)
    purge = [("purge", "jobs.services.purge.purge_once")]
    labels = {"step": "purge"}
    before = _metric(client, "dispatcher_step_failures_total", **labels)

    for _ in range(2):
        purge_forget_clock()
        report = dispatch_once(steps=purge)
        assert "IntegrityError" in report["purge"]["error"], report

    assert _metric(client, "dispatcher_step_failures_total", **labels) == before + 2
    assert _metric(client, "dispatcher_step_failing", step="purge", error="IntegrityError") == 1
    assert _metric(client, "dispatcher_step_last_failure_timestamp_seconds", **labels) > (
        time.time() - 60
    )
    overview = dashboard_overview(use_cache=False)
    named = [p for p in overview["problems"] if "Dispatcher step purge" in p]
    assert len(named) == 1 and "IntegrityError" in named[0] and "probe_invoices" in named[0]
    assert "2 times" in named[0], named
    page = otp_login(Client(), role_user("operator")).get("/admin/")
    html = page.content.decode()
    assert "Dispatcher step purge" in html and "IntegrityError" in html
    # The Last purge tile does not say "never" as if all were well.
    failing = html[html.index('id="purge-failing"') :]
    assert failing[: failing.index("</div>")].count("IntegrityError") == 1

    sql("DELETE FROM probe_invoices")
    purge_forget_clock()
    assert dispatch_once(steps=purge)["purge"]["jobs"] == {"planning": 1}
    assert _metric(client, "dispatcher_step_failures_total", **labels) == before + 2
    assert _metric(client, "dispatcher_step_failing", step="purge", error="IntegrityError") == 0
    overview = dashboard_overview(use_cache=False)
    assert not [p for p in overview["problems"] if "Dispatcher step" in p]


@pytest.mark.django_db(transaction=True)
def test_a_dispatcher_process_exports_its_failing_step_and_the_web_names_it(
    clean_step_failures,
):
    """Across processes, as deployed: the dispatcher's exporter counts the failure, the
    dashboard (this process) reads the dispatcher's entry, and both clear once the step
    succeeds again."""
    from config.dashboard import dashboard_overview
    from tests.processes import dispatcher_process

    # An erp job (notification: kept 7 days) that ended 8 days ago, named by a row of a
    # table purge does not know.
    job = job_in_state("cancelled", job_type="erp", params={"event": "order.created"})
    backdate(job, created_at=8 * 86400, updated_at=8 * 86400)
    sql("CREATE TABLE probe_invoices (id serial PRIMARY KEY, job_id uuid REFERENCES jobs(id))")
    sql("INSERT INTO probe_invoices (job_id) VALUES (%s)", job.id)

    def purge_named() -> list[str]:
        problems = dashboard_overview(use_cache=False)["problems"]
        return [p for p in problems if p.startswith("Dispatcher step purge ")]

    try:
        with dispatcher_process(interval=0.2) as dispatcher:
            wait_for(
                lambda: dispatcher.metric("dispatcher_step_failures_total", step="purge") >= 2,
                timeout=20,
            )
            failing = {"step": "purge", "error": "IntegrityError"}
            assert dispatcher.metric("dispatcher_step_failing", **failing) == 1
            named = wait_for(purge_named, timeout=10)
            assert "IntegrityError" in named[0] and "probe_invoices" in named[0], named

            sql("DELETE FROM probe_invoices")
            wait_for(lambda: not Job.objects.filter(id=job.id).exists(), timeout=20)
            wait_for(lambda: not purge_named(), timeout=10)
            assert dispatcher.metric("dispatcher_step_failing", **failing) == 0
    finally:
        sql("DROP TABLE IF EXISTS probe_invoices")
