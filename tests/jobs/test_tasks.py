"""The Celery app is built from the one types table and the one topology module."""

from __future__ import annotations

from config.celery import app, prefetch_problems
from jobs.domain.types import all_types
from jobs.integrations.topology import job_queues
from jobs.tasks import TASKS


def test_every_type_has_a_task_routed_to_its_queue_on_jobs_direct():
    for spec in all_types().values():
        assert spec.task_name in TASKS and spec.task_name in app.tasks
        route = app.conf.task_routes[spec.task_name]
        assert route == {"queue": spec.queue, "exchange": "jobs.direct", "routing_key": spec.queue}
        limits = app.conf.task_annotations[spec.task_name]
        assert (limits["soft_time_limit"], limits["time_limit"]) == (
            spec.soft_time_limit,
            spec.time_limit,
        )


def test_celery_queues_are_the_topology_declarations():
    declared = {q.name: (q.queue_arguments, q.routing_key, q.exchange.name) for q in job_queues()}
    celery = {
        q.name: (q.queue_arguments, q.routing_key, q.exchange.name) for q in app.conf.task_queues
    }
    assert celery == declared
    assert app.conf.task_create_missing_queues is False


def test_failures_are_not_acked_and_messages_survive_worker_loss():
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.task_acks_on_failure_or_timeout is False
    assert conf.broker_transport_options["confirm_publish"] is True
    assert "DelayedDelivery" not in str(app.conf.worker_consumer)


def test_prefetch_guard_refuses_multiplier_three_on_long_queues_only():
    assert prefetch_problems(multiplier=1, queues=["sim", "model"], consumer_timeout=1800) == []
    assert prefetch_problems(multiplier=3, queues=["default", "erp"], consumer_timeout=1800) == []
    problems = prefetch_problems(multiplier=3, queues=["sim"], consumer_timeout=1800)
    assert len(problems) == 1 and "sim" in problems[0]
