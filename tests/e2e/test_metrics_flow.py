"""Every job metric moves by the right amount, read as Prometheus reads it.

A real worker group exports its pool children's values through PROMETHEUS_MULTIPROC_DIR
on JOBOPS_METRICS_PORT; the web process (this test process) serves its own /metrics.
Jobs go through success, a retry, a dead letter, a replay and two cancellations, and
creates are refused by the rate limits: each outcome counter shows the right value.
"""

from __future__ import annotations

import urllib.request

import pytest
from django.db import transaction
from prometheus_client.parser import text_string_to_metric_families

from audit.services import Actor
from dlq.services.replay import dead_letters_replay
from jobs.integrations.backpressure import queue_depths_forget
from jobs.integrations.redis_client import redis_client, redis_key
from jobs.models import DeadLetter, Job
from jobs.services import job_cancel
from tests.factories import OperatorFactory, UserFactory, client_for, make_job
from tests.polling import wait_for
from tests.processes import (
    FAST_ENV,
    celery_worker,
    dispatcher_process,
    free_port,
    job_finished,
    scripted_env,
    scripted_table,
)
from tests.queues import topology_declare_and_purge

pytestmark = pytest.mark.django_db(transaction=True)
NO_RETRIES_FOR_MODEL = {"model": {"max_retries": 0}}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    """The sample of exactly these labels; with `*` as a label's value, the sum over it."""
    if "*" not in labels.values():
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)
    wanted = {k: v for k, v in labels.items() if v != "*"}
    return sum(
        value
        for (sample, found), value in samples.items()
        if sample == name
        and wanted.items() <= dict(found).items()
        and set(dict(found)) == set(labels)
    )


def _scrape_web(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    return _samples(response.content.decode())


def _scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return _samples(response.read().decode())


def test_job_metrics_move_in_web_and_workers(client, settings, tmp_path):
    settings.METRICS_TOKEN = ""
    scripted_table(settings, **NO_RETRIES_FOR_MODEL)
    settings.JOBOPS_LOCK_TIMEOUT = int(FAST_ENV["JOBOPS_LOCK_TIMEOUT"])
    port, dispatcher_port = free_port(), free_port()
    env = {
        **scripted_env(**NO_RETRIES_FOR_MODEL),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "JOBOPS_METRICS_PORT": str(port),
    }
    topology_declare_and_purge()
    # One create each, the global allowance for two: fresh buckets.
    settings.JOBOPS_RATE_LIMITS = {
        **settings.JOBOPS_RATE_LIMITS,
        "create_per_user": 1,
        "create_global": 2,
    }
    web_before = _scrape_web(client)
    with (
        celery_worker(queues=["default", "model"], concurrency=2, env=env, name="metrics"),
        dispatcher_process(
            interval=0.2,
            env={
                **scripted_env(**NO_RETRIES_FOR_MODEL),
                "JOBOPS_METRICS_PORT": str(dispatcher_port),
            },
        ),
    ):
        worker_before = _scrape(port)
        dispatcher_before = _scrape(dispatcher_port)
        ok = make_job(job_type="ai", params={"do": "steps", "steps": 3, "step_seconds": 0.4})
        retried = make_job(job_type="ai", params={"do": "fail_times", "n": 1})
        fatal = make_job(job_type="model", params={"do": "nonretryable"})
        running = make_job(job_type="ai", params={"do": "steps", "steps": 100})
        with transaction.atomic():  # cancelled before anyone could publish it
            pending = make_job(job_type="ai", params={"do": "noop"})
            job_cancel(job_id=pending.id, actor=Actor.system("test"))
        wait_for(lambda: Job.objects.get(id=running.id).progress_percent > 0, timeout=30)
        job_cancel(job_id=running.id, actor=Actor.system("test"))
        for job in (ok, retried, running):
            job_finished(job.id, timeout=30)
        wait_for(lambda: DeadLetter.objects.filter(job_id=fatal.id).exists(), timeout=30)
        replay = dead_letters_replay(
            actor_user=OperatorFactory(), justification="metrics test", job_ids=[fatal.id]
        )
        assert len(replay.resolved) == 1
        wait_for(
            lambda: DeadLetter.objects.filter(job_id=fatal.id, state="open").exists(), timeout=30
        )
        statuses = {j.id: Job.objects.get(id=j.id).status for j in (ok, retried, running)}
        assert list(statuses.values()) == ["succeeded", "succeeded", "cancelled"]
        worker_after = wait_for(
            lambda: (s := _scrape(port))
            and _value(s, "job_duration_seconds_count", type="model", status="*")
            == 2 + _value(worker_before, "job_duration_seconds_count", type="model", status="*")
            and s,
            timeout=10,
        )
        # The dispatcher's own exporter: it relayed the jobs' events meanwhile.
        dispatcher_after = _scrape(dispatcher_port)
    # Refused creates, the dispatcher stopped (it would refresh the depth cache): a
    # queue deeper than its limit, the same user past their allowance, then a third
    # user once two have spent everyone's.
    settings.JOBOPS_QUEUE_DEPTH_LIMITS = {**settings.JOBOPS_QUEUE_DEPTH_LIMITS, "sim": 0}
    redis_client().set(redis_key("queue-depth", "sim"), 1, ex=60)
    queue_depths_forget()
    first, second, third = (client_for(UserFactory()) for _ in range(3))
    # Fresh buckets: an earlier run's users had these ids too.
    redis_client().delete(*redis_client().scan_iter(redis_key("ratelimit", "*")), "absent")
    sim = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}
    refused = first.post("/api/v1/jobs", sim, format="json")
    assert refused.json()["error"]["code"] == "ERR-JOB-BACKPRESSURE"
    assert first.post("/api/v1/jobs", sim, format="json").status_code == 429  # user
    assert second.post("/api/v1/jobs", {"type": "nope"}, format="json").status_code == 400
    assert third.post("/api/v1/jobs", sim, format="json").status_code == 429  # global
    queue_depths_forget()
    web_after = _scrape_web(client)
    relayed = _value(dispatcher_after, "outbox_relayed_total") - _value(
        dispatcher_before, "outbox_relayed_total"
    )
    assert relayed >= 5  # at least each job's `created` event

    def web(name: str, **labels: str) -> float:
        return _value(web_after, name, **labels) - _value(web_before, name, **labels)

    def worker(name: str, **labels: str) -> float:
        return _value(worker_after, name, **labels) - _value(worker_before, name, **labels)

    # Web (this process): creations, the cancel of a job that never ran, the replay.
    assert web("job_create_total", type="ai", status="created") == 4
    assert web("job_create_total", type="model", status="created") == 1
    assert web("cancellation_total") == 1
    assert web("dlq_replay_total") == 1
    assert web("rate_limited_total", scope="user") == 1
    assert web("rate_limited_total", scope="global") == 1
    assert web("rate_limited_total", scope="backpressure") == 1
    assert web("rate_limited_total", scope="organisation") == 0
    # The job cancelled before it ran ended in the web process, after no attempt.
    assert web("job_attempts_count", type="ai") == 1 and web("job_attempts_sum", type="ai") == 0
    # django-prometheus' database backend: the statements of each process.
    assert web("django_db_execute_total", alias="default", vendor="postgresql") > 0
    # Workers: every attempt timed by how it ended, the retry by its code, the confirmed
    # cancel, progress.
    assert worker("job_duration_seconds_count", type="ai", status="succeeded") == 2
    assert worker("job_duration_seconds_count", type="ai", status="retrying") == 1
    assert worker("job_duration_seconds_count", type="ai", status="cancelled") == 1
    assert worker("job_duration_seconds_count", type="model", status="failed") == 2
    assert worker("job_duration_seconds_bucket", type="ai", status="*", le="+Inf") == 4
    assert worker("job_duration_seconds_sum", type="ai", status="succeeded") >= 1.2  # 3 x 0.4 s
    assert worker("retries_total", type="ai", error_code="PLANNED") == 1
    assert worker("cancellation_total") == 1
    assert worker("progress_update_total") >= 2  # ok's and running's coalesced writes
    assert _value(worker_after, "job_in_progress", type="ai") == 0
    # Outcomes: ok and retried succeeded; the model job failed twice (before and after
    # its replay), each time with a dead letter.
    ai, model = {"job_type": "ai", "queue": "default"}, {"job_type": "model", "queue": "model"}
    assert worker("jobs_succeeded_total", type="ai", **ai) == 2
    failed = {"type": "model", "error_code": "PLANNED_INVALID", **model}
    assert worker("jobs_failed_total", error_class="nonretryable", **failed) == 1 + 1
    anything = {"error_code": "*", "job_type": "*", "queue": "*", "error_class": "*"}
    assert worker("jobs_failed_total", type="ai", **anything) == 0
    assert worker("jobs_dead_lettered_total", type="model", reason="nonretryable") == 2
    assert worker("deadletter_total", **model) == 2
    # The async jobs names, from the web and the workers' pool children alike: every
    # creation, every attempt started and timed (not the job cancelled before it ran).
    assert web("jobs_enqueued_total", **ai) == 4 and web("jobs_enqueued_total", **model) == 1
    assert worker("jobs_started_total", **ai) == 4 and worker("jobs_started_total", **model) == 2
    assert worker("jobs_duration_seconds_count", **ai) == 4
    assert worker("jobs_duration_seconds_count", **model) == 2
    assert (worker("jobs_attempts_count", **ai), worker("jobs_attempts_sum", **ai)) == (3, 4)
    assert web("jobs_attempts_count", **ai) == 1 and web("jobs_attempts_sum", **ai) == 0
    assert worker("job_finished_total", type="ai", status="succeeded") == 2  # the old name
    # Attempts per finished job: ok 1, retried 2, running (cancelled) 1; model 1 then 2.
    assert (worker("job_attempts_count", type="ai"), worker("job_attempts_sum", type="ai")) == (
        3,
        4,
    )
    assert worker("job_attempts_sum", type="model") == 1 + 2
    # Queue latency at each claim: every ai attempt; the model job's first only (the
    # replayed attempt's wait is not on the row: not observed).
    assert worker("job_queue_latency_seconds_count", type="ai") == 4
    assert worker("job_queue_latency_seconds_count", type="model") == 1
    assert 0 <= worker("job_queue_latency_seconds_sum", type="ai") < 60
    db = {"alias": "default", "vendor": "postgresql"}
    assert worker("django_db_execute_total", **db) >= 2 * 6  # a claim and an end per attempt
    assert worker("django_db_query_duration_seconds_count", **db) >= 2 * 6
