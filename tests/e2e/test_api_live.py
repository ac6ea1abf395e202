"""The API under a live gunicorn: its OpenAPI contract (schemathesis) and a key race."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import schemathesis
from django.core.management import call_command
from hypothesis import HealthCheck, Phase, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import CHECKS as CHECKS_REGISTRY
from schemathesis.checks import load_all_checks
from schemathesis.config._checks import PositiveDataAcceptanceConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance

from audit.models import AuditLog
from core.api.otp import key_digest, otp_grant_issue
from core.json import json_problem
from jobs.models import Job
from tests.e2e.live_api import gunicorn_server
from tests.factories import role_user, totp_code, totp_device, worker_lost
from tests.queues import topology_declare_and_purge

# Schemathesis' full check set (all 12 of 4.1): besides no 500 and conformance, invalid
# input must be refused, valid input accepted, auth enforced, unknown methods refused,
# deleted resources gone.
load_all_checks()
CHECKS = CHECKS_REGISTRY.get_all()
MAX_JSON_DEPTH = 32  # JOBOPS_MAX_JSON_DEPTH's default, which the live server runs with


@pytest.fixture(scope="module")
def live_api(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock(), gunicorn_server(workers=3, threads=4) as base:
        yield base


@pytest.fixture
def token(transactional_db) -> str:
    """A committed operator's token holding a live OTP grant, so that the admin calls
    answer for real (a plain token would make every one of them a 401)."""
    user = role_user("operator")
    key = Token.objects.create(user=user).key
    otp_grant_issue(user=user, token_digest=key_digest(key), otp_token=totp_code(totp_device(user)))
    return key


@pytest.fixture(scope="module")
def api_schema(live_api):
    schema = schemathesis.openapi.from_url(f"{live_api}/api/v1/schema/?format=json")
    schema.config.update(base_url=live_api)
    schema.config.generation.update(
        modes=list(schemathesis.GenerationMode),
        database="none",
        # Auth is ours (a real token); generated cookies would only test gunicorn's parser.
        with_security_parameters=False,
        # Control characters in a header are refused by gunicorn's own parser (an HTML
        # 400 before Django runs): generating them tests gunicorn, not this API.
        exclude_header_characters="".join(map(chr, [*range(0, 9), *range(10, 32), 127])),
        no_shrink=True,
    )
    # Schema-valid input may still be refused for what a schema cannot say: a key reused
    # with other params (409), params whose work exceeds the type's bounds (422), the
    # rate limit (429). Any other 4xx for schema-valid input is a schema bug.
    schema.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(
        expected_statuses=["2xx", "401", "403", "404", "409", "413", "422", "429", "5xx"]
    )
    return schema


def test_schema_validates_without_warnings(tmp_path):
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "s.yml"))
    text = (tmp_path / "s.yml").read_text()
    for code in (
        "ERR-JOB-400", "ERR-JOB-404", "ERR-JOB-409", "ERR-JOB-413", "ERR-JOB-422",
        "ERR-JOB-IDEMPOTENCY-MISMATCH", "ERR-JOB-PARAMS-SECRET", "ERR-JOB-RATE-LIMIT",
        "ERR-JOB-BACKPRESSURE",
        "ERR-AUTH-401", "ERR-HTTP-415",
        "ERR-DLQ-400", "ERR-DLQ-401", "ERR-DLQ-403", "ERR-DLQ-404", "ERR-DLQ-422",
        "ERR-DLQ-429", "ERR-OTP-401", "/api/v1/admin/otp", "/api/v1/admin/dlq/{queue}/replay",
    ):  # fmt: skip
        assert code in text, code
    for status in ("'200'", "'201'", "'304'", "'400'", "'401'", "'404'", "'413'", "'422'", "'429'"):
        assert status in text, status


schema = schemathesis.pytest.from_fixture("api_schema")


def _contract_test(name: str, max_examples: int):
    """The contract test with `max_examples` generated cases (valid and invalid) per
    operation. Only Phase.generate: the explicit phase carries schemathesis' coverage
    cases, ~500 boundary requests that would take most of a minute on their own.
    derandomize: the same cases every run, so a red CI run can be reproduced locally."""

    @schema.parametrize()
    @settings(
        max_examples=max_examples,
        phases=[Phase.generate],
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @pytest.mark.django_db(transaction=True)
    def test(case, token):
        """No 500 and no response outside the schema, for generated valid and invalid
        input."""
        case.call_and_validate(
            headers={"Authorization": f"Token {token}"},
            checks=CHECKS,
            excluded_checks=[positive_data_acceptance] if _rightly_400(case) else [],
        )

    test.__name__ = test.__qualname__ = name
    return test


# A bounded sample in `make test` (its budget: docs/development.md#the-test-budget): 3
# cases an operation, every operation called, valid and invalid input among them (6 took
# 19 s under the coverage tracer, past the 15 s a test may take). The whole of it (25
# cases an operation) in `make test-heavy`, which CI runs too.
test_api_honours_its_openapi_contract = _contract_test("test_api_honours_its_openapi_contract", 3)
test_api_honours_its_openapi_contract_fully = pytest.mark.heavy(
    _contract_test("test_api_honours_its_openapi_contract_fully", 25)
)


def _rightly_400(case) -> bool:
    """Schema-valid input that docs/api.md#errors answers 400 for reasons no schema can state:
    a cursor that the server did not issue (an opaque token), an Idempotency-Key
    header that differs from the body's key, or a body past the JSON limits every body
    has (core.json: depth, NUL, lone surrogates; docs/api.md#creating-a-job)."""
    if "cursor" in (case.query or {}):
        return True
    if case.body is not None and json_problem(case.body, max_depth=MAX_JSON_DEPTH):
        return True
    header = (case.headers or {}).get("Idempotency-Key")
    body = case.body.get("idempotency_key") if isinstance(case.body, dict) else None
    return header is not None and body is not None and header.strip('"') != body


@pytest.mark.django_db(transaction=True)
def test_documented_happy_path_responses_match_the_schema(live_api, api_schema, token):
    """Schemathesis rarely hits an existing job by chance: walk one through every call."""
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    created = session.post(f"{live_api}/api/v1/jobs", json={"type": "sim", "params": {}})
    assert created.status_code == 201
    job_id = created.json()["id"]
    calls = [
        ("POST", "/api/v1/jobs", created),
        ("GET", "/api/v1/jobs", session.get(f"{live_api}/api/v1/jobs")),
        ("GET", "/api/v1/jobs/{job_id}", session.get(f"{live_api}/api/v1/jobs/{job_id}")),
        ("POST", "/api/v1/jobs/{job_id}/cancel",
         session.post(f"{live_api}/api/v1/jobs/{job_id}/cancel")),
    ]  # fmt: skip
    for method, path, response in calls:
        assert response.status_code in (200, 201), (method, path, response.text)
        api_schema[path][method].validate_response(response)
    not_modified = session.get(
        f"{live_api}/api/v1/jobs/{job_id}", headers={"If-None-Match": calls[-1][2].headers["ETag"]}
    )
    assert not_modified.status_code == 304 and not_modified.content == b""


@pytest.mark.django_db(transaction=True)
def test_documented_admin_responses_match_the_schema(live_api, api_schema, token):
    """Every admin call's success answers, validated against the schema: a dead letter
    peeked, dry-run, replayed; another discarded; a background replay read and stopped."""
    topology_declare_and_purge()
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    replayed, discarded = worker_lost(), worker_lost()
    base = f"{live_api}/api/v1/admin/dlq"
    one = {"justification": "INC-1", "job_ids": [str(replayed.id)]}
    calls = [
        ("GET", "/api/v1/admin/dlq", session.get(base)),
        ("GET", "/api/v1/admin/dlq/{queue}/peek", session.get(f"{base}/sim_dlq/peek")),
        ("POST", "/api/v1/admin/dlq/{queue}/replay",
         session.post(f"{base}/sim_dlq/replay", json={**one, "dry_run": True})),
        ("POST", "/api/v1/admin/dlq/{queue}/replay",
         session.post(f"{base}/sim_dlq/replay", json=one)),
        ("POST", "/api/v1/admin/dlq/{queue}/discard",
         session.post(f"{base}/sim_dlq/discard",
                      json={"justification": "dup", "job_ids": [str(discarded.id)]})),
    ]  # fmt: skip
    for method, path, response in calls:
        assert response.status_code == 200, (method, path, response.text)
        api_schema[path][method].validate_response(response)
    assert calls[3][2].json()["job_ids"] == [str(replayed.id)]
    more = [worker_lost() for _ in range(101)]  # above the background threshold (100)
    background = session.post(f"{base}/sim_dlq/discard", json={"justification": "bulk"})
    assert background.status_code == 202, background.text
    api_schema["/api/v1/admin/dlq/{queue}/discard"]["POST"].validate_response(background)
    operation = session.get(background.headers["Location"])
    api_schema["/api/v1/admin/dlq/operations/{operation_id}"]["GET"].validate_response(operation)
    stopped = session.post(f"{background.headers['Location']}/stop")
    api_schema["/api/v1/admin/dlq/operations/{operation_id}/stop"]["POST"].validate_response(
        stopped
    )
    assert stopped.json()["state"] == "stopped" and len(more) == 101


@pytest.mark.django_db(transaction=True)
def test_100_concurrent_posts_with_one_key_make_exactly_one_job(live_api, token):
    key = f"race-{uuid.uuid4()}"
    body = {"type": "sim", "params": {"steps": 2}, "idempotency_key": key}
    barrier = threading.Barrier(100)

    def submit(_: int) -> tuple[int, str]:
        with requests.Session() as session:
            session.headers["Authorization"] = f"Token {token}"
            barrier.wait()
            response = session.post(f"{live_api}/api/v1/jobs", json=body, timeout=60)
            return response.status_code, response.json().get("id", response.text)

    with ThreadPoolExecutor(max_workers=100) as pool:
        results = list(pool.map(submit, range(100)))
    statuses = sorted(status for status, _ in results)
    assert set(statuses) <= {200, 201}, statuses
    assert statuses.count(201) == 1
    assert len({job_id for _, job_id in results}) == 1
    job = Job.objects.get(idempotency_key=key)
    assert str(job.id) == results[0][1]
    assert AuditLog.objects.filter(job_id=job.id, event_type="created").count() == 1
