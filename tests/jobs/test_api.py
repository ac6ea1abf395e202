"""The jobs API of docs/api.md: create, read, list, cancel, artefacts, errors."""

from __future__ import annotations

import json
import uuid
from functools import partial

import pytest

from audit.models import AuditLog
from jobs.domain.states import Status
from jobs.models import Job
from jobs.services import artefact_save, job_claim, job_progress_write, job_retry
from tests.factories import (
    OperatorFactory,
    UserFactory,
    client_for,
    client_with_grant,
    fence_of,
    job_in_state,
    make_job,
)

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs"
BODY_KEYS = {
    "id", "type", "category", "queue", "org_id", "project_id", "status", "progress",
    "attempts", "max_attempts", "priority", "cancel_requested", "dead_letter_queue",
    "idempotency_key", "request_id", "correlation_id", "run_at", "created_at", "updated_at",
    "artefacts", "last_error", "result", "rerun_of",
}  # fmt: skip
SIM = {"type": "sim", "params": {"steps": 3, "step_seconds": 0}}


def post(client, body, **extra):
    return client.post(JOBS, body, format="json", **extra)


def error_code(response):
    return response.json()["error"]["code"]


def listed_ids(api, query):
    """The ids of the first page of the list with this query (a 200)."""
    response = api.get(JOBS, query)
    assert response.status_code == 200, response.content
    return {j["id"] for j in response.json()["results"]}


def all_pages(api, url):
    """The ids of every page from `url` on, following `next`, and how many pages."""
    seen, pages = [], 0
    while url:
        body = api.get(url).json()
        seen += [j["id"] for j in body["results"]]
        url, pages = body["next"], pages + 1
    return seen, pages


# --- create -----------------------------------------------------------------------


def test_create_answers_201_with_location_etag_and_the_job(api):
    response = post(api, {**SIM, "idempotency_key": "k-1"})
    assert response.status_code == 201
    body = response.json()
    job = Job.objects.get(id=body["id"])
    assert job.owner_id == api.user.pk and job.status == Status.PENDING
    assert response["Location"].endswith(f"/api/v1/jobs/{job.id}")
    assert response["ETag"] == job.etag == f'"{job.id}-{job.version}"'
    assert set(body) == BODY_KEYS
    assert body["progress"] == {
        "percent": 0, "step": None, "message": None, "updated_at": None, "attempt": None,
        "metrics": None,
    }  # fmt: skip
    assert body["artefacts"] == [] and body["last_error"] is None and body["result"] is None
    assert body["idempotency_key"] == "k-1"


def test_repeat_with_the_same_key_answers_200_with_the_same_body(api):
    first = post(api, {**SIM, "idempotency_key": "same"})
    again = post(api, {**SIM, "idempotency_key": "same"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert "Location" not in again
    assert Job.objects.filter(owner=api.user).count() == 1
    assert AuditLog.objects.filter(event_type="created").count() == 1


def test_idempotency_key_header_works_like_the_body_field(api):
    first = post(api, SIM, HTTP_IDEMPOTENCY_KEY="hdr-1")
    again = post(api, {**SIM, "idempotency_key": "hdr-1"})
    quoted = post(api, SIM, HTTP_IDEMPOTENCY_KEY='"hdr-1"')  # the IETF draft's sf-string form
    assert (first.status_code, again.status_code, quoted.status_code) == (201, 200, 200)
    assert first.json()["id"] == again.json()["id"] == quoted.json()["id"]


def test_header_and_body_keys_that_differ_are_refused_with_400(api):
    response = post(api, {**SIM, "idempotency_key": "a"}, HTTP_IDEMPOTENCY_KEY="b")
    assert response.status_code == 400
    assert error_code(response) == "ERR-JOB-400"
    assert "idempotency_key" in response.json()["error"]["details"]
    assert not Job.objects.exists()


def test_same_key_with_other_params_is_422_idempotency_mismatch(api):
    first = post(api, {**SIM, "idempotency_key": "k"})
    other = post(api, {"type": "sim", "params": {"steps": 4}, "idempotency_key": "k"})
    assert other.status_code == 422
    assert error_code(other) == "ERR-JOB-IDEMPOTENCY-MISMATCH"
    assert other.json()["error"]["details"]["job_id"] == first.json()["id"]
    assert Job.objects.count() == 1


def test_no_key_always_makes_a_new_job(api):
    assert post(api, SIM).status_code == 201
    assert post(api, SIM).status_code == 201
    assert Job.objects.count() == 2


@pytest.mark.parametrize("key", ["x" * 256, "", "caf\u00e9", "tab\there", "new\nline"], ids=repr)
def test_bad_idempotency_keys_get_400(api, key):
    response = post(api, {**SIM, "idempotency_key": key})
    assert response.status_code == 400, response.content
    assert error_code(response) == "ERR-JOB-400"
    assert not Job.objects.exists()


def test_a_255_character_key_is_accepted(api):
    assert post(api, {**SIM, "idempotency_key": "k" * 255}).status_code == 201


def test_unknown_type_is_400(api):
    response = post(api, {"type": "nope", "params": {}})
    assert response.status_code == 400
    assert error_code(response) == "ERR-JOB-400"
    assert "type" in response.json()["error"]["details"]


def test_params_failing_the_type_schema_are_422_with_per_field_details(api):
    response = post(api, {"type": "sim", "params": {"steps": 0, "bogus": 1}})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-422"
    assert set(error["details"]) == {"steps", "bogus"}


def test_params_that_are_not_an_object_are_422(api):
    response = post(api, {"type": "sim", "params": [1, 2]})
    assert response.status_code == 422
    assert error_code(response) == "ERR-JOB-422"


def test_a_body_over_256_kb_is_413_before_parsing(api, settings):
    big = "x" * (settings.JOBOPS_MAX_PAYLOAD_BYTES + 1)
    # Not even valid JSON: the size alone decides, the body is never parsed.
    response = api.post(JOBS, big, content_type="application/json")
    assert response.status_code == 413
    assert error_code(response) == "ERR-JOB-413"
    assert response.json()["error"]["details"]["limit"] == settings.JOBOPS_MAX_PAYLOAD_BYTES


def test_params_over_the_limit_are_413(api, settings):
    settings.JOBOPS_MAX_PAYLOAD_BYTES = 1000
    response = post(api, {"type": "ai", "params": {"text": "y" * 990}})
    assert response.status_code == 413
    assert error_code(response) == "ERR-JOB-413"


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        ('{"type": "sim", "params": {', "application/json", 400),  # malformed JSON
        ("", "application/json", 400),  # empty body: type and params missing
        ("[1, 2]", "application/json", 400),  # not an object
        ('"sim"', "application/json", 400),
        ("42", "application/json", 400),
        ("null", "application/json", 400),
        ("type=sim", "application/x-www-form-urlencoded", 415),
        ('{"type": "sim", "params": {}}', "text/plain", 415),
        ('{"type": "sim", "params": {}}', "", 415),
    ],
)
def test_malformed_bodies_get_a_clear_4xx_envelope(api, body, content_type, status):
    response = api.generic("POST", JOBS, body, content_type=content_type)
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    assert error["code"] == ("ERR-JOB-400" if status == 400 else "ERR-HTTP-415")
    assert error["message"]
    assert not Job.objects.exists()


def test_a_number_of_5000_digits_is_a_plain_400_without_python_internals(api):
    body = '{"type": "sim", "params": {"steps": 1' + "0" * 5000 + "}}"
    response = api.generic("POST", JOBS, body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "ERR-JOB-400",
        "message": "Malformed request body: The JSON body holds a number with more than "
        "4300 digits.",
        "details": {},
    }
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "content_type",
    [
        "multipart/form-data; boundary=x",
        "multipart/form-data",
        "application/x-www-form-urlencoded",
        "text/plain",
    ],
)
def test_a_form_content_type_is_415_even_without_a_body(api, content_type):
    response = api.generic("POST", JOBS, "", content_type=content_type)
    assert response.status_code == 415, response.content
    assert response.json()["error"]["code"] == "ERR-HTTP-415"
    assert not Job.objects.exists()


def test_no_body_and_no_content_type_is_a_400_naming_the_missing_fields(api):
    empty = api.post(JOBS)
    assert empty.status_code == 400
    assert set(empty.json()["error"]["details"]) == {"type", "params"}


@pytest.mark.parametrize(
    "extra",
    [{"status": "succeeded"}, {"attempts": 0}, {"owner": 1}, {"result": {}}, {"id": "x"}],
    ids=lambda e: next(iter(e)),
)
def test_server_fields_cannot_be_written(api, extra):
    response = post(api, {**SIM, **extra})
    assert response.status_code == 400
    assert error_code(response) == "ERR-JOB-400"
    assert list(response.json()["error"]["details"]) == list(extra)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"type": 5, "params": {}},
        {"type": ["sim"], "params": {}},
        {"type": "sim", "params": {}, "idempotency_key": 12},
        {"type": "sim", "params": {}, "idempotency_key": {"a": 1}},
        {"params": {}},
        {"type": "sim"},
    ],
)
def test_wrong_or_missing_field_types_are_400(api, body):
    response = post(api, body)
    assert response.status_code == 400, response.content
    assert error_code(response) == "ERR-JOB-400"


def test_a_sane_request_id_is_stored_and_returned(api):
    response = post(api, SIM, HTTP_X_REQUEST_ID="req-42.a:b")
    assert response["X-Request-ID"] == "req-42.a:b"
    assert Job.objects.get().request_id == "req-42.a:b"


def test_an_insane_request_id_is_replaced_by_a_generated_one(api):
    response = post(api, SIM, HTTP_X_REQUEST_ID="bad id\r\nX-Evil: 1" + "x" * 200)
    generated = response["X-Request-ID"]
    assert len(generated) == 32 and generated.isalnum()
    assert Job.objects.get().request_id == generated


def test_unauthenticated_requests_get_401_envelope(client):
    response = client.post(JOBS, SIM, content_type="application/json")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "ERR-AUTH-401"
    assert response["WWW-Authenticate"] == "Token"
    bad_token = client.get(JOBS, HTTP_AUTHORIZATION="Token not-a-token")
    assert bad_token.status_code == 401


@pytest.mark.parametrize(
    "key", ["x" * 41, "abc\x00def", "0" * 40], ids=["too-long", "nul", "unknown"]
)
def test_a_token_that_cannot_exist_is_a_401_envelope(client, key, django_assert_max_num_queries):
    # A key longer than any stored one, or holding a NUL, is refused without a query.
    with django_assert_max_num_queries(0 if len(key) != 40 else 1):
        response = client.get(JOBS, HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "ERR-AUTH-401"


def test_an_inactive_users_token_is_refused(api, user):
    assert api.get(JOBS).status_code == 200
    user.is_active = False
    user.save()
    response = api.get(JOBS)
    assert response.status_code == 401
    assert "inactive" in response.json()["error"]["message"].lower()


def test_session_authentication_works_too(client, user):
    client.force_login(user)
    response = client.post(JOBS, SIM, content_type="application/json")
    assert response.status_code == 201
    assert client.get(JOBS).json()["results"][0]["id"] == response.json()["id"]


def test_session_post_without_csrf_token_is_403(user):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(JOBS, SIM, content_type="application/json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "ERR-AUTH-403"


# --- read ----------------------------------------------------------------------------


def test_read_answers_the_design_body_with_a_strong_etag(api):
    job = make_job(owner=api.user)
    response = api.get(f"{JOBS}/{job.id}")
    assert response.status_code == 200
    assert response["ETag"] == f'"{job.id}-{job.version}"'
    assert set(response.json()) == BODY_KEYS
    assert response.json()["max_attempts"] == 6


def test_if_none_match_answers_304_without_a_body(api):
    job = make_job(owner=api.user)
    etag = api.get(f"{JOBS}/{job.id}")["ETag"]
    response = api.get(f"{JOBS}/{job.id}", HTTP_IF_NONE_MATCH=etag)
    assert response.status_code == 304
    assert response.content == b""
    assert response["ETag"] == etag and response["Cache-Control"] == "private, no-cache"
    assert "Content-Type" not in response  # nothing was rendered
    for header in (f"W/{etag}", f'"other", {etag}', "*"):
        assert api.get(f"{JOBS}/{job.id}", HTTP_IF_NONE_MATCH=header).status_code == 304


def test_304_path_reads_only_the_version(api, django_assert_num_queries):
    job = make_job(owner=api.user)
    artefact_save(job_id=job.id, kind="report", name="a.csv", data=b"a,b\n")
    etag = Job.objects.get(id=job.id).etag
    # One query authenticates the token, one reads the version: no body, no artefacts.
    with django_assert_num_queries(2) as captured:
        response = api.get(f"{JOBS}/{job.id}", HTTP_IF_NONE_MATCH=etag)
    assert response.status_code == 304
    assert "artefacts" not in captured.captured_queries[-1]["sql"]
    assert '"jobs"."params"' not in captured.captured_queries[-1]["sql"]


def test_a_200_reads_the_job_with_its_artefacts_in_one_query(api, django_assert_num_queries):
    job = make_job(owner=api.user)
    artefact_save(job_id=job.id, kind="report", name="b.csv", data=b"b\n")
    artefact_save(job_id=job.id, kind="report", name="a.csv", data=b"a,b\n")
    # One query authenticates the token, one reads the job and its artefacts.
    with django_assert_num_queries(2):
        body = api.get(f"{JOBS}/{job.id}").json()
    assert [(a["name"], a["size"]) for a in body["artefacts"]] == [("a.csv", 4), ("b.csv", 2)]
    assert all(a["url"].endswith(f"/artefacts/{a['id']}") for a in body["artefacts"])


def test_the_read_answers_what_the_orm_reads(api, staff_api, other_api):
    """The prepared read of a job converts every column exactly as the ORM does."""
    from jobs.selectors import job_get_for_user

    job = job_in_state("succeeded", owner=api.user)
    Job.objects.filter(id=job.id).update(
        result={"rows": [1, 2.5, None], "nested": {"ok": True}}, request_id="req-1"
    )
    artefact_save(job_id=job.id, kind="report", name="r.csv", data=b"x\n")
    orm = Job.objects.get(id=job.id)
    read = job_get_for_user(job_id=job.id, user=api.user)
    fields = [f.attname for f in Job._meta.concrete_fields]
    assert {f: getattr(read, f) for f in fields} == {f: getattr(orm, f) for f in fields}
    assert not read._state.adding and read._state.db == "default"
    assert [a.name for a in read.artefact_list] == ["r.csv"]
    assert staff_api.get(f"{JOBS}/{job.id}").json() == api.get(f"{JOBS}/{job.id}").json()
    assert other_api.get(f"{JOBS}/{job.id}").status_code == 404


@pytest.mark.parametrize(
    "state", ["pending", "queued", "running", "retrying", "succeeded", "failed", "cancelled"]
)
def test_the_job_body_is_what_its_serializer_answers(state, rf):
    """The answers build the body directly (job_representation); the serializer is the
    schema. They must agree for a job in every state, artefacts and errors included."""
    from jobs.api.serializers import JobOutputSerializer
    from jobs.selectors.representation import job_representation

    job = job_in_state(state)
    if state == "running":
        job_progress_write(job_id=job.id, fence=fence_of(job), percent=40, step="s", message="m")
    artefact_save(job_id=job.id, kind="report", name="z.csv", data=b"z\n")
    artefact_save(job_id=job.id, kind="log", name="a.txt", data=b"a")
    job = Job.objects.prefetch_related("artefacts").get(id=job.id)
    request = rf.get("/", HTTP_HOST="testserver")
    expected = JobOutputSerializer(job, context={"request": request}).data
    assert json.loads(json.dumps(job_representation(job, request))) == json.loads(
        json.dumps(expected)
    )
    assert list(job_representation(job, request)) == list(expected)


def test_progress_names_the_attempt_it_belongs_to_and_a_retry_starts_from_zero(api):
    job = make_job(owner=api.user)
    assert api.get(f"{JOBS}/{job.id}").json()["progress"]["attempt"] is None  # not run yet
    first = fence_of(job_claim(job_id=job.id, locked_by="w1"))
    job_progress_write(job_id=job.id, fence=first, percent=99, step="9900/10000", message=None)
    progress = api.get(f"{JOBS}/{job.id}").json()["progress"]
    assert (progress["percent"], progress["step"], progress["attempt"]) == (99, "9900/10000", 1)
    job_retry(job_id=job.id, fence=first, delay=0, error_code="TIME_LIMIT", error_message="x")
    second = fence_of(job_claim(job_id=job.id, locked_by="w2"))
    progress = api.get(f"{JOBS}/{job.id}").json()["progress"]
    assert progress == {
        "percent": 0, "step": None, "message": None, "updated_at": None, "attempt": 2,
        "metrics": None,
    }  # fmt: skip
    job_progress_write(job_id=job.id, fence=second, percent=2, step="200/10000", message=None)
    body = api.get(f"{JOBS}/{job.id}").json()
    assert (body["progress"]["percent"], body["progress"]["attempt"]) == (2, 2)
    assert body["max_attempts"] == 6
    listed = api.get(JOBS).json()["results"][0]
    assert listed["progress"] == body["progress"]  # the list answers the same body


def test_the_openapi_schema_documents_progress_attempt(client):
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json")
    properties = schema.json()["components"]["schemas"]["Progress"]["properties"]
    assert properties["attempt"]["nullable"] is True
    assert "attempt this progress belongs to" in properties["attempt"]["description"]


def test_etag_changes_when_progress_moves(api):
    job = make_job(owner=api.user)
    etag = api.get(f"{JOBS}/{job.id}")["ETag"]
    claimed = job_claim(job_id=job.id, locked_by="w1")
    moved = api.get(f"{JOBS}/{job.id}", HTTP_IF_NONE_MATCH=etag)
    assert moved.status_code == 200
    etag = moved["ETag"]
    assert api.get(f"{JOBS}/{job.id}", HTTP_IF_NONE_MATCH=etag).status_code == 304
    # A progress write by the worker's own service: it bumps the version.
    job_progress_write(job_id=job.id, fence=fence_of(claimed), percent=40, step=None, message=None)
    response = api.get(f"{JOBS}/{job.id}", HTTP_IF_NONE_MATCH=etag)
    assert response.status_code == 200
    assert response.json()["progress"]["percent"] == 40
    assert response["ETag"] != etag


def test_last_error_and_result_are_rendered(api):
    job = make_job(owner=api.user)
    Job.objects.filter(id=job.id).update(
        last_error_code="NETWORK", last_error_message="timeout", result={"rows": 3}
    )
    body = api.get(f"{JOBS}/{job.id}").json()
    assert body["last_error"] == {"code": "NETWORK", "message": "timeout"}
    assert body["result"] == {"rows": 3}


def test_unknown_or_malformed_ids_are_404_envelopes(api):
    for path in (f"{JOBS}/{uuid.uuid4()}", f"{JOBS}/not-a-uuid", "/api/v1/nothing-here"):
        response = api.get(path)
        assert response.status_code == 404, path
        assert response["Content-Type"] == "application/json"
        assert response.json()["error"]["code"] == "ERR-JOB-404"


def test_paths_answer_with_and_without_trailing_slash(api):
    job = make_job(owner=api.user)
    assert api.get(f"{JOBS}/").status_code == 200
    assert api.get(f"{JOBS}/{job.id}/").status_code == 200
    assert api.post(f"{JOBS}/", SIM, format="json").status_code == 201
    assert api.post(f"{JOBS}/{job.id}/cancel/").status_code == 200


def test_unsupported_method_is_405_envelope(api):
    response = api.put(JOBS, SIM, format="json")
    assert response.status_code == 405
    assert error_code(response) == "ERR-HTTP-405"


# --- access: owner or staff, anyone else 404 ---------------------------------------------


def test_another_users_job_is_404_for_read_cancel_and_artefact(api, other_api):
    job = make_job(owner=api.user)
    artefact = artefact_save(job_id=job.id, kind="report", name="r.csv", data=b"x")
    for response in (
        other_api.get(f"{JOBS}/{job.id}"),
        other_api.post(f"{JOBS}/{job.id}/cancel"),
        other_api.get(f"{JOBS}/{job.id}/artefacts/{artefact.id}"),
    ):
        assert response.status_code == 404
        assert error_code(response) == "ERR-JOB-404"
    assert Job.objects.get(id=job.id).cancel_requested is False
    assert other_api.get(JOBS).json()["results"] == []


def test_staff_see_read_cancel_and_download_any_job(api, staff_api):
    job = make_job(owner=api.user)
    artefact = artefact_save(job_id=job.id, kind="report", name="r.csv", data=b"x")
    assert staff_api.get(f"{JOBS}/{job.id}").status_code == 200
    assert staff_api.get(f"{JOBS}/{job.id}/artefacts/{artefact.id}").status_code == 200
    # Cancelling another user's job takes the operator's permission (test_permissions.py).
    operator_api = client_with_grant(OperatorFactory())
    assert operator_api.post(f"{JOBS}/{job.id}/cancel").json()["status"] == "cancelled"
    assert [j["id"] for j in staff_api.get(JOBS).json()["results"]] == [str(job.id)]


# --- list ------------------------------------------------------------------------------


def test_list_shows_only_the_callers_jobs_newest_first(api):
    mine = [make_job(owner=api.user) for _ in range(3)]
    make_job(owner=UserFactory())
    body = api.get(JOBS).json()
    assert [j["id"] for j in body["results"]] == [str(j.id) for j in reversed(mine)]


def test_list_filters_by_status_type_and_created_after(api):
    sim = make_job(owner=api.user)
    report = make_job(owner=api.user, job_type="report", params={})
    api.post(f"{JOBS}/{sim.id}/cancel")

    ids = partial(listed_ids, api)

    assert ids({"status": "cancelled"}) == {str(sim.id)}
    assert ids({"type": "report"}) == {str(report.id)}
    assert ids({"created_after": sim.created_at.isoformat()}) == {str(report.id)}
    assert ids({"status": "pending", "type": "sim"}) == set()


@pytest.mark.parametrize(
    "query",
    [
        {"status": "nope"},
        {"type": "x"},
        {"created_after": "yesterday"},
        {"cursor": "zz"},
        {"page_size": "ten"},
        {"page_size": ""},
    ],
)
def test_bad_list_filters_are_400(api, query):
    response = api.get(JOBS, query)
    assert response.status_code == 400
    assert error_code(response) == "ERR-JOB-400"


def test_list_filters_by_category_alone_and_with_the_other_filters(api):
    sim = make_job(owner=api.user)
    report = make_job(owner=api.user, job_type="report", params={})
    erp = make_job(owner=api.user, job_type="erp", params={"event": "order.created"})
    make_job(owner=UserFactory(), job_type="erp", params={"event": "order.created"})
    api.post(f"{JOBS}/{sim.id}/cancel")

    ids = partial(listed_ids, api)

    assert ids({"category": "planning"}) == {str(sim.id)}
    assert ids({"category": "import_export"}) == {str(report.id)}
    assert ids({"category": "notification"}) == {str(erp.id)}
    assert ids({"category": "maintenance"}) == set()
    assert ids({"category": "audit_enrichment"}) == set()
    assert ids({"category": "planning", "status": "cancelled"}) == {str(sim.id)}
    assert ids({"category": "planning", "status": "pending"}) == set()
    assert ids({"category": "planning", "type": "report"}) == set()
    assert ids({"category": "notification", "created_after": sim.created_at.isoformat()}) == {
        str(erp.id)
    }
    body = api.get(f"{JOBS}/{erp.id}").json()
    assert (body["type"], body["category"]) == ("erp", "notification")


@pytest.mark.parametrize("category", ["planing", "Planning", "report"])
def test_an_unknown_category_is_400_naming_the_valid_ones(api, category):
    response = api.get(JOBS, {"category": category})
    assert response.status_code == 400
    assert error_code(response) == "ERR-JOB-400"
    assert response.json()["error"]["details"]["category"] == [
        f'"{category}" is not a category; one of: planning, import_export, notification, '
        "maintenance, audit_enrichment."
    ]


def test_a_category_filtered_list_pages_with_a_cursor(api):
    made = {str(make_job(owner=api.user).id) for _ in range(5)}
    for _ in range(3):
        make_job(owner=api.user, job_type="report", params={})
    seen, pages = all_pages(api, f"{JOBS}?page_size=2&category=planning")
    assert pages == 3
    assert seen == sorted(made, reverse=True)  # newest first: ids are time-ordered


def test_list_pages_with_a_cursor(api):
    made = {str(make_job(owner=api.user).id) for _ in range(5)}
    seen, pages = all_pages(api, f"{JOBS}?page_size=2")
    assert pages == 3
    assert len(seen) == 5 and set(seen) == made


# --- cancel -----------------------------------------------------------------------------


def test_cancel_cancels_a_pending_job_and_is_idempotent(api):
    job = make_job(owner=api.user)
    first = api.post(f"{JOBS}/{job.id}/cancel")
    again = api.post(f"{JOBS}/{job.id}/cancel")
    assert (first.status_code, again.status_code) == (200, 200)
    assert first.json()["status"] == again.json()["status"] == "cancelled"
    assert first.json()["cancel_requested"] is True
    assert first["ETag"] == again["ETag"]
    events = AuditLog.objects.filter(job_id=job.id).values_list("event_type", flat=True)
    assert list(events.order_by("seq")) == ["created", "cancel_requested", "cancelled"]


def test_cancel_of_a_running_job_only_raises_the_flag(api):
    job = job_in_state("running", owner=api.user)
    body = api.post(f"{JOBS}/{job.id}/cancel").json()
    assert body["status"] == "running" and body["cancel_requested"] is True


def test_cancel_of_a_finished_job_answers_200_and_changes_nothing(api):
    job = job_in_state("succeeded", owner=api.user)
    before = Job.objects.get(id=job.id).version
    response = api.post(f"{JOBS}/{job.id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "succeeded"
    assert response.json()["cancel_requested"] is False
    assert Job.objects.get(id=job.id).version == before


# --- artefacts -----------------------------------------------------------------------------


def test_artefacts_are_listed_with_urls_and_download_as_files(api):
    job = make_job(owner=api.user)
    artefact_save(job_id=job.id, kind="report", name="jobs.csv", data=b"id,status\n",
                  content_type="text/csv")  # fmt: skip
    body = api.get(f"{JOBS}/{job.id}").json()
    (listed,) = body["artefacts"]
    assert listed["name"] == "jobs.csv" and listed["size"] == 10
    assert len(listed["sha256"]) == 64
    assert listed["url"].endswith(f"/api/v1/jobs/{job.id}/artefacts/{listed['id']}")
    response = api.get(listed["url"])
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv"
    assert 'filename="jobs.csv"' in response["Content-Disposition"]
    assert b"".join(response.streaming_content) == b"id,status\n"


def test_another_jobs_artefact_id_is_404(api):
    job, other = make_job(owner=api.user), make_job(owner=api.user)
    artefact = artefact_save(job_id=other.id, kind="k", name="n.txt", data=b"x")
    response = api.get(f"{JOBS}/{job.id}/artefacts/{artefact.id}")
    assert response.status_code == 404
    assert error_code(response) == "ERR-JOB-404"


# --- the exception handler ------------------------------------------------------------------


def test_unexpected_exceptions_are_not_swallowed():
    from core.api.exceptions import exception_handler

    assert exception_handler(ValueError("boom"), {}) is None


def test_django_400_404_and_500_handlers_answer_json_for_api_paths(rf):
    from core.api.exceptions import api_handler400, api_handler404, api_handler500

    bad = api_handler400(rf.get("/api/v1/jobs"), Exception())
    assert bad.status_code == 400
    assert json.loads(bad.content)["error"]["code"] == "ERR-HTTP-400"

    not_found = api_handler404(rf.get("/api/v1/x"), Exception())
    assert not_found.status_code == 404
    assert json.loads(not_found.content)["error"]["code"] == "ERR-JOB-404"
    server = api_handler500(rf.get("/api/v1/x"))
    assert server.status_code == 500
    assert json.loads(server.content)["error"]["code"] == "ERR-SERVER-500"
    assert api_handler404(rf.get("/elsewhere"), Exception())["Content-Type"].startswith("text/html")


def test_client_for_helper_makes_distinct_tokens():
    a, b = client_for(UserFactory()), client_for(UserFactory())
    assert a._credentials != b._credentials


def test_the_request_id_is_bound_to_every_log_line_of_the_request(api, json_log_lines):
    import structlog

    job_id = post(api, SIM, HTTP_X_REQUEST_ID="trace-me").json()["id"]
    structlog.get_logger("tests").info("after_the_request")

    *during, after = json_log_lines()
    assert any(line["event"] == "job_created" and line["job_id"] == job_id for line in during)
    assert all(line["request_id"] == "trace-me" for line in during), during
    assert after["event"] == "after_the_request" and "request_id" not in after


def test_a_disallowed_host_on_an_api_path_is_a_json_400(client):
    response = client.get("/api/v1/jobs", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "ERR-HTTP-400"


def test_schema_and_docs_are_served_without_credentials(client):
    schema = client.get("/api/v1/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    assert "/api/v1/jobs/{job_id}/artefacts/{artefact_id}" in text
    assert "/api/v1/jobs/:" not in text  # the slashed aliases are not documented twice
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
