"""A broker node dies mid-drain (docs/operations/scaling.md#a-rabbitmq-cluster).

A three-node RabbitMQ cluster on this machine (deploy/rabbitmq-cluster.sh, beside the
usual node), the topology declared on it with every quorum queue (primaries, DLQs,
dlq.watch) replicated on all three, two workers and a dispatcher given the list of the
three nodes. 5,000 jobs drain through `tests.handlers.scripted` (`count`: one HINCRBY
per run, keyed by job id); when a third have succeeded, the node that leads the
`default` queue is killed with kill -9. Within the time cap every job has succeeded
exactly once: one `succeeded` transition and one run each. A message redelivered after
the node loss (its ack went down with the node) meets a job already `succeeded`, or
`running` under a live lock: the claim refuses it and the handler does not run again.

Heavy (`make test-heavy`, .ci/run): the cluster alone takes a minute or two to start.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter

import pytest
from django.db.models import Count

from audit.models import AuditLog
from jobs.integrations.liveness import live_processes
from jobs.models import Job
from jobs.services import job_create
from tests.factories import UserFactory
from tests.handlers import redis_client
from tests.polling import wait_for
from tests.processes import (
    ROOT,
    celery_worker,
    dispatcher_process,
    run_manage,
    scripted_env,
    scripted_table,
    subprocess_env,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

CLUSTER = ROOT / "deploy" / "rabbitmq-cluster.sh"
VHOST = "jobops_node_loss"
JOBS = 5_000
CAP_SECONDS = 600  # the drain, from the first job created to the last one succeeded


def cluster(*args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(CLUSTER), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"rabbitmq-cluster.sh {' '.join(args)}:\n{done.stderr}"
    return done.stdout.strip()


@pytest.fixture(scope="module")
def cluster_urls():
    """The cluster, started (idempotent) with a vhost of the test's own; stopped and its
    data removed afterwards."""
    try:
        cluster("start")
        cluster("ctl", "add_vhost", VHOST)
        cluster("ctl", "set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*")
        yield cluster("urls", VHOST)
    finally:
        cluster("stop", timeout=120)


def _port(node_address: str | None) -> int | None:
    return int(node_address.rsplit(":", 1)[1]) if node_address else None


@pytest.mark.timeout(CAP_SECONDS + 300)
def test_a_killed_broker_node_loses_no_job_and_runs_none_twice(settings, cluster_urls):
    env = {
        **scripted_env(),
        "BROKER_URL": cluster_urls,
        "JOBOPS_QUORUM_GROUP_SIZE": "3",
        # Production lock timings: a heartbeat late on this busy machine must not let
        # the reaper reclaim a running job (that would be a second run by design).
        "JOBOPS_LOCK_TIMEOUT": "60",
        "JOBOPS_HEARTBEAT_SECONDS": "10",
        "JOBOPS_PROCESS_HEARTBEAT_SECONDS": "1",
    }
    settings.BROKER_URL = cluster_urls
    settings.JOBOPS_QUORUM_GROUP_SIZE = 3
    scripted_table(settings)
    declared = run_manage("setup_topology", env=subprocess_env(**env), timeout=120)
    assert declared.returncode == 0, declared.stdout + declared.stderr
    leader = cluster("leader", "default", VHOST)
    assert leader.startswith("jobops"), leader
    leader_port = {f"jobops{n}@localhost": 5780 + n for n in (1, 2, 3)}[leader]

    counter = f"jobops-test:node-loss:{uuid.uuid4().hex}"
    owner = UserFactory()
    started = time.monotonic()
    # All created first (pending): the dispatcher publishes them as the broker window
    # allows, so the kill meets publishing and consuming alike.
    ids = [
        job_create(owner=owner, job_type="ai", params={"do": "count", "counter": counter})[0].id
        for _ in range(JOBS)
    ]
    created = time.monotonic() - started
    workers = dict(queues=["default"], concurrency=4, prefetch_multiplier=3, env=env)
    with (
        dispatcher_process(interval=0.2, env=env, name="loss-dispatcher") as dispatcher,
        celery_worker(name="loss-w1", **workers) as w1,
        celery_worker(name="loss-w2", **workers) as w2,
    ):

        def succeeded() -> int:
            return Job.objects.filter(id__in=ids, status="succeeded").count()

        wait_for(lambda: succeeded() >= JOBS // 3, timeout=CAP_SECONDS, interval=0.5,
                 what=f"a third of {JOBS} jobs to succeed")  # fmt: skip
        at_kill = succeeded()
        killed = cluster("kill", leader)
        killed_at = time.monotonic()

        remaining = CAP_SECONDS - (time.monotonic() - started)
        try:
            wait_for(lambda: succeeded() == JOBS, timeout=remaining, interval=1,
                     what=f"all {JOBS} jobs to succeed after {killed}")  # fmt: skip
        except AssertionError as exc:
            statuses = Counter(Job.objects.filter(id__in=ids).values_list("status", flat=True))
            logs = "\n".join(p.log_text()[-2000:] for p in (dispatcher, w1, w2))
            raise AssertionError(f"{exc}; statuses {dict(statuses)}\n{logs}") from None
        drained = time.monotonic() - started

        # Every worker and the dispatcher now talk to a surviving node.
        def on_survivors() -> bool:
            found = [p for kind in live_processes().values() for p in kind]
            return len(found) >= 3 and all(
                _port(p["broker"]) not in (None, leader_port) for p in found
            )

        try:
            wait_for(on_survivors, timeout=30, what="every process on a surviving node")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {live_processes()} (killed: {leader})") from None
        for process in (dispatcher, w1, w2):
            assert process.alive(), process.log_text()[-3000:]

    runs = {job_id: int(n) for job_id, n in redis_client().hgetall(counter).items()}
    redis_client().delete(counter)
    twice = {job_id: n for job_id, n in runs.items() if n != 1}
    assert not twice, f"jobs whose handler ran more than once: {twice}"
    assert set(runs) == {str(i) for i in ids}  # and every one ran
    transitions = (
        AuditLog.objects.filter(job_id__in=ids, event_type="succeeded")
        .values("job_id")
        .annotate(n=Count("id"))
    )
    assert sorted({row["n"] for row in transitions}) == [1]
    assert len(transitions) == JOBS
    print(  # the figures for the report: pytest -s shows them
        f"\nnode loss: {JOBS} jobs created in {created:.1f} s, {at_kill} done when "
        f"{killed}; drained in {drained:.1f} s ({drained - (killed_at - started):.1f} s "
        "after the kill)"
    )
