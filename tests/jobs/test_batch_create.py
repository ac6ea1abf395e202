"""POST /api/v1/jobs/batch (docs/api.md#creating-jobs-in-a-batch): each item answered
on its own and in order, the batch refused whole only by its size, its shape or the
rate limit, idempotent per item and per request, audited like a single create."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from audit.models import AuditLog
from audit.verification import audit_verify
from jobs.domain.states import Status
from jobs.models import EventOutbox, Job
from tenants.models import Membership
from tests.factories import OrganisationFactory, ProjectFactory, UserFactory, client_for
from tests.jobs.test_ratelimit import queue_holds
from tests.threads import run_in_threads

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clean_redis")]

BATCH = "/api/v1/jobs/batch"


def sim(steps: int = 1, **fields):
    return {"type": "sim", "params": {"steps": steps, "step_seconds": 0}, **fields}


def post(client, body, **extra):
    return client.post(BATCH, body, format="json", **extra)


def results(response):
    assert response.status_code == 200, response.content
    return response.json()["results"]


def audit_rows(job_ids):
    return AuditLog.objects.filter(job_id__in=list(job_ids)).count()


# --- created, each as a single create ------------------------------------------------


def test_a_batch_creates_each_job_in_order_audited_evented_and_verifiable(api):
    body = {"jobs": [sim(1), sim(2, priority=7), sim(3, idempotency_key="own")]}
    listed = results(post(api, body))
    assert [r["index"] for r in listed] == [0, 1, 2]
    assert [r["status"] for r in listed] == ["created"] * 3
    ids = [r["id"] for r in listed]
    jobs = {str(j.id): j for j in Job.objects.filter(id__in=ids)}
    assert [jobs[i].params["steps"] for i in ids] == [1, 2, 3]
    assert [jobs[i].priority for i in ids] == [5, 7, 5]
    assert jobs[ids[2]].idempotency_key == "own" and jobs[ids[0]].idempotency_key is None
    for job in jobs.values():
        assert job.status == Status.PENDING and job.owner_id == api.user.pk
        assert (job.audit_seq, job.version) == (1, 1)
    # One `created` entry per job, its hash on the row, and one event per job.
    entries = AuditLog.objects.filter(job_id__in=ids)
    assert sorted(e.event_type for e in entries) == ["created"] * 3
    assert {str(e.job_id): e.chain_hash for e in entries} == {i: jobs[i].audit_head for i in ids}
    assert EventOutbox.objects.filter(job_id__in=ids, seq=1).count() == 3
    report = audit_verify(job_ids=ids)
    assert report.ok, report


def test_the_entry_of_a_batch_job_is_the_one_a_single_create_writes(api):
    """Same payload shape as POST /api/v1/jobs: the entries differ only by their job."""
    single = api.post("/api/v1/jobs", sim(4), format="json").json()["id"]
    batched = results(post(api, {"jobs": [sim(4)]}))[0]["id"]
    one, other = (AuditLog.objects.get(job_id=i) for i in (single, batched))
    a, b = json.loads(one.payload), json.loads(other.payload)
    for payload in (a, b):
        payload.pop("job_id"), payload.pop("chain"), payload.pop("ts")
        payload["data"]["context"].pop("correlation_id", None)
        payload["data"]["context"].pop("request_id", None)
    assert a == b


def test_a_bad_item_in_the_middle_is_answered_alone_and_the_others_are_created(api):
    items = [sim(1), sim(2), {"type": "sim", "params": {"steps": "many"}}, sim(4), sim(5)]
    listed = results(post(api, {"jobs": items}))
    assert [r["status"] for r in listed] == ["created", "created", "error", "created", "created"]
    assert listed[2]["error"]["code"] == "ERR-JOB-422"
    assert "steps" in listed[2]["error"]["details"]
    assert "id" not in listed[2]
    steps = [Job.objects.get(id=r["id"]).params["steps"] for r in listed if "id" in r]
    assert steps == [1, 2, 4, 5]


@pytest.mark.parametrize(
    ("item", "code", "field"),
    [
        ([1, 2], "ERR-JOB-400", "non_field_errors"),
        ("sim", "ERR-JOB-400", "non_field_errors"),
        (None, "ERR-JOB-400", "non_field_errors"),
        ({"type": "sim", "params": {}, "status": "succeeded"}, "ERR-JOB-400", "status"),
        ({"type": "nope", "params": {}}, "ERR-JOB-400", "type"),
        ({"type": "sim"}, "ERR-JOB-400", "params"),
        ({"type": "sim", "params": []}, "ERR-JOB-422", "params"),
        (sim(priority=9), "ERR-JOB-422", "priority"),
        (sim(run_at="2020-01-01T00:00:00Z"), "ERR-JOB-422", "run_at"),
        (sim(run_at="2030-01-01T00:00:00"), "ERR-JOB-400", "run_at"),
        (sim(idempotency_key="\u00e9t\u00e9"), "ERR-JOB-400", "idempotency_key"),
    ],
)
def test_an_item_is_read_as_the_body_of_a_single_create(api, item, code, field):
    listed = results(post(api, {"jobs": [sim(), item]}))
    assert listed[0]["status"] == "created"
    assert listed[1]["status"] == "error"
    error = listed[1]["error"]
    assert error["code"] == code and field in error["details"], error
    # The same body alone answers with the same code.
    alone = api.post("/api/v1/jobs", item, format="json")
    assert alone.json()["error"]["code"] == code
    assert Job.objects.count() == 1


def test_params_over_the_single_job_bound_are_that_items_413(api, settings):
    settings.JOBOPS_MAX_PAYLOAD_BYTES = 1000
    big = {"type": "ai", "params": {"text": "x" * 2000}}
    listed = results(post(api, {"jobs": [big, sim()]}))
    assert listed[0]["error"]["code"] == "ERR-JOB-413"
    assert listed[1]["status"] == "created"


# --- the envelope, refused whole ------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"jobs": None},
        {"jobs": {}},
        {"jobs": "sim"},
        {"jobs": []},
        [sim()],
        {"jobs": [sim()], "x": 1},
    ],
)
def test_a_batch_without_a_list_of_jobs_is_a_400(api, body):
    response = post(api, body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "ERR-JOB-400"
    assert Job.objects.count() == 0


def test_more_jobs_than_the_bound_is_a_413_and_creates_nothing(api):
    response = post(api, {"jobs": [sim()] * 1001})
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-413"
    assert error["details"] == {"limit": 1000, "jobs": 1001}
    assert Job.objects.count() == 0


def test_a_body_of_10_mb_is_a_413_unread_and_creates_nothing(api):
    blob = json.dumps({"jobs": [sim(1, idempotency_key="k" * 200)] * 40_000})
    assert len(blob) > 10 * 1024 * 1024
    response = api.post(BATCH, blob, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "ERR-JOB-413"
    assert Job.objects.count() == 0


def test_a_full_batch_of_nearly_4_mb_is_read_and_created(api):
    """1,000 jobs of ~3.5 KB params each: the body bound, not Django's upload bound."""
    items = [{"type": "ai", "params": {"text": f"{index} " + "y" * 3500}} for index in range(1000)]
    blob = json.dumps({"jobs": items})
    assert 3.5e6 < len(blob) < 4 * 1024 * 1024
    listed = results(api.post(BATCH, blob, content_type="application/json"))
    assert len(listed) == 1000
    assert {r["status"] for r in listed} == {"created"}, listed[:2]
    assert Job.objects.count() == 1000
    assert AuditLog.objects.filter(event_type="created").count() == 1000


def test_malformed_json_is_a_400(api):
    response = api.post(BATCH, '{"jobs": [', content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "ERR-JOB-400"


# --- idempotency: per item and per request ------------------------------------------------


def test_a_retried_batch_returns_the_same_jobs_and_creates_nothing(api):
    body = {"jobs": [sim(1), sim(2, idempotency_key="own"), sim(3)]}
    first = results(post(api, body, HTTP_IDEMPOTENCY_KEY="batch-1"))
    ids = [r["id"] for r in first]
    assert Job.objects.get(id=ids[0]).idempotency_key == "batch-1:0"
    assert Job.objects.get(id=ids[1]).idempotency_key == "own"
    assert Job.objects.get(id=ids[2]).idempotency_key == "batch-1:2"
    jobs, entries, events = (
        Job.objects.count(),
        AuditLog.objects.count(),
        EventOutbox.objects.count(),
    )
    again = results(post(api, body, HTTP_IDEMPOTENCY_KEY="batch-1"))
    assert [r["id"] for r in again] == ids
    assert [r["status"] for r in again] == ["existing"] * 3
    # A repeat marks each key seen, as a single create's repeat does.
    assert not Job.objects.filter(id__in=ids, idempotency_last_seen_at=None).exists()
    assert (Job.objects.count(), AuditLog.objects.count(), EventOutbox.objects.count()) == (
        jobs,
        entries,
        events,
    )
    # Another request key makes new jobs of the keyless items only.
    other = results(post(api, body, HTTP_IDEMPOTENCY_KEY="batch-2"))
    assert [r["status"] for r in other] == ["created", "existing", "created"]
    assert other[1]["id"] == ids[1]


def test_an_item_key_repeats_a_single_create_and_a_changed_item_is_a_mismatch(api):
    single = api.post("/api/v1/jobs", sim(1, idempotency_key="k1"), format="json").json()
    listed = results(
        post(api, {"jobs": [sim(1, idempotency_key="k1"), sim(2, idempotency_key="k1x")]})
    )
    assert listed[0] == {"index": 0, "status": "existing", "id": single["id"]}
    retried = results(post(api, {"jobs": [sim(9, idempotency_key="k1")]}))
    assert retried[0]["error"]["code"] == "ERR-JOB-IDEMPOTENCY-MISMATCH"
    assert retried[0]["error"]["details"]["job_id"] == single["id"]


def test_duplicate_keys_inside_a_batch_answer_like_repeats(api):
    items = [
        sim(1, idempotency_key="dup"),
        sim(2),
        sim(1, idempotency_key="dup"),  # same params: the first's job
        sim(7, idempotency_key="dup"),  # other params: 422
    ]
    listed = results(post(api, {"jobs": items}))
    assert [r["status"] for r in listed] == ["created", "created", "existing", "error"]
    assert listed[2]["id"] == listed[0]["id"]
    assert listed[3]["error"]["code"] == "ERR-JOB-IDEMPOTENCY-MISMATCH"
    assert listed[3]["error"]["details"] == {"index": 0, "job_id": listed[0]["id"]}
    assert Job.objects.filter(idempotency_key="dup").count() == 1
    assert AuditLog.objects.count() == 2


def test_a_derived_key_equal_to_an_items_own_key_is_the_same_key(api):
    items = [sim(1), sim(1, idempotency_key="r:0")]
    listed = results(post(api, {"jobs": items}, HTTP_IDEMPOTENCY_KEY="r"))
    assert [r["status"] for r in listed] == ["created", "existing"]
    assert listed[0]["id"] == listed[1]["id"]


def test_a_request_key_too_long_for_its_indexes_is_a_400(api):
    response = post(api, {"jobs": [sim()]}, HTTP_IDEMPOTENCY_KEY="k" * 250)
    assert response.status_code == 400
    assert response.json()["error"]["details"]["idempotency_key"]
    assert Job.objects.count() == 0


def test_a_key_past_its_ttl_is_released_and_the_item_creates_a_new_job(api):
    old = results(post(api, {"jobs": [sim(1, idempotency_key="ttl")]}))[0]["id"]
    Job.objects.filter(id=old).update(idempotency_expires_at="2000-01-01T00:00:00Z")
    listed = results(post(api, {"jobs": [sim(2, idempotency_key="ttl")]}))
    assert listed[0]["status"] == "created" and listed[0]["id"] != old
    assert Job.objects.get(id=old).idempotency_key is None


# --- tenancy ---------------------------------------------------------------------------


@pytest.fixture
def two_orgs():
    acme, globex = OrganisationFactory(slug="acme"), OrganisationFactory(slug="globex")
    user = UserFactory(org=acme)
    Membership.objects.create(user=user, organisation=globex, role="member")
    return user, acme, globex


def test_mixed_organisations_are_placed_per_item_and_stay_isolated(two_orgs):
    user, acme, globex = two_orgs
    other_project = ProjectFactory(organisation=OrganisationFactory(slug="initech"))
    acme_project = ProjectFactory(organisation=acme, slug="rockets")
    items = [
        sim(1, org="acme", idempotency_key="same"),
        sim(1, org="globex", idempotency_key="same"),  # another org: its own key space
        sim(1),  # several organisations: must name one
        sim(1, org="initech"),  # not one of the caller's
        sim(1, org="acme", project=other_project.slug),  # another organisation's project
        sim(1, org="acme", project="rockets"),
    ]
    listed = results(post(client_for(user), {"jobs": items}))
    assert [r["status"] for r in listed] == [
        "created", "created", "error", "error", "error", "created"
    ]  # fmt: skip
    assert {listed[i]["error"]["code"] for i in (2, 3, 4)} == {"ERR-TENANT-422"}
    assert listed[0]["id"] != listed[1]["id"]
    placed = {str(j.id): (j.org_id, j.project_id) for j in Job.objects.all()}
    assert placed == {
        listed[0]["id"]: (acme.id, None),
        listed[1]["id"]: (globex.id, None),
        listed[5]["id"]: (acme.id, acme_project.id),
    }
    # Each organisation's member sees only its own.
    outsider = client_for(UserFactory(org=globex))
    assert outsider.get(f"/api/v1/jobs/{listed[0]['id']}").status_code == 404


def test_a_suspended_organisations_items_are_refused_and_the_others_created(two_orgs):
    user, _, globex = two_orgs
    globex.suspended_at = "2026-01-01T00:00:00Z"
    globex.save()
    listed = results(post(client_for(user), {"jobs": [sim(org="globex"), sim(org="acme")]}))
    assert listed[0]["error"]["code"] == "ERR-TENANT-SUSPENDED"
    assert listed[1]["status"] == "created"


# --- rate limits ------------------------------------------------------------------------


def test_a_batch_larger_than_the_allowance_is_a_429_whole_with_the_allowance(api, settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 10}
    assert [r["status"] for r in results(post(api, {"jobs": [sim()] * 4}))] == ["created"] * 4
    response = post(api, {"jobs": [sim()] * 7})
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-RATE-LIMIT"
    details = error["details"]
    assert details["limit"] == "user" and details["requested"] == 7
    assert details["allowance"] == 6 and details["capacity"] == 10
    assert Job.objects.count() == 4
    # Nothing was taken: the six left still pass, one request.
    assert len(results(post(api, {"jobs": [sim()] * 6}))) == 6
    assert post(api, {"jobs": [sim()]}).status_code == 429


def test_a_batch_above_the_limit_itself_says_split_it(api, settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 5}
    response = post(api, {"jobs": [sim()] * 6})
    assert response.status_code == 429
    assert "split it" in response.json()["error"]["message"]
    assert response.json()["error"]["details"]["capacity"] == 5


def test_the_organisations_bucket_counts_its_items_in_the_same_take(two_orgs, settings):
    user = two_orgs[0]
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_org": 3}
    api = client_for(user)
    assert len(results(post(api, {"jobs": [sim(org="acme")] * 3 + [sim(org="globex")] * 3}))) == 6
    response = post(api, {"jobs": [sim(org="globex"), sim(org="acme")]})
    assert response.status_code == 429
    assert response.json()["error"]["details"]["limit"] == "org"
    assert Job.objects.count() == 6


def test_an_accepted_batch_sends_the_allowance_headers(api):
    response = post(api, {"jobs": [sim()] * 3})
    assert response.status_code == 200
    assert int(response["RateLimit-Remaining"]) == int(response["RateLimit-Limit"]) - 3


def test_a_refused_body_counts_as_one_create(api, settings):
    settings.JOBOPS_RATE_LIMITS = {**settings.JOBOPS_RATE_LIMITS, "create_per_user": 2}
    assert post(api, {"jobs": []}).status_code == 400
    assert post(api, {"jobs": []}).status_code == 400
    assert post(api, {"jobs": []}).status_code == 429


def test_a_database_error_fails_the_whole_batch_and_creates_nothing(api):
    def fail_on_insert(execute, sql, params, many, context):
        if "jsonb_populate_recordset" in sql:
            raise connection.ops.connection.Database.OperationalError("injected")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(fail_on_insert):
        response = post(api, {"jobs": [sim(1), sim(2)]})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "ERR-JOB-503"
    assert Job.objects.count() == 0 and AuditLog.objects.count() == 0


# --- concurrency --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_sharing_keys_make_each_job_once_and_never_deadlock(user):
    """Four batches at once, the same 200 keys in different orders: each key makes one
    job, every answer names it, and no batch fails (their inserts take the key index's
    locks in one order)."""
    keys = [f"race-{n}" for n in range(200)]
    answers: dict[int, dict[str, str]] = {}

    def submit(index: int) -> None:
        order = keys if index % 2 == 0 else list(reversed(keys))
        client = client_for(user)
        body = {"jobs": [sim(1, idempotency_key=key) for key in order]}
        response = post(client, body)
        assert response.status_code == 200, response.content
        listed = response.json()["results"]
        assert {r["status"] for r in listed} <= {"created", "existing"}, listed
        answers[index] = {key: r["id"] for key, r in zip(order, listed, strict=True)}

    assert run_in_threads(submit, 4) == []
    assert Job.objects.count() == 200
    assert all(answer == answers[0] for answer in answers.values())
    assert AuditLog.objects.filter(event_type="created").count() == 200
    assert audit_verify(job_ids=list(answers[0].values())).ok


# --- backpressure -------------------------------------------------------------------------


def test_backpressure_refuses_the_items_of_a_deep_queue_only_and_answers_repeats(
    broker, settings, api
):
    settings.JOBOPS_QUEUE_DEPTH_LIMITS = {**settings.JOBOPS_QUEUE_DEPTH_LIMITS, "sim": 10}
    before = results(post(api, {"jobs": [sim(1, idempotency_key="before")]}))[0]["id"]
    queue_holds("sim", 11)
    items = [sim(1, idempotency_key="before"), sim(2), {"type": "report", "params": {}}]
    listed = results(post(api, {"jobs": items}))
    assert listed[0] == {"index": 0, "status": "existing", "id": before}
    assert listed[1]["status"] == "error"
    error = listed[1]["error"]
    assert error["code"] == "ERR-JOB-BACKPRESSURE"
    assert error["details"]["queue"] == "sim" and error["details"]["retry_after"] >= 1
    assert listed[2]["status"] == "created"
    assert Job.objects.count() == 2


def test_the_openapi_schema_documents_the_batch_create(client):
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/jobs/batch"]["post"]
    assert operation["operationId"] == "jobs_batch_create"
    assert {"200", "400", "413", "429"} <= set(operation["responses"])
    components = schema["components"]["schemas"]
    assert components["BatchResultStatusEnum"]["enum"] == ["created", "existing", "error"]
    assert "StatusEnum" in components  # the job's status keeps its name
    request = components["BatchCreateInputRequest"]["properties"]["jobs"]
    assert request["items"]["$ref"].endswith("/JobCreateInputRequest")
    # The body refuses fields besides `jobs` (400), and its schema says so: a client (and
    # the contract test) must not take an extra field for an accepted one.
    assert components["BatchCreateInputRequest"]["additionalProperties"] is False
    key = next(p for p in operation["parameters"] if p["name"] == "Idempotency-Key")
    assert key["schema"]["maxLength"] == 248
