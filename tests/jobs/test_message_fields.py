"""What goes on the wire for a job (docs/architecture.md#publishing, Task 6.3): the exact
fields of the message the dispatcher's publish step sends, read back from its RabbitMQ
queue. A field added or dropped fails here, so the contract workers of the previous
release read (docs/operations/upgrading.md) changes only on purpose."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.integrations.wire import PAYLOAD_VERSION
from jobs.models import Job
from jobs.services.publishing import publish_pending_once
from tenants.services import service_account_get_or_create
from tests.factories import OrganisationFactory, ProjectFactory, UserFactory, client_for
from tests.queues import get_one

pytestmark = pytest.mark.django_db(transaction=True)

# The payload, the task's one argument (jobs.integrations.publisher.wire_payload).
PAYLOAD_FIELDS = {
    "v",
    "job_id",
    "type",
    "params",
    "submitted_by",
    "attempt",
    "created_at",
    "request_id",
    "correlation_id",
    "org_id",
    # Additive context (docs/architecture.md#publishing): no worker reads them, so no
    # new payload version (tests/jobs/test_payload_version.py runs messages with and
    # without them).
    "project_id",
    "actor_type",
    "idempotency_key_sha256",
    "scheduled_for",
}
# jobops' own headers on a first attempt (jobs.integrations.publisher.message_headers) ...
JOBOPS_HEADERS = {"job_id", "org_id", "request_id", "correlation_id", "attempt"}
# ... beside Celery's task-protocol-2 headers (Celery as pinned in constraints.txt) and
# the delivery count RabbitMQ's quorum queue adds.
CELERY_HEADERS = {
    "lang",
    "task",
    "id",
    "shadow",
    "eta",
    "expires",
    "group",
    "group_index",
    "retries",
    "timelimit",
    "root_id",
    "parent_id",
    "argsrepr",
    "kwargsrepr",
    "origin",
    "ignore_result",
    "replaced_task_nesting",
    "stamped_headers",
    "stamps",
}
BROKER_HEADERS = {"x-delivery-count"}
ADDITIVE = ("project_id", "actor_type", "idempotency_key_sha256", "scheduled_for")


def test_a_published_message_carries_exactly_the_documented_fields(amqp):
    acme = OrganisationFactory(slug="acme")
    web = ProjectFactory(organisation=acme, slug="web")
    owner = UserFactory(org=acme)
    created = client_for(owner).post(
        "/api/v1/jobs",
        {"type": "sim", "params": {"steps": 2}, "project": "web", "idempotency_key": "k-1"},
        format="json",
        HTTP_X_REQUEST_ID="req-fields-1",
        HTTP_X_CORRELATION_ID="corr-fields-1",
    )
    assert created.status_code == 201, created.content
    job = Job.objects.get(id=created.json()["id"])
    publish_pending_once()  # the dispatcher's publish step (a no-op if it went already)
    message = get_one(amqp, "sim")
    amqp.basic_ack(message.delivery_tag)

    # The body is Celery's protocol 2: (args, kwargs, embed); the payload is args[0].
    assert message.properties["content_type"] == "application/json"
    assert message.properties["delivery_mode"] == 2  # persistent
    args, kwargs, embed = json.loads(message.body)
    assert kwargs == {} and len(args) == 1
    assert set(embed) == {"callbacks", "errbacks", "chain", "chord"}
    [payload] = args
    assert set(payload) == PAYLOAD_FIELDS
    assert payload == {
        "v": PAYLOAD_VERSION,
        "job_id": str(job.id),
        "type": "sim",
        "params": job.params,  # the validated params, defaults filled in
        "submitted_by": str(owner.pk),
        "attempt": 1,
        "created_at": job.created_at.isoformat(),
        "request_id": "req-fields-1",
        "correlation_id": "corr-fields-1",
        "org_id": acme.pk,
        "project_id": web.pk,
        "actor_type": "user",  # who made it: its `created` entry's actor
        "idempotency_key_sha256": hashlib.sha256(b"k-1").hexdigest(),
        "scheduled_for": None,
    }
    assert set(job.params) == {"seed", "steps", "step_seconds"}  # the defaults were filled

    headers = message.headers
    assert set(headers) == JOBOPS_HEADERS | CELERY_HEADERS | BROKER_HEADERS
    assert {name: headers[name] for name in JOBOPS_HEADERS} == {
        "job_id": str(job.id),
        "org_id": acme.pk,
        "request_id": "req-fields-1",
        "correlation_id": "corr-fields-1",
        "attempt": 1,
    }
    assert headers["task"] == "jobs.sim"
    assert headers["argsrepr"] == f"[{{'job_id': '{job.id}', 'type': 'sim', 'attempt': 1}}]"
    # Celery's task id is the message's correlation id, and no job field.
    assert headers["id"] == message.properties["correlation_id"]
    uuid.UUID(headers["id"])
    assert message.delivery_info["exchange"] == "jobs.direct"
    assert message.delivery_info["routing_key"] == "sim"


def test_a_service_accounts_scheduled_job_names_its_actor_and_its_run_at_and_no_key(amqp):
    acme = OrganisationFactory(slug="acme")
    account, _ = service_account_get_or_create(org=acme, name="ci")
    # A run_at just past runs now, and is kept: the message says when it was meant for.
    run_at = (timezone.now() - timedelta(seconds=5)).replace(microsecond=0)
    created = client_for(account.user).post(
        "/api/v1/jobs",
        {"type": "sim", "params": {"steps": 1}, "run_at": run_at.isoformat()},
        format="json",
    )
    assert created.status_code == 201, created.content
    publish_pending_once()
    message = get_one(amqp, "sim")
    amqp.basic_ack(message.delivery_tag)
    [payload], _, _ = json.loads(message.body)
    assert payload["job_id"] == created.json()["id"]
    assert {name: payload[name] for name in ADDITIVE} == {
        "project_id": None,
        "actor_type": "service",
        "idempotency_key_sha256": None,
        "scheduled_for": run_at.isoformat(),
    }
