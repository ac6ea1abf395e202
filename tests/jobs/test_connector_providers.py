"""A connector's providers and its fallback (docs/connectors.md#providers-and-a-fallback),
in process: a worker's delivery is `job_execute` against two provider stand-ins on
127.0.0.1 (tests/erp_receiver.py), each provider with its own breaker row; the jobs
and the audit chains are the real PostgreSQL rows."""

from __future__ import annotations

import json
import random
from collections import Counter
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from prometheus_client import REGISTRY

from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor
from audit.verification import audit_verify
from config.connector_providers import providers_parse
from jobs.domain.types import all_connectors, connector_providers
from jobs.integrations.metrics import metrics_refresh_gauges
from jobs.models import ConnectorBreaker, Job
from jobs.processes.runtime import job_execute
from jobs.services.connectors import (
    blocked_types,
    breakers_forget,
    connector_gate,
    connector_open,
    provider_choose,
)
from tests.erp_receiver import Receiver
from tests.factories import client_for, fence_of, job_in_state, role_user
from tests.processes import job_events

pytestmark = pytest.mark.django_db

OPERATOR = Actor.system("test-operator")
BREAKER = {
    "failures": 2,
    "cooldown_seconds": 60.0,
    "probe_wait_seconds": 5.0,
    "jitter_seconds": 1.0,
}


@pytest.fixture(autouse=True)
def _fresh_copy(settings):
    settings.JOBOPS_CONNECTOR_CACHE_SECONDS = 0  # every read sees the rows as they are
    breakers_forget()
    yield
    breakers_forget()


@pytest.fixture
def providers(settings):
    """`erp` with one primary provider `acme` and the fallback `spare`, each a stand-in."""
    with Receiver() as acme, Receiver() as spare:
        settings.JOBOPS_ERP_WEBHOOK_URL = ""  # every call goes to a provider's own url
        settings.JOBOPS_CONNECTORS = {
            "erp": {
                **BREAKER,
                "providers": providers_parse(
                    "erp",
                    [{"name": "acme", "url": acme.url}, {"name": "spare", "url": spare.url}],
                    "spare",
                ),
            }
        }
        yield acme, spare


def erp_job(status: str = "queued") -> Job:
    return job_in_state(status, job_type="erp", params={"event": "invoice.paid"})


def deliver(job: Job) -> dict:
    return job_execute(payload={"job_id": str(job.id)}, hostname="test-host")


def entry(job: Job, event_type: str) -> dict:
    [row] = AuditLog.objects.filter(job_id=job.id, event_type=event_type)
    return json.loads(row.payload)["data"]


def state(name: str) -> str:
    row = ConnectorBreaker.objects.filter(name=name).first()
    return row.state if row else "closed"


def probe_at(name: str):
    return ConnectorBreaker.objects.get(name=name).probe_at


def ops_data(event_type: str) -> list[dict]:
    rows = AuditLog.objects.filter(chain=OPS_CHAIN, event_type=event_type).order_by("seq")
    return [json.loads(r.payload)["data"] for r in rows]


def gauge(name: str) -> float | None:
    metrics_refresh_gauges()
    return REGISTRY.get_sample_value("connector_state", {"connector": name})


def test_a_failing_primary_opens_its_own_breaker_and_later_calls_go_to_the_fallback(providers):
    acme, spare = providers
    acme.status = 503
    failing = [erp_job() for _ in range(BREAKER["failures"])]
    assert [deliver(job)["outcome"] for job in failing] == ["retrying", "retrying"]
    assert len(acme.requests) == 2 and spare.requests == []
    # Only the provider's breaker opened, audited with its name.
    assert (state("erp:acme"), state("erp:spare")) == ("open", "closed")
    [opened] = ops_data("connector_opened")
    assert (opened["connector"], opened["job_id"]) == ("erp:acme", str(failing[-1].id))
    assert (gauge("erp:acme"), gauge("erp:spare")) == (2, 0)
    # Each failed attempt's entry names the provider that ran it; the fallback takes
    # calls, so the failure that opened the breaker retries as usual, not held.
    last = entry(failing[-1], "retrying")
    assert last["provider"] == "acme" and "breaker" not in last
    assert blocked_types() == []
    later = [erp_job() for _ in range(3)]
    assert [deliver(job)["outcome"] for job in later] == ["succeeded"] * 3
    assert len(acme.requests) == 2 and len(spare.requests) == 3
    assert [entry(job, "succeeded")["provider"] for job in later] == ["spare"] * 3
    # Its next attempt comes after its usual backoff (and goes to the fallback), not
    # after the primary's cool-down.
    assert Job.objects.get(id=failing[-1].id).next_run_at < probe_at("erp:acme")
    assert audit_verify(job_ids=[j.id for j in failing + later]).ok


def test_a_primary_due_its_probe_takes_the_probe_and_its_success_brings_its_calls_back(
    providers,
):
    acme, spare = providers
    connector_open(name="erp:acme", reason="INC-7: acme maintenance", actor=OPERATOR)
    assert deliver(erp_job())["outcome"] == "succeeded"
    assert (len(acme.requests), len(spare.requests)) == (0, 1)
    with connection.cursor() as cursor:  # as if the cool-down had passed
        cursor.execute(
            "UPDATE connector_breakers SET probe_at = now() - interval '1 second' "
            "WHERE name = 'erp:acme'"
        )
    probe = erp_job()
    assert deliver(probe)["outcome"] == "succeeded"
    assert (len(acme.requests), state("erp:acme")) == (1, "closed")
    assert entry(probe, "succeeded")["provider"] == "acme"
    assert [d["connector"] for d in ops_data("connector_half_open")] == ["erp:acme"]


def test_every_provider_open_holds_jobs_as_a_single_breaker_does(providers):
    acme, spare = providers
    connector_open(name="erp:spare", reason="INC-8: spare retired for the night", actor=OPERATOR)
    acme.status = 503
    failing = [erp_job() for _ in range(BREAKER["failures"])]
    for job in failing:
        deliver(job)
    # The fallback is open too: the failure that opened the primary waits for a probe.
    held = entry(failing[-1], "retrying")
    assert (held["provider"], held["breaker"]) == ("acme", "open")
    assert blocked_types() == ["erp"]
    job = erp_job()
    assert deliver(job)["outcome"] == "deferred"
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.attempts, stored.last_error_code) == (
        "retrying",
        0,
        "CONNECTOR_OPEN",
    )
    assert job_events(job.id) == ["created", "queued", "started", "deferred"]
    deferred = entry(job, "deferred")
    assert (deferred["connector"], deferred["breaker"]) == ("erp", "open")
    assert len(acme.requests) == 2 and spare.requests == []
    assert audit_verify(job_ids=[job.id]).ok


def test_weights_are_respected_over_many_selections_with_a_seeded_source(settings):
    settings.JOBOPS_CONNECTORS = {
        "erp": {
            **BREAKER,
            "providers": providers_parse(
                "erp",
                [
                    {"name": "big", "weight": 3},
                    {"name": "small", "weight": 1},
                    {"name": "spare"},
                ],
                "spare",
            ),
        }
    }
    primaries = [p for p in connector_providers("erp") if not p.fallback]
    rng = random.Random(40)
    counts = Counter(provider_choose(primaries, rng=rng).provider for _ in range(8000))
    assert set(counts) == {"big", "small"}  # never the fallback while a primary is closed
    assert 2.8 < counts["big"] / counts["small"] < 3.2
    # The gate takes the same seeded source: the same seed, the same choices.
    jobs = [erp_job("running") for _ in range(6)]
    chosen = [
        connector_gate(job=j, fence=fence_of(j), rng=random.Random(n)).connector
        for n, j in enumerate(jobs)
    ]
    expected = [provider_choose(primaries, rng=random.Random(n)) for n in range(6)]
    assert [c.name for c in chosen if c] == [e.name for e in expected]


def test_each_provider_is_a_breaker_the_api_shows_without_its_address(providers):
    acme, _ = providers
    assert list(all_connectors()) == ["erp:acme", "erp:spare"]
    body = client_for(role_user("viewer")).get("/api/v1/connectors").json()
    assert [(c["name"], c["state"], c["job_types"]) for c in body] == [
        ("erp:acme", "closed", ["erp"]),
        ("erp:spare", "closed", ["erp"]),
    ]
    assert acme.url not in json.dumps(body)


@pytest.mark.parametrize(
    ("listed", "fallback", "named"),
    [
        ([{"name": "a"}], "b", "erp.fallback='b' is none of its providers (a)"),
        ([{"name": "a", "weight": 0}], None, "a.weight=0: a whole number, 1-1000"),
        ([{"name": "a", "weight": -2}], None, "a.weight=-2"),
        ([{"name": "a", "weight": 1.5}], None, "a.weight=1.5"),
        ([{"name": "a"}, {"name": "a"}], None, "name 'a' appears twice"),
        ([{"name": "a"}, {"name": "b"}, {"name": "c"}], ["b", "c"], "at most one fallback"),
        ([{"name": "a"}], "a", "a primary provider besides the fallback 'a'"),
        ([{"name": "a"}, {"name": "b", "weight": 2}], "b", "'b' is the fallback: it takes no"),
        ([], None, "a list of 1-16 providers"),
        ([{"name": "A b"}], None, "name 'A b'"),
        ([{"name": "a", "url": "ftp://x"}], None, "a.url: an http(s) URL"),
        ([{"name": "a", "speed": 1}], None, "each provider is"),
        ([{"name": "x" * 62}], None, "longer than 64 characters"),
    ],
)
def test_bad_provider_configuration_refuses_with_a_clear_message(listed, fallback, named):
    with pytest.raises(ImproperlyConfigured) as refused:
        providers_parse("erp", listed, fallback)
    assert named in str(refused.value)
    assert str(refused.value).startswith("JOBOPS_CONNECTORS: erp")


def test_an_operator_opens_and_closes_one_provider_by_its_breaker_name(providers):
    acme, spare = providers
    call_command("connector", "open", "erp:acme", "--reason", "INC-9", stdout=StringIO())
    assert (state("erp:acme"), state("erp:spare")) == ("open", "closed")
    assert deliver(erp_job())["outcome"] == "succeeded"
    assert (len(acme.requests), len(spare.requests)) == (0, 1)
    call_command("connector", "close", "erp:acme", "--reason", "fixed", stdout=StringIO())
    assert deliver(erp_job())["outcome"] == "succeeded"
    assert (len(acme.requests), len(spare.requests)) == (1, 1)
    # The connector itself has no breaker of its own: the message names its providers'.
    with pytest.raises(CommandError, match=r"its providers' breakers: erp:acme, erp:spare"):
        call_command("connector", "open", "erp", "--reason", "x", stdout=StringIO())


def test_a_type_that_opted_in_is_refused_only_while_every_provider_is_open(providers, settings):
    table = {name: dict(spec) for name, spec in settings.JOB_TYPES.items()}
    table["erp"]["connector_open"] = "refuse"
    settings.JOB_TYPES = table
    api = client_for(role_user("viewer"))

    def create(key: str) -> int:
        body = {"type": "erp", "params": {"event": "e"}, "idempotency_key": key}
        return api.post("/api/v1/jobs", body, format="json").status_code

    connector_open(name="erp:acme", reason="INC-10", actor=OPERATOR)
    assert create("k1") == 201  # the fallback takes its calls
    connector_open(name="erp:spare", reason="INC-10", actor=OPERATOR)
    refused = api.post(
        "/api/v1/jobs",
        {"type": "erp", "params": {"event": "e"}, "idempotency_key": "k2"},
        format="json",
    )
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "ERR-CONNECTOR-OPEN"
    assert refused.json()["error"]["details"]["connector"] == "erp"
    assert 55 <= int(refused["Retry-After"]) <= 60
