"""The key-value store (core/kv.py): one contract, in Redis and in PostgreSQL's UNLOGGED
jobops_kv table (JOBOPS_REDIS off), and Django's cache on the PostgreSQL one."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.core.cache import cache
from django.db import connection

from core.kv import Bucket, KvUnavailable, PostgresKv, kv_key, kv_store, kv_sweep_once
from tests.processes import free_port
from tests.threads import run_in_threads

pytestmark = pytest.mark.django_db

PER_MINUTE = 1 / 60_000


@pytest.fixture(params=["redis", "postgres"])
def store(request, settings):
    settings.JOBOPS_REDIS = request.param == "redis"
    return kv_store()


def unique(name: str) -> str:
    # Redis keeps keys across tests (its db is emptied per run, not per test).
    return kv_key("test", name, uuid.uuid4().hex)


def test_it_keeps_an_entry_for_its_time_to_live_only(store):
    key = unique("ttl")
    store.set_many({key: "7"}, ttl=0.3)
    assert store.get(key) == "7"
    time.sleep(0.4)
    assert store.get(key) is None


def test_add_sets_only_where_no_live_entry_is(store):
    key = unique("add")
    assert store.add(key, "first", ttl=0.2) is True
    assert store.add(key, "second", ttl=10) is False
    assert store.get(key) == "first"
    time.sleep(0.3)
    assert store.add(key, "third", ttl=10) is True  # the first one expired
    assert store.get(key) == "third"


def test_touch_and_delete(store):
    key = unique("touch")
    store.set_many({key: "v"}, ttl=0.2)
    assert store.touch(key, ttl=10) is True
    time.sleep(0.3)
    assert store.get(key) == "v"  # its new lifetime
    assert store.delete(key) == 1
    assert store.get(key) is None
    assert store.touch(key, ttl=10) is False


def test_scan_finds_the_live_entries_under_a_prefix_only(store):
    prefix = unique("scan") + ":"
    store.set_many({prefix + "a": "1", prefix + "b": "2"}, ttl=10)
    store.set_many({prefix + "gone": "3"}, ttl=0.1)
    store.set_many({prefix[:-1] + "x:other": "4"}, ttl=10)  # a sibling, not under it
    time.sleep(0.2)
    assert store.scan(prefix) == {prefix + "a": "1", prefix + "b": "2"}


def test_a_take_allows_the_capacity_then_refuses_from_every_bucket(store):
    a, b = Bucket(unique("a"), 5, 5 * PER_MINUTE), Bucket(unique("b"), 1, PER_MINUTE)
    first = store.take_tokens([a, b])
    assert (first.allowed, first.remaining, first.empty) == (True, 4, None)
    refused = store.take_tokens([a, b])  # b is empty
    assert (refused.allowed, refused.empty) == (False, 1)
    assert 59_000 <= refused.wait_ms <= 60_000  # one token of b refills in a minute
    # A refusal took from none: a still holds 4.
    assert store.take_tokens([a]).remaining == 3


def test_a_take_of_several_tokens_takes_each_buckets_cost_or_none(store):
    """A batch create's take: its cost from each bucket at once, or nothing, with the
    tokens the short bucket holds."""
    a = Bucket(unique("a"), 10, 10 * PER_MINUTE, cost=4)
    b = Bucket(unique("b"), 5, 5 * PER_MINUTE, cost=3)
    first = store.take_tokens([a, b])
    assert (first.allowed, first.remaining) == (True, 6)
    refused = store.take_tokens([a, b])  # b holds 2 of the 3
    assert (refused.allowed, refused.empty, refused.available) == (False, 1, 2)
    assert 11_000 <= refused.wait_ms <= 12_000  # one token of b at 5 a minute
    assert store.take_tokens([Bucket(a.key, 10, 10 * PER_MINUTE, cost=6)]).allowed
    # A cost above the capacity never passes; its wait is until the bucket is full.
    huge = store.take_tokens([Bucket(unique("c"), 5, 5 * PER_MINUTE, cost=6)])
    assert (huge.allowed, huge.available, huge.wait_ms) == (False, 5, 0)


def test_buckets_refill_at_their_rate(store):
    # 1 token a second: the three takes have a second before the first token is back
    # (at 2 a second, half a second of a loaded machine let the third one through).
    bucket = Bucket(unique("refill"), 2, 1 / 1000)
    assert store.take_tokens([bucket]).allowed
    assert store.take_tokens([bucket]).allowed
    refused = store.take_tokens([bucket])
    assert not refused.allowed and 0 < refused.wait_ms <= 1000
    time.sleep(refused.wait_ms / 1000 + 0.05)  # one token back
    assert store.take_tokens([bucket]).allowed


@pytest.mark.django_db(transaction=True)
def test_concurrent_takes_in_postgres_never_overspend_a_bucket(settings):
    settings.JOBOPS_REDIS = False
    bucket = Bucket(unique("race"), 30, 30 * PER_MINUTE)
    allowed, lock = [], threading.Lock()

    def take_five(_: int) -> None:
        for _ in range(5):
            take = PostgresKv().take_tokens([bucket])
            with lock:
                allowed.append(take.allowed)

    assert run_in_threads(take_five, 12) == []
    # 60 attempts in about a second at 30/min: 30 tokens, at most one refilled.
    assert len(allowed) == 60
    assert 30 <= sum(allowed) <= 31


def test_the_sweep_deletes_expired_rows_and_reads_never_see_them(settings):
    settings.JOBOPS_REDIS = False
    store = kv_store()
    live, dead = unique("live"), unique("dead")
    store.set_many({live: "1"}, ttl=60)
    store.set_many({dead: "2"}, ttl=0.05)
    time.sleep(0.1)
    assert store.get(dead) is None
    assert kv_sweep_once() >= 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT key FROM jobops_kv WHERE key = ANY(%s)", [[live, dead]])
        assert [row[0] for row in cursor.fetchall()] == [live]


def test_the_table_is_unlogged():
    with connection.cursor() as cursor:
        cursor.execute("SELECT relpersistence FROM pg_class WHERE relname = 'jobops_kv'")
        assert cursor.fetchone() == ("u",)


def test_a_dead_redis_is_reported_as_unavailable(settings):
    settings.JOBOPS_REDIS = True
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(KvUnavailable):
        kv_store().get("anything")
    with pytest.raises(KvUnavailable):
        kv_store().take_tokens([Bucket("k", 1, PER_MINUTE)])


@pytest.fixture
def postgres_cache(settings):
    settings.JOBOPS_REDIS = False
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # any Redis use would fail
    settings.CACHES = {"default": {"BACKEND": "core.kv.KvCache", "KEY_PREFIX": "t"}}
    return cache


def test_django_cache_on_postgres_keeps_values_of_any_picklable_kind(postgres_cache):
    postgres_cache.set("grant", {"user_id": 3, "at": [1.5, None]}, 60)
    assert postgres_cache.get("grant") == {"user_id": 3, "at": [1.5, None]}
    assert postgres_cache.get("missing", "default") == "default"
    assert postgres_cache.add("grant", "other") is False
    assert postgres_cache.delete("grant") is True
    assert postgres_cache.get("grant") is None


def test_django_cache_on_postgres_expires_and_clears(postgres_cache):
    postgres_cache.set("short", 1, 0.1)
    postgres_cache.set("forever", 2, None)
    postgres_cache.set("never", 3, 0)  # Django: a timeout of 0 does not keep it
    time.sleep(0.2)
    assert postgres_cache.get_many(["short", "forever", "never"]) == {"forever": 2}
    assert postgres_cache.incr("forever") == 3
    postgres_cache.clear()
    assert postgres_cache.get("forever") is None
