"""PostgreSQL alone (docs/smallest-deployment.md): with JOBOPS_BROKER and JOBOPS_REDIS off,
nothing connects to RabbitMQ or Redis (their URLs point at closed ports here, so any use
would fail loudly), and each of their jobs has a database form."""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from audit.models import AuditLog
from audit.services import OPS_CHAIN
from config.dashboard import dashboard_overview
from core import health
from core.broker import BrokerOffError, broker_connection, queue_depths
from jobs.integrations import metrics
from jobs.integrations.backpressure import (
    queue_depth_cached,
    queue_depths_forget,
    queue_depths_refresh,
)
from jobs.integrations.liveness import beat, live_processes
from jobs.integrations.metrics import metrics_refresh_gauges
from jobs.models import EventOutbox, Job
from jobs.processes.dispatcher import dispatch_once, role_steps
from jobs.processes.erp_bridge import erp_bridge_run
from jobs.processes.events import outbox_prune, outbox_settle_once
from jobs.services.purge import purge_run
from tests.erp_receiver import Receiver
from tests.factories import (
    OperatorFactory,
    UserFactory,
    backdate,
    client_for,
    client_with_grant,
    job_in_state,
    otp_login,
    role_user,
)
from tests.processes import free_port

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs"
SIM = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}


@pytest.fixture(autouse=True)
def postgres_alone(settings):
    settings.JOBOPS_BROKER = False
    settings.JOBOPS_REDIS = False
    settings.JOBOPS_QUEUE_EXECUTORS = dict.fromkeys(settings.JOBOPS_QUEUE_EXECUTORS, "postgres")
    settings.BROKER_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}//"
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    settings.CACHES = {"default": {"BACKEND": "core.kv.KvCache", "KEY_PREFIX": "jobops"}}
    settings.JOBOPS_ERP_EVENTS_URL = ""
    queue_depths_forget()
    yield
    queue_depths_forget()


def unpublished(job) -> list[int]:
    rows = EventOutbox.objects.filter(job_id=job.id, published_at__isnull=True)
    return list(rows.order_by("seq").values_list("seq", flat=True))


# --- nothing talks to a broker ---------------------------------------------------------


def test_a_broker_connection_is_refused_before_any_network_call():
    with pytest.raises(BrokerOffError, match="JOBOPS_BROKER is off"):
        broker_connection()
    with pytest.raises(OSError):  # what every caller that copes with "down" catches
        queue_depths(["sim"])


def test_the_dispatcher_runs_no_broker_step_and_settles_the_outbox():
    steps = dict(role_steps("all"))
    assert "publish" not in steps and "dlq_watch" not in steps
    assert steps["outbox"] == "jobs.processes.events.outbox_settle_once"
    assert role_steps("publish") == []
    job = job_in_state("pending")

    report = dispatch_once()

    assert not [name for name, result in report.items() if "error" in str(result)], report
    job.refresh_from_db()
    assert job.status == "pending"  # published by nobody: a postgres worker claims it
    assert unpublished(job) == []  # nobody can receive it: marked, pruned as usual
    assert report["queue_depths"] == {"broker_read": True}


def test_run_dispatcher_refuses_a_role_with_nothing_to_do():
    with pytest.raises(CommandError, match="--role publish has nothing to do"):
        call_command("run_dispatcher", "--role", "publish", "--once")


def test_relay_outbox_says_there_is_nothing_to_relay_to_but_still_prunes(capsys):
    with pytest.raises(CommandError, match="no exchange to relay to"):
        call_command("relay_outbox", "--once")
    call_command("relay_outbox", "--prune-days", "1")
    assert "pruned 0 relayed events" in capsys.readouterr().out


def test_setup_topology_declares_nothing(capsys):
    call_command("setup_topology")
    assert "JOBOPS_BROKER is off" in capsys.readouterr().out


# --- depths, rate limits, liveness, grants in PostgreSQL ---------------------------------


def test_queue_depths_come_from_the_jobs_table_and_backpressure_uses_them(settings):
    job_in_state("pending", job_type="sim")
    job_in_state("queued", job_type="sim")
    job_in_state("running", job_type="sim")  # taken by a worker: not waiting
    assert queue_depths_refresh(min_interval=0)["sim"] == 2
    queue_depths_forget()
    assert queue_depth_cached("sim") == 2  # read back from jobops_kv

    settings.JOBOPS_QUEUE_DEPTH_LIMITS = {**settings.JOBOPS_QUEUE_DEPTH_LIMITS, "sim": 1}
    refused = client_for(UserFactory()).post(JOBS, SIM, format="json")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "ERR-JOB-BACKPRESSURE"


def test_the_create_rate_limit_answers_429_from_postgres(settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 2}
    api = client_for(UserFactory())
    answers = [api.post(JOBS, SIM, format="json") for _ in range(3)]
    assert [a.status_code for a in answers] == [201, 201, 429]
    assert answers[0]["RateLimit-Remaining"] == "1"
    assert answers[2].json()["error"]["code"] == "ERR-JOB-RATE-LIMIT"
    assert int(answers[2]["Retry-After"]) >= 1


def test_heartbeats_live_in_postgres():
    beat("dispatcher")
    (dispatcher,) = live_processes()["dispatcher"]
    assert dispatcher["age_seconds"] < 5


def test_an_otp_grant_and_the_admin_throttle_work_from_postgres(settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "admin_dlq": 2}
    admin = client_with_grant(role_user("viewer"))  # the grant is stored in jobops_kv
    answers = [admin.get("/api/v1/admin/dlq") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    # No broker: the DLQs' broker depths are unknown, the open dead letters counted.
    # Every queue is a postgres queue: no broker DLQ, its dead letters are the rows.
    sim = next(q for q in answers[0].json() if q["queue"] == "sim_dlq")
    assert sim == {
        "queue": "sim_dlq",
        "depth": None,
        "open": 0,
        "broker_error": None,
        "broker_dlq": False,
    }


def test_the_dashboard_shows_the_database_and_no_broker_trouble():
    job_in_state("pending", job_type="sim")
    overview = dashboard_overview(use_cache=False)
    assert overview["node"]["broker_error"] is None
    assert not [p for p in overview["problems"] if "RabbitMQ" in p or "Redis" in p]
    sim = next(q for q in overview["queues"] if q["queue"] == "sim")
    assert sim["unfinished"]["pending"] == 1
    assert sim["depth"] is None


def test_a_replay_says_nothing_of_a_broker_there_is_none_of(caplog):
    """No broker DLQ to ack copies from: no warning that they were not acked, and no
    count of them."""
    job = job_in_state("failed", reason="worker_lost")
    operator = OperatorFactory()
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "dlq",
        "replay",
        "sim",
        "--as",
        operator.username,
        "--justification",
        "fixed",
        stdout=out,
        stderr=err,
    )
    assert "replayed 1 dead letter(s)" in out.getvalue()
    assert "broker" not in (out.getvalue() + err.getvalue()).lower()
    assert "dlq_ack_away_failed" not in caplog.text
    assert Job.objects.get(id=job.id).status == "pending"


def test_dlq_list_says_there_is_no_broker_dlq_rather_than_an_unknown_depth():
    job_in_state("failed", reason="worker_lost")
    out, err = io.StringIO(), io.StringIO()
    call_command("dlq", "list", stdout=out, stderr=err)
    assert "sim_dlq             no broker          1" in out.getvalue()
    assert " ? " not in out.getvalue() and err.getvalue() == ""


def test_a_replay_in_the_portal_says_nothing_of_a_broker():
    job = job_in_state("failed", reason="worker_lost")
    portal = otp_login(Client(), role_user("operator"))
    url = "/admin/jobs/deadletter/replay/run/"
    dry = portal.get(url, {"queue": "sim_dlq"})
    done = portal.post(url, {**dict(dry.context["hidden"]), "justification": "fixed"})
    text = done.content.decode().split('id="content-main"', 1)[1]  # the page's own part
    assert 'id="action-result"' in text and "run_worker takes them" in text
    assert "Broker" not in text and "broker" not in text
    assert Job.objects.get(id=job.id).status == "pending"


def test_the_dashboard_says_there_is_no_broker_instead_of_unknown_depths():
    job_in_state("pending", job_type="sim")
    panel = otp_login(Client(), role_user("viewer")).get("/admin/dashboard/panel/")
    text = panel.content.decode()
    assert 'id="no-broker"' in text and "No broker (JOBOPS_BROKER off)" in text
    table = text[text.index('id="queues"') : text.index("</table>", text.index('id="queues"'))]
    assert ">Broker</th>" not in table and ">DLQ</th>" not in table
    assert ">?<" not in table  # no unknown figure


def test_readyz_checks_postgres_only_and_says_what_is_off(client, settings):
    settings.JOBOPS_READY_CACHE_SECONDS = 0
    health._cache = None
    response = client.get("/readyz")
    health._cache = None
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["checks"] == {"postgres": {"ok": True}}
    assert body["off"] == ["rabbitmq", "redis"]


# --- the ERP bridge reads the outbox -------------------------------------------------------


def test_the_erp_bridge_posts_the_outbox_in_seq_order_and_marks_it(settings):
    job = job_in_state("succeeded")
    with Receiver() as erp:
        settings.JOBOPS_ERP_EVENTS_URL = erp.url
        assert outbox_settle_once() == 0  # the bridge's to deliver, not the dispatcher's
        counts = erp_bridge_run(idle_timeout=0.3)
    assert counts == {"delivered": 4, "retry": 0, "park": 0}
    assert [r["body"]["status"] for r in erp.requests] == [
        "pending",
        "queued",
        "running",
        "succeeded",
    ]
    for request in erp.requests:
        assert request["headers"]["Idempotency-Key"] == request["body"]["event_id"]
    assert unpublished(job) == []


def test_a_failing_erp_keeps_the_rest_of_the_outbox_for_later(settings):
    settings.JOBOPS_ERP_BRIDGE_BACKOFF_SECONDS = 0.01
    job = job_in_state("running")  # pending, queued, running
    with Receiver(script=[200, 503, 503]) as erp:
        counts = erp_bridge_run(url=erp.url, max_messages=3)
    assert counts == {"delivered": 1, "retry": 2, "park": 0}
    # The first went; the second failed twice and waits, the third behind it (seq order).
    assert unpublished(job) == [2, 3]
    assert [r["body"]["seq"] for r in erp.requests] == [1, 2, 2]

    with Receiver() as erp:
        erp_bridge_run(url=erp.url, idle_timeout=0.3)
    assert [r["body"]["seq"] for r in erp.requests] == [2, 3]
    assert unpublished(job) == []


# --- events the ERP refused for good are parked in the outbox ------------------------------

REFUSAL = "unknown customer for this order: " + "x" * 1000


def ops_entries(event_type: str) -> list[dict]:
    rows = AuditLog.objects.filter(chain=OPS_CHAIN, event_type=event_type).order_by("seq")
    return [{"actor": r.actor_id, **json.loads(r.payload)["data"]} for r in rows]


def park_first_event(job) -> EventOutbox:
    """Run the bridge against an ERP that refuses the job's first event with 422 and
    accepts the rest; returns the parked row."""
    with Receiver(script=[422]) as erp:
        erp.text = REFUSAL
        counts = erp_bridge_run(url=erp.url, idle_timeout=0.3)
    assert counts["park"] == 1
    return EventOutbox.objects.get(job_id=job.id, seq=1)


def parked_gauge() -> float:
    metrics_refresh_gauges()
    return metrics.ERP_EVENTS_PARKED._value.get()


def test_a_refused_event_is_parked_with_its_answer_and_does_not_hold_the_next(settings):
    job = job_in_state("succeeded")  # pending, queued, running, succeeded
    assert parked_gauge() == 0
    with Receiver(script=[422]) as erp:
        erp.text = REFUSAL
        counts = erp_bridge_run(url=erp.url, idle_timeout=0.3)

    assert counts == {"delivered": 3, "retry": 0, "park": 1}
    assert [r["body"]["seq"] for r in erp.requests] == [1, 2, 3, 4]  # the job went on
    row = EventOutbox.objects.get(job_id=job.id, seq=1)
    assert row.published_at is None  # not counted as published: nothing to prune
    assert row.parked_at is not None
    assert row.park_status == 422
    assert row.park_text == REFUSAL[:500]  # a bounded excerpt
    assert unpublished(job) == [1]  # only the parked one
    assert ops_entries("erp_event_parked") == [
        {
            "actor": "erp_bridge",
            "event_id": str(row.event_id),
            "job_id": str(job.id),
            "seq": 1,
            "status": 422,
        }
    ]
    # Counted apart from the relay's backlog: a parked row waits for an operator.
    assert parked_gauge() == 1
    assert metrics_refresh_gauges()["outbox_unpublished"] == 0
    overview = dashboard_overview(use_cache=False)
    assert overview["health"]["erp_events_parked"] == 1
    assert any("erp_parked list" in p for p in overview["problems"])

    # The claim skips it: another run posts nothing.
    with Receiver() as erp:
        assert erp_bridge_run(url=erp.url, idle_timeout=0.3)["delivered"] == 0
    assert erp.requests == []


def test_list_shows_the_parked_events(capsys):
    job = job_in_state("queued")
    row = park_first_event(job)
    call_command("erp_parked", "list")
    out = capsys.readouterr().out
    assert str(row.event_id) in out and f"job {job.id} seq 1" in out
    assert "HTTP 422: unknown customer for this order" in out

    call_command("erp_parked", "list", "--json")
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["event_id"] == str(row.event_id)
    assert listed["status"] == 422 and listed["text"] == REFUSAL[:500]
    assert listed["job_status"] == "pending"  # what the refused event announced

    call_command("erp_parked", "list", "--after", str(row.id))
    assert "no parked events" in capsys.readouterr().out


def test_redrive_delivers_the_event_once_with_the_same_idempotency_key(capsys):
    operator = role_user("operator")
    job = job_in_state("queued")
    row = park_first_event(job)
    event_id = str(row.event_id)

    call_command(
        "erp_parked",
        "redrive",
        event_id,
        "--as",
        operator.username,
        "--reason",
        "customer created, INC-7",
    )
    assert f"{event_id} redriven" in capsys.readouterr().out
    row.refresh_from_db()
    assert (row.parked_at, row.park_status, row.park_text, row.published_at) == (
        None,
        None,
        None,
        None,
    )
    assert ops_entries("erp_event_redriven") == [
        {
            "actor": str(operator.pk),
            "event_id": event_id,
            "job_id": str(job.id),
            "seq": 1,
            "reason": "customer created, INC-7",
        }
    ]
    assert parked_gauge() == 0

    with Receiver() as erp:
        counts = erp_bridge_run(url=erp.url, idle_timeout=0.3)
        assert counts == {"delivered": 1, "retry": 0, "park": 0}
        # Repeating the re-drive is harmless: nothing changes, nothing is audited or sent.
        call_command("erp_parked", "redrive", event_id)
        assert f"{event_id} not parked" in capsys.readouterr().out
        erp_bridge_run(url=erp.url, idle_timeout=0.3)
    [request] = erp.requests
    assert request["headers"]["Idempotency-Key"] == event_id
    assert request["body"]["seq"] == 1
    assert unpublished(job) == []
    assert len(ops_entries("erp_event_redriven")) == 1


def test_a_redriven_event_refused_again_is_parked_again_and_all_redrives_every_one(capsys):
    first, second = job_in_state("pending"), job_in_state("pending")
    with Receiver() as erp:
        erp.status = 422
        assert erp_bridge_run(url=erp.url, idle_timeout=0.3)["park"] == 2
        call_command("erp_parked", "redrive", "--all")
        assert erp_bridge_run(url=erp.url, idle_timeout=0.3)["park"] == 2  # refused again
        assert parked_gauge() == 2
        erp.status = 200
        call_command("erp_parked", "redrive", "--all")
        assert erp_bridge_run(url=erp.url, idle_timeout=0.3)["delivered"] == 2
    assert unpublished(first) == unpublished(second) == []
    assert len(ops_entries("erp_event_redriven")) == 4
    assert len(ops_entries("erp_event_parked")) == 4
    assert parked_gauge() == 0


def test_discard_needs_a_reason_audits_it_and_repeating_is_harmless(capsys):
    operator = role_user("operator")
    job = job_in_state("queued")
    row = park_first_event(job)
    event_id = str(row.event_id)
    with pytest.raises(CommandError, match="--reason"):
        call_command("erp_parked", "discard", event_id)
    with pytest.raises(CommandError, match="justification is required"):
        call_command("erp_parked", "discard", event_id, "--reason", "  ")
    row.refresh_from_db()
    assert row.published_at is None and not ops_entries("erp_event_discarded")

    call_command(
        "erp_parked",
        "discard",
        event_id,
        "--reason",
        "test order, INC-8",
        "--as",
        operator.username,
    )
    assert f"{event_id} discarded" in capsys.readouterr().out
    row.refresh_from_db()
    assert row.published_at is not None  # settled: it follows the retention now
    assert row.parked_at is not None and row.park_status == 422  # what was refused stays
    assert ops_entries("erp_event_discarded") == [
        {
            "actor": str(operator.pk),
            "event_id": event_id,
            "job_id": str(job.id),
            "seq": 1,
            "status": 422,
            "reason": "test order, INC-8",
        }
    ]
    assert parked_gauge() == 0

    call_command("erp_parked", "discard", event_id, "--reason", "again")
    assert f"{event_id} not parked" in capsys.readouterr().out
    call_command("erp_parked", "redrive", event_id)  # a discarded event is not re-driven
    assert f"{event_id} not parked" in capsys.readouterr().out
    assert len(ops_entries("erp_event_discarded")) == 1 and not ops_entries("erp_event_redriven")
    with Receiver() as erp:
        erp_bridge_run(url=erp.url, idle_timeout=0.3)
    assert erp.requests == []


def test_bad_event_ids_get_a_clear_error_and_change_nothing():
    job = job_in_state("queued")
    row = park_first_event(job)
    with pytest.raises(CommandError, match="'nope' is not an event id"):
        call_command("erp_parked", "redrive", "nope")
    unknown = str(uuid.uuid4())
    with pytest.raises(CommandError, match=f"No event {unknown} in the outbox"):
        call_command("erp_parked", "redrive", str(row.event_id), unknown)
    with pytest.raises(CommandError, match=f"No event {unknown}"):
        call_command("erp_parked", "discard", unknown, "--reason", "gone")
    with pytest.raises(CommandError, match="Name the parked events"):
        call_command("erp_parked", "redrive")
    with pytest.raises(CommandError, match="EVENT_IDs or --all"):
        call_command("erp_parked", "redrive", str(row.event_id), "--all")
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("erp_parked", "redrive", str(row.event_id), "--as", "nobody")
    row.refresh_from_db()
    assert row.parked_at is not None  # the known id of the refused call was not re-driven
    assert not ops_entries("erp_event_redriven") and not ops_entries("erp_event_discarded")


def test_the_purge_keeps_parked_rows_until_they_are_redriven(settings):
    job = job_in_state("succeeded")
    row = park_first_event(job)
    backdate(job, created_at=120, updated_at=120)
    EventOutbox.objects.filter(job_id=job.id).update(
        created_at=timezone.now() - timedelta(days=100)
    )
    EventOutbox.objects.filter(job_id=job.id, published_at__isnull=False).update(
        published_at=timezone.now() - timedelta(days=100)
    )

    removed, _ = purge_run(older_than=timedelta(minutes=1))
    assert removed["outbox"] == 3  # the delivered ones went with their job
    assert not Job.objects.filter(id=job.id).exists()
    assert outbox_prune(older_than=timezone.now()) == 0
    assert list(EventOutbox.objects.values_list("id", flat=True)) == [row.id]

    # Still there to re-drive, though its job is gone: nothing accepted is lost.
    call_command("erp_parked", "redrive", str(row.event_id))
    with Receiver() as erp:
        erp_bridge_run(url=erp.url, idle_timeout=0.3)
    assert [r["body"]["event_id"] for r in erp.requests] == [str(row.event_id)]
