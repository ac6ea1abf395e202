"""Rate limits (atomic Redis token buckets) and queue-depth backpressure (docs/api.md)."""

from __future__ import annotations

import threading
import time

import pytest
from django.conf import settings as django_settings
from kombu import Connection, Producer

from jobs.integrations import backpressure
from jobs.integrations.backpressure import queue_depth_cached, queue_depths_refresh
from jobs.integrations.ratelimit import rate_limit_take
from jobs.integrations.redis_client import redis_client, redis_key
from jobs.integrations.topology import JOBS_EXCHANGE
from tests.factories import UserFactory, client_for
from tests.metric_samples import Moved
from tests.queues import wait_depth
from tests.threads import run_in_threads

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clean_redis")]

JOBS = "/api/v1/jobs"
SIM = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}


def post(client, body=SIM, **extra):
    return client.post(JOBS, body, format="json", **extra)


# --- the bucket itself ----------------------------------------------------------------------


def test_bucket_allows_its_limit_then_refuses_with_a_wait():
    decisions = [rate_limit_take(buckets=[("t:one", 3)]) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions[:3]] == [2, 1, 0]
    refused = decisions[3]
    assert refused.retry_after >= 1  # 3/min refills one token in 20 s
    assert 15 <= refused.retry_after <= 20
    assert refused.reset >= refused.retry_after


def test_a_refusal_takes_from_no_bucket():
    assert rate_limit_take(buckets=[("t:a", 5), ("t:b", 1)]).allowed
    # b is empty: refused, and a keeps its tokens.
    assert not rate_limit_take(buckets=[("t:a", 5), ("t:b", 1)]).allowed
    assert rate_limit_take(buckets=[("t:a", 5)]).remaining == 3


def test_concurrent_takes_never_overspend_the_bucket():
    allowed, lock = [], threading.Lock()

    def take_ten(_: int) -> None:
        for _ in range(10):
            decision = rate_limit_take(buckets=[("t:race", 50)])
            with lock:
                allowed.append(decision.allowed)

    assert run_in_threads(take_ten, 20) == []
    # 200 attempts in well under a second at 50/min: 50 tokens, at most one refilled.
    assert 50 <= sum(allowed) <= 51


def test_buckets_live_under_the_configured_prefix(settings):
    rate_limit_take(buckets=[("t:prefixed", 5)])
    assert redis_client().exists(f"{settings.JOBOPS_REDIS_PREFIX}:ratelimit:t:prefixed")


# --- the API --------------------------------------------------------------------------------


def test_per_user_limit_answers_429_with_retry_after(settings, api):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 2}
    moved = Moved()
    first, second, third = post(api), post(api), post(api)
    assert (first.status_code, second.status_code, third.status_code) == (201, 201, 429)
    assert moved("rate_limited_total", scope="user") == 1
    assert moved("rate_limited_total", scope="global") == 0
    assert (first["RateLimit-Limit"], first["RateLimit-Remaining"]) == ("2", "1")
    assert third.json()["error"]["code"] == "ERR-JOB-RATE-LIMIT"
    assert int(third["Retry-After"]) >= 1
    assert third["RateLimit-Remaining"] == "0"
    # Another user has their own bucket.
    assert post(client_for(UserFactory())).status_code == 201


def test_idempotent_repeats_count_against_the_limit(settings, api):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 2}
    body = {**SIM, "idempotency_key": "k"}
    assert [post(api, body).status_code for _ in range(3)] == [201, 200, 429]


def test_invalid_requests_count_too(settings, api):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 1}
    assert post(api, {"type": "nope", "params": {}}).status_code == 400
    assert post(api).status_code == 429


def test_global_limit_applies_across_users(settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_global": 2}
    moved = Moved()
    statuses = [post(client_for(UserFactory())).status_code for _ in range(3)]
    assert statuses == [201, 201, 429]
    assert (
        moved("rate_limited_total", scope="global"),
        moved("rate_limited_total", scope="user"),
    ) == (1, 0)


def test_redis_down_does_not_refuse_job_creation(settings, api):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 1}
    assert [post(api).status_code for _ in range(2)] == [201, 201]
    assert "RateLimit-Limit" not in post(api)


# --- backpressure -------------------------------------------------------------------------


def queue_holds(queue: str, count: int) -> None:
    """Put `count` messages in `queue` (emptied first) and let backpressure read them, as
    the dispatcher's depth step does."""
    with Connection(django_settings.BROKER_URL, connect_timeout=10) as conn:
        channel = conn.channel()
        channel.queue_purge(queue)
        producer = Producer(channel, exchange=JOBS_EXCHANGE)
        for n in range(count):
            producer.publish({"n": n}, routing_key=queue)
        wait_depth(channel, queue, count)
    assert queue_depths_refresh(min_interval=0)[queue] == count


def test_a_queue_deeper_than_its_limit_answers_429_backpressure(broker, settings, api):
    settings.JOBOPS_QUEUE_DEPTH_LIMITS = {**settings.JOBOPS_QUEUE_DEPTH_LIMITS, "sim": 10}
    queue_holds("sim", 11)
    moved = Moved()
    response = post(api)
    assert response.status_code == 429
    assert moved("rate_limited_total", scope="backpressure") == 1
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-BACKPRESSURE"
    assert error["details"] == {"queue": "sim", "depth": 11, "limit": 10}
    assert int(response["Retry-After"]) >= 1
    # Other queues are not affected; at the limit is still accepted.
    assert post(api, {"type": "report", "params": {}}).status_code == 201
    queue_holds("sim", 10)
    assert post(api).status_code == 201


def test_backpressure_still_answers_a_repeat_of_an_existing_job(broker, settings, api):
    settings.JOBOPS_QUEUE_DEPTH_LIMITS = {**settings.JOBOPS_QUEUE_DEPTH_LIMITS, "sim": 10}
    body = {**SIM, "idempotency_key": "before-the-flood"}
    created = post(api, body)
    queue_holds("sim", 500)
    repeat = post(api, body)
    assert (created.status_code, repeat.status_code) == (201, 200)
    assert post(api, {**SIM, "idempotency_key": "new"}).status_code == 429


def test_a_create_costs_one_redis_call_the_rate_limiters(monkeypatch, api):
    client = redis_client()
    commands: list[str] = []
    real = client.execute_command

    def counted(*args, **options):
        commands.append(str(args[0]))
        return real(*args, **options)

    monkeypatch.setattr(client, "execute_command", counted)
    assert post(api).status_code == 201
    assert sorted(commands) == ["EVALSHA", "GET"]  # the bucket, the queue's depth
    commands.clear()
    assert post(api).status_code == 201
    assert commands == ["EVALSHA"]  # the depth read a moment ago is remembered


def test_a_depth_cached_by_another_process_counts_within_the_memo_time(monkeypatch):
    monkeypatch.setattr(backpressure, "DEPTH_MEMO_SECONDS", 0.5)
    key = redis_key("queue-depth", "sim")
    redis_client().set(key, 7, ex=60)  # the dispatcher's refresh, in its own process
    assert queue_depth_cached("sim") == 7
    redis_client().set(key, 12, ex=60)  # its next refresh
    assert queue_depth_cached("sim") == 7  # remembered
    time.sleep(0.6)
    assert queue_depth_cached("sim") == 12


def test_unknown_depth_never_refuses(settings, api):
    settings.JOBOPS_QUEUE_DEPTH_LIMITS = {**settings.JOBOPS_QUEUE_DEPTH_LIMITS, "sim": 0}
    assert queue_depth_cached("sim") is None
    assert post(api).status_code == 201
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert post(api).status_code == 201


def test_refresh_reads_depths_from_rabbitmq_into_redis(broker, settings):
    with Connection(settings.BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        channel.queue_purge("report")
        producer = Producer(channel, exchange=JOBS_EXCHANGE)
        for n in range(3):
            producer.publish({"n": n}, routing_key="report")
        try:
            depths = queue_depths_refresh(min_interval=0)
            assert depths["report"] == 3
            assert set(depths) >= {"default", "sim", "report", "erp"}
            assert queue_depth_cached("report") == 3
            ttl = redis_client().ttl(redis_key("queue-depth", "report"))
            assert 0 < ttl <= settings.JOBOPS_QUEUE_DEPTH_TTL
        finally:
            channel.queue_purge("report")


def test_refresh_reads_the_broker_at_most_every_min_interval(broker, settings):
    # Confirmed publish: the message is in the queue before the depth is read again.
    with Connection(settings.BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        channel.queue_purge("erp")
        first = queue_depths_refresh(min_interval=0)
        Producer(channel, exchange=JOBS_EXCHANGE).publish({}, routing_key="erp")
        try:
            assert queue_depths_refresh(min_interval=60) == first  # read moments ago
            assert queue_depths_refresh(min_interval=0)["erp"] == first["erp"] + 1
        finally:
            channel.queue_purge("erp")


def test_the_dispatcher_step_reports_its_broker_read_not_the_depths(broker, settings, monkeypatch):
    """A deep queue is a level, not work done: the loop must not rerun the step at
    once because a queue holds messages (found_work counts, a flag counts nothing)."""
    from jobs.integrations import backpressure
    from jobs.processes.dispatcher import found_work

    monkeypatch.setattr(backpressure, "_last_read", {})
    with Connection(settings.BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        channel.queue_purge("erp")
        Producer(channel, exchange=JOBS_EXCHANGE).publish({}, routing_key="erp")
        try:
            first, again = backpressure.queue_depths_step(), backpressure.queue_depths_step()
            assert (first, again) == ({"broker_read": True}, {"broker_read": False})
            assert queue_depth_cached("erp") == 1
            assert not found_work(first) and not found_work(again)
        finally:
            channel.queue_purge("erp")
    settings.BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"
    assert backpressure.queue_depths_step() == {"broker_read": False}


def test_a_queue_the_broker_lacks_has_no_depth_and_the_others_are_still_read(broker):
    from core.broker import queue_depths

    depths = queue_depths(["erp", "no-such-queue", "sim", "nor-this-one"])
    assert depths["no-such-queue"] is None and depths["nor-this-one"] is None
    assert depths["erp"] == 0 and depths["sim"] == 0  # purged by the fixture


def test_refresh_with_the_broker_down_caches_nothing(settings):
    settings.BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"
    assert queue_depths_refresh(min_interval=0) == {}
    assert queue_depth_cached("sim") is None
