"""Webhook endpoints per organisation (docs/webhooks.md): registration, signed delivery
in order, retries with the same webhook-id, isolation of a hanging receiver, rotation,
SSRF refusals, the portal's redeliver.

Real PostgreSQL and real HTTP receivers on 127.0.0.1 (tests/webhook_receiver.py); the
delivery loop runs in-process (WebhookRunner.step), its threads on their own
connections: the tests are transactional.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest
from django.test import override_settings
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from audit.models import AuditLog
from jobs.integrations.webhook_http import address_refusal, literal_address, url_refusal
from jobs.models import EventOutbox
from jobs.processes.webhooks import WebhookRunner, webhook_deliver_endpoint, webhook_fanout
from jobs.tables.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tenants.models import ApiToken, Role
from tenants.services import token_create
from tests.factories import (
    OrganisationFactory,
    UserFactory,
    client_for,
    job_in_state,
)
from tests.metric_samples import Moved
from tests.polling import wait_for
from tests.processes import ROOT, database_url, subprocess_env
from tests.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)

LIFE = ["pending", "queued", "running", "succeeded"]


@pytest.fixture
def local(settings):
    """Receivers on 127.0.0.1 are allowed; retries come at once."""
    settings.JOBOPS_WEBHOOK_ALLOW_PRIVATE = True
    settings.JOBOPS_WEBHOOK_RETRY_SCHEDULE = [timedelta(0)]
    settings.JOBOPS_WEBHOOK_TIMEOUT_SECONDS = 2.0
    return settings


@pytest.fixture
def runner():
    one = WebhookRunner(concurrency=4)
    yield one
    one.close()


@pytest.fixture
def admin_user():
    org = OrganisationFactory()
    return UserFactory(org=org, org__role=Role.ADMIN)


def register(user, url, events=("job.status.changed",), **extra):
    response = client_for(user).post(
        "/api/v1/webhooks", {"url": url, "events": list(events), **extra}, format="json"
    )
    assert response.status_code == 201, response.json()
    return response.json()


def deliver(runner, until, timeout=15):
    def stepped():
        runner.step()
        runner.wait(timeout=timeout)
        return until()

    return wait_for(stepped, timeout=timeout)


def statuses(requests):
    return [r["body"]["status"] for r in requests]


def test_a_jobs_life_arrives_signed_and_in_order(local, runner, admin_user):
    with WebhookReceiver() as receiver:
        created = register(admin_user, receiver.url)
        assert created["secret"].startswith("whsec_")
        job_in_state("succeeded", owner=admin_user)
        wait_for(lambda: (webhook_fanout(), WebhookDelivery.objects.count() >= 4)[1])
        # A job's events go in a row, in one batch.
        assert webhook_deliver_endpoint(created["id"]).delivered == 4
    verifier = Webhook(created["secret"])
    for request in receiver.requests:
        assert verifier.verify(request["raw"], request["headers"])["job_id"]
        assert request["headers"]["webhook-id"].startswith("msg_")
    assert statuses(receiver.delivered()) == LIFE
    seqs = [r["body"]["seq"] for r in receiver.delivered()]
    assert seqs == sorted(seqs)
    # A tampered body does not verify.
    with pytest.raises(WebhookVerificationError):
        first = receiver.requests[0]
        verifier.verify(first["raw"].replace("pending", "failed"), first["headers"])
    detail = client_for(admin_user).get(f"/api/v1/webhooks/{created['id']}").json()
    assert "secret" not in detail and detail["waiting"] == 0 and detail["last_success_at"]


def test_a_receiver_answering_500_twice_gets_the_same_id_then_everything_once(
    local, runner, admin_user
):
    moved = Moved()
    with WebhookReceiver(fail_first=2) as receiver:
        register(admin_user, receiver.url)
        job_in_state("succeeded", owner=admin_user)
        deliver(runner, lambda: len(receiver.delivered()) >= 4)
    first_three = [r["headers"]["webhook-id"] for r in receiver.requests[:3]]
    assert len(set(first_three)) == 1  # the failing event again, its job's next held
    assert [r["status"] for r in receiver.requests[:3]] == [500, 500, 200]
    # Each event under one id only, and each delivered once.
    ids_by_event: dict[str, set[str]] = {}
    for r in receiver.requests:
        ids_by_event.setdefault(r["body"]["event_id"], set()).add(r["headers"]["webhook-id"])
    assert all(len(ids) == 1 for ids in ids_by_event.values())
    assert statuses(receiver.delivered()) == LIFE
    assert len(receiver.requests) == 6
    assert moved("webhook_delivery_attempts_total", outcome="failed") == 2
    # Each attempt kept, the answer cut to 1 KB.
    attempt = WebhookAttempt.objects.filter(status=500).first()
    assert attempt is not None and len(attempt.response) == 1024 and attempt.latency_ms >= 0


def test_a_failing_event_holds_its_jobs_later_events_only(local, runner, admin_user):
    with WebhookReceiver() as receiver:
        register(admin_user, receiver.url)
        stuck = job_in_state("succeeded", owner=admin_user)
        receiver.failing_jobs.add(str(stuck.id))
        other = job_in_state("succeeded", owner=admin_user)
        deliver(runner, lambda: len(receiver.delivered()) >= 4)
        stuck_seen = [r for r in receiver.requests if r["body"]["job_id"] == str(stuck.id)]
        # Only its first event was tried (again and again); none after it.
        assert {r["body"]["status"] for r in stuck_seen} == {"pending"}
        assert statuses(receiver.delivered()) == LIFE
        assert {r["body"]["job_id"] for r in receiver.delivered()} == {str(other.id)}
        receiver.failing_jobs.clear()
        deliver(runner, lambda: len(receiver.delivered()) >= 8)
    later = [r for r in receiver.delivered() if r["body"]["job_id"] == str(stuck.id)]
    assert statuses(later) == LIFE


def test_a_hanging_receiver_does_not_delay_another_endpoint(local, runner, admin_user):
    local.JOBOPS_WEBHOOK_TIMEOUT_SECONDS = 2.5
    with WebhookReceiver(hang=4.0) as hanging, WebhookReceiver() as healthy:
        register(admin_user, hanging.url)
        register(admin_user, healthy.url)
        job_in_state("succeeded", owner=admin_user)
        job_in_state("pending", owner=admin_user)
        runner.step()
        wait_for(lambda: hanging.started >= 1, timeout=5)
        # The healthy endpoint gets everything while the hanging one's POST is stuck.
        wait_for(lambda: (runner.step(), len(healthy.delivered()) >= 5)[1], timeout=2)
        assert any(not f.done() for f in runner.inflight.values())
        # Once the first POST timed out the hanging endpoint's next batch waits on the
        # other job's event; new events still reach the healthy one meanwhile.
        wait_for(lambda: (runner.step(), hanging.started >= 2)[1], timeout=8)
        job_in_state("pending", owner=admin_user)
        wait_for(lambda: (runner.step(), len(healthy.delivered()) >= 6)[1], timeout=2)
        runner.wait(timeout=10)
    assert statuses(healthy.delivered()).count("pending") == 3
    failed = WebhookEndpoint.objects.get(url=hanging.url)
    assert failed.failing_since is not None and "Timeout" in failed.last_error


def test_a_rotated_secret_verifies_with_both_during_the_overlap(local, runner, admin_user):
    with WebhookReceiver() as receiver:
        created = register(admin_user, receiver.url)
        rotated = client_for(admin_user).post(f"/api/v1/webhooks/{created['id']}/rotate").json()
        assert rotated["secret"] != created["secret"]
        job_in_state("pending", owner=admin_user)
        deliver(runner, lambda: len(receiver.delivered()) >= 1)
        request = receiver.requests[0]
        assert len(request["headers"]["webhook-signature"].split(" ")) == 2
        for secret in (created["secret"], rotated["secret"]):
            Webhook(secret).verify(request["raw"], request["headers"])
        # After the overlap the old secret no longer signs.
        WebhookEndpoint.objects.filter(pk=created["id"]).update(
            previous_secret_until=timezone.now() - timedelta(seconds=1)
        )
        job_in_state("pending", owner=admin_user)
        deliver(runner, lambda: len(receiver.delivered()) >= 2)
    later = receiver.requests[-1]
    Webhook(rotated["secret"]).verify(later["raw"], later["headers"])
    with pytest.raises(WebhookVerificationError):
        Webhook(created["secret"]).verify(later["raw"], later["headers"])


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hooks",
        "http://localhost/hooks",
        "http://[::1]/hooks",
        "http://2130706433/hooks",
        "http://[::ffff:127.0.0.1]/hooks",
        "http://0.0.0.0/hooks",
        "http://100.64.0.1/hooks",
        "http://169.254.169.254/latest",
        "http://10.0.0.1/hooks",
        "http://[fe80::1]/hooks",
        "http://0x7f.1/hooks",
        "ftp://example.com/hooks",
    ],
)
def test_private_and_loopback_receivers_are_refused_at_registration(url, admin_user):
    response = client_for(admin_user).post(
        "/api/v1/webhooks", {"url": url, "events": ["job.status.changed"]}, format="json"
    )
    assert response.status_code == 422, response.json()
    assert response.json()["error"]["code"] == "ERR-WEBHOOK-422"
    assert not WebhookEndpoint.objects.exists()


def test_the_address_connected_to_is_checked_at_delivery(local, runner, admin_user):
    with WebhookReceiver() as receiver:
        port = receiver.url.split(":")[2].split("/")[0]
        # Registered while allowed, by a name that resolves to loopback.
        register(admin_user, f"http://localhost:{port}/hooks")
        local.JOBOPS_WEBHOOK_ALLOW_PRIVATE = False
        job_in_state("pending", owner=admin_user)
        runner.step()
        runner.wait(timeout=10)
        assert receiver.requests == []
        delivery = wait_for(lambda: WebhookDelivery.objects.filter(attempts__gte=1).first())
        assert "address refused" in delivery.last_error and delivery.delivered_at is None
        # The allow setting lifts the check: the same delivery goes.
        local.JOBOPS_WEBHOOK_ALLOW_PRIVATE = True
        deliver(runner, lambda: len(receiver.delivered()) >= 1)


def test_address_checks_cover_each_form():
    for host in ["::1", "::ffff:127.0.0.1", "100.100.1.1", "0.0.0.0", "fe80::1", "192.168.1.1"]:
        assert address_refusal(literal_address(host)), host
    assert literal_address("2130706433") == literal_address("127.0.0.1")
    assert address_refusal(literal_address("93.184.216.34")) is None
    assert url_refusal("https://example.com/hooks", allow_private=False) is None
    assert url_refusal("http://127.0.0.1/x", allow_private=True) is None


def test_a_plain_member_cannot_register_nor_list(admin_user):
    org = admin_user.memberships.get().organisation
    member = UserFactory(org=org)
    client = client_for(member)
    response = client.post(
        "/api/v1/webhooks",
        {"url": "https://example.com/hooks", "events": ["job.status.changed"]},
        format="json",
    )
    assert response.status_code == 403 and response.json()["error"]["code"] == "ERR-AUTH-403"
    assert client.get("/api/v1/webhooks").status_code == 403
    assert not WebhookEndpoint.objects.exists()


def test_a_token_without_the_scope_is_refused(admin_user):
    issued = token_create(user=admin_user, name="ci", scopes=["jobs:read"])
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.key}")
    response = client.get("/api/v1/webhooks")
    assert response.status_code == 403
    assert response.json()["error"]["details"]["required_scope"] == "webhooks:manage"
    assert ApiToken.objects.count() == 1


def test_crud_and_bad_input_give_the_envelope(admin_user):
    client = client_for(admin_user)
    created = register(admin_user, "https://example.com/hooks", events=["job.progress"])
    for body in (
        {"url": "https://example.com", "events": ["job.nope"]},
        {"url": "https://example.com", "events": []},
        {"url": "", "events": ["job.progress"]},
        {"url": "https://example.com", "events": ["job.progress"], "project": "nope"},
        ["not", "an", "object"],
    ):
        response = client.post("/api/v1/webhooks", body, format="json")
        assert response.status_code == 422, (body, response.json())
    malformed = client.post("/api/v1/webhooks", "{", content_type="application/json")
    assert malformed.status_code == 400
    assert malformed.json()["error"]["code"] == "ERR-WEBHOOK-400"
    listed = client.get("/api/v1/webhooks").json()["results"]
    assert [e["id"] for e in listed] == [created["id"]] and "secret" not in listed[0]
    patched = client.patch(
        f"/api/v1/webhooks/{created['id']}",
        {"events": ["job.dead_lettered", "job.status.changed"], "enabled": False},
        format="json",
    ).json()
    assert patched["events"] == ["job.status.changed", "job.dead_lettered"]
    assert patched["enabled"] is False
    other_admin = UserFactory(org=OrganisationFactory(), org__role=Role.ADMIN)
    assert client_for(other_admin).get(f"/api/v1/webhooks/{created['id']}").status_code == 404
    assert client.delete(f"/api/v1/webhooks/{created['id']}").status_code == 204
    assert client.get(f"/api/v1/webhooks/{created['id']}").status_code == 404
    kinds = set(AuditLog.objects.values_list("event_type", flat=True))
    assert {"webhook_created", "webhook_updated", "webhook_disabled", "webhook_deleted"} <= kinds


def test_no_secret_is_stored_in_clear(admin_user):
    created = register(admin_user, "https://example.com/hooks")
    rotated = client_for(admin_user).post(f"/api/v1/webhooks/{created['id']}/rotate").json()
    # The whole database as a backup holds it (the data of every table, the audit too).
    dump = subprocess.run(
        ["pg_dump", "--data-only", database_url()],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "COPY public.webhook_endpoints" in dump
    for secret in (created["secret"], rotated["secret"]):
        assert secret not in dump and secret.removeprefix("whsec_") not in dump


def test_a_dead_lettered_job_is_its_own_event(local, runner, admin_user):
    with WebhookReceiver() as receiver:
        register(admin_user, receiver.url, events=["job.dead_lettered"])
        job_in_state("failed", owner=admin_user)
        deliver(runner, lambda: len(receiver.delivered()) >= 1)
    assert [r["body"]["type"] for r in receiver.requests] == ["job.dead_lettered"]
    assert receiver.requests[0]["body"]["status"] == "failed"


def test_a_project_endpoint_gets_only_its_projects_jobs(local, runner, admin_user):
    webhook_fanout()
    org = admin_user.memberships.get().organisation
    from tests.factories import ProjectFactory

    ProjectFactory(organisation=org, slug="alpha")
    with WebhookReceiver() as receiver:
        register(admin_user, receiver.url, project="alpha")
        job_in_state("pending", owner=admin_user)  # no project
        runner.step()
        runner.wait(timeout=10)
    assert receiver.requests == [] and not WebhookDelivery.objects.exists()


def test_an_endpoint_failing_past_the_window_is_disabled_and_resumes_when_enabled(
    local, runner, admin_user
):
    moved = Moved()
    with WebhookReceiver() as receiver:
        receiver.status = 503
        created = register(admin_user, receiver.url)
        job_in_state("pending", owner=admin_user)
        deliver(runner, lambda: len(receiver.requests) >= 1)
        WebhookEndpoint.objects.filter(pk=created["id"]).update(
            failing_since=timezone.now() - timedelta(days=3, seconds=1)
        )
        deliver(runner, lambda: not WebhookEndpoint.objects.get(pk=created["id"]).enabled)
        endpoint = WebhookEndpoint.objects.get(pk=created["id"])
        assert "failing since" in endpoint.disabled_reason and "503" in endpoint.last_error
        detail = client_for(admin_user).get(f"/api/v1/webhooks/{created['id']}").json()
        assert detail["enabled"] is False and detail["waiting"] == 1
        assert detail["recent_attempts"][0]["status"] == 503
        assert moved("webhook_endpoints_disabled_total") == 1
        assert AuditLog.objects.filter(event_type="webhook_disabled").count() == 1
        tried = len(receiver.requests)
        runner.step()
        runner.wait(timeout=10)
        assert len(receiver.requests) == tried  # held while disabled, the queue kept
        assert WebhookDelivery.objects.filter(delivered_at__isnull=True).count() == 1
        receiver.status = 200
        client_for(admin_user).patch(
            f"/api/v1/webhooks/{created['id']}", {"enabled": True}, format="json"
        )
        deliver(runner, lambda: len(receiver.delivered()) >= 1)
    assert AuditLog.objects.filter(event_type="webhook_enabled").count() == 1


def test_a_suspended_organisations_deliveries_wait(local, runner, admin_user):
    org = admin_user.memberships.get().organisation
    with WebhookReceiver() as receiver:
        register(admin_user, receiver.url)
        job_in_state("pending", owner=admin_user)
        type(org).objects.filter(pk=org.pk).update(suspended_at=timezone.now())
        runner.step()
        runner.wait(timeout=10)
        assert receiver.requests == [] and WebhookDelivery.objects.count() == 1
        type(org).objects.filter(pk=org.pk).update(suspended_at=None)
        deliver(runner, lambda: len(receiver.delivered()) >= 1)


def test_a_progress_event_of_the_outbox_is_delivered_to_its_subscribers(local, runner, admin_user):
    """job.progress rows are written by the progress path; any outbox row of that type is
    delivered, as it is."""
    org = admin_user.memberships.get().organisation
    job = job_in_state("running", owner=admin_user)
    with WebhookReceiver() as receiver:
        register(admin_user, receiver.url, events=["job.progress"])
        EventOutbox.objects.create(
            job_id=job.id,
            seq=99,
            payload={
                "type": "job.progress",
                "job_id": str(job.id),
                "org_id": org.id,
                "percent": 50,
            },
        )
        deliver(runner, lambda: len(receiver.delivered()) >= 1)
    assert [r["body"]["type"] for r in receiver.requests] == ["job.progress"]
    assert receiver.requests[0]["body"]["percent"] == 50


def test_a_later_event_waits_for_an_earlier_one_the_fanout_has_not_read(local, runner, admin_user):
    job = job_in_state("pending", owner=admin_user)
    with WebhookReceiver() as receiver:
        register(admin_user, receiver.url)
        deliver(runner, lambda: len(receiver.delivered()) >= 1)
        # An earlier event of the job that the fan-out has not read yet (as a transaction
        # that took its id early and committed late leaves it) holds the job's next one,
        # copied already.
        early = EventOutbox.objects.create(
            job_id=job.id, seq=2, payload={"type": "job.status.changed"}
        )
        WebhookDelivery.objects.create(
            endpoint_id=WebhookEndpoint.objects.get().id,
            webhook_id="msg_later",
            event_type="job.status.changed",
            job_id=job.id,
            seq=3,
            body=json.dumps({"seq": 3, "job_id": str(job.id)}),
            next_attempt_at=timezone.now(),
        )
        webhook_deliver_endpoint(WebhookEndpoint.objects.get().id)
        assert len(receiver.requests) == 1  # held
        # Once read (it is not for this endpoint: no organisation), the next one goes.
        deliver(runner, lambda: len(receiver.delivered()) >= 2)
    assert early.id and receiver.requests[1]["headers"]["webhook-id"] == "msg_later"


def test_the_webhooks_process_delivers_and_stops_on_sigterm(admin_user):
    """`manage.py run_webhooks` (the Procfiles' `webhooks`) as a real process."""
    with WebhookReceiver() as receiver:
        with override_settings(JOBOPS_WEBHOOK_ALLOW_PRIVATE=True):
            created = register(admin_user, receiver.url)
        process = subprocess.Popen(
            [sys.executable, "manage.py", "run_webhooks", "--poll", "0.1"],
            cwd=ROOT,
            env=subprocess_env(JOBOPS_WEBHOOK_ALLOW_PRIVATE="on", JOBOPS_METRICS_PORT="0"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            job_in_state("pending", owner=admin_user)
            wait_for(lambda: receiver.delivered(), timeout=30)
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    Webhook(created["secret"]).verify(receiver.requests[0]["raw"], receiver.requests[0]["headers"])


def test_the_fanout_never_passes_a_transaction_still_running(admin_user):
    """The cursor is (transaction, id): an event a running transaction will commit later
    is not skipped by events committed meanwhile."""
    org = admin_user.memberships.get().organisation
    register(admin_user, "https://example.com/hooks")
    job = job_in_state("pending", owner=admin_user)
    webhook_fanout()
    late = psycopg.connect(database_url())
    try:
        late.execute(  # takes its transaction id now, commits after the next event
            "INSERT INTO event_outbox (event_id, job_id, seq, payload, created_at) "
            "VALUES (gen_random_uuid(), %s, 50, %s, now())",
            [job.id, json.dumps({"type": "job.status.changed", "org_id": org.id})],
        )
        job_in_state("pending", owner=admin_user)  # committed after it began
        webhook_fanout()
        assert WebhookDelivery.objects.count() == 1  # neither: the cursor waits
        late.commit()
    finally:
        late.close()
    webhook_fanout()
    assert sorted(WebhookDelivery.objects.values_list("seq", flat=True)) == [1, 1, 50]
