"""API tokens (docs/tenancy.md#service-accounts-and-tokens): the key stored only as a
digest, expiry and revocation, the legacy tokens, Bearer, scopes per endpoint, and a
service account's jobs audited as `service`."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from audit.models import AuditLog
from audit.services import job_chain
from jobs.models import Job
from jobs.services import artefact_save
from tenants.models import ALL_SCOPES, ApiToken, Scope
from tenants.services import (
    TenancyInputError,
    legacy_token_rotate,
    scopes_allowed,
    service_account_create,
    token_create,
    token_revoke,
)
from tests.factories import (
    OrganisationFactory,
    StaffFactory,
    UserFactory,
    client_for,
    make_job,
    role_user,
    totp_code,
    totp_device,
)

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs"
DLQ = "/api/v1/admin/dlq"
OTP = "/api/v1/admin/otp"
SIM = {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}


@pytest.fixture(autouse=True)
def _fresh_limits():
    cache.clear()  # throttles and OTP grants live in this run's Redis db


def keyed(key: str, keyword: str = "Token") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {key}")
    return client


def error(response) -> tuple[int, str, str]:
    body = response.json()["error"]
    return response.status_code, body["code"], body["message"]


def test_the_key_is_stored_only_as_its_digest_and_a_short_prefix():
    issued = token_create(user=UserFactory(), name="ci")
    row = ApiToken.objects.get(pk=issued.token.pk)
    assert issued.key.startswith("jo_") and len(issued.key) > 40
    assert row.digest == hashlib.sha256(issued.key.encode()).hexdigest()
    assert issued.key.startswith(row.prefix) and len(row.prefix) == 11
    stored = [str(v) for v in ApiToken.objects.filter(pk=row.pk).values_list().get()]
    assert issued.key not in stored
    assert row.scopes == ["jobs:read", "jobs:write", "jobs:cancel"]  # a member's
    logged = AuditLog.objects.get(chain="ops", event_type="token_created")
    assert issued.key not in logged.payload and row.prefix in logged.payload


def test_a_valid_token_authenticates_with_token_or_bearer(broker):
    user = UserFactory()
    issued = token_create(user=user, name="ci")
    for keyword in ("Token", "Bearer", "bearer"):
        response = keyed(issued.key, keyword).get(JOBS)
        assert response.status_code == 200, (keyword, response.content)
    created = keyed(issued.key, "Bearer").post(JOBS, SIM, format="json")
    assert created.status_code == 201, created.content
    assert Job.objects.get(id=created.json()["id"]).owner_id == user.pk


def test_an_unknown_key_is_401():
    assert error(keyed("jo_nothing-like-it").get(JOBS))[:2] == (401, "ERR-AUTH-401")


def test_an_expired_token_is_401_saying_it_expired():
    issued = token_create(
        user=UserFactory(), name="ci", expires_at=timezone.now() + timedelta(hours=1)
    )
    ApiToken.objects.filter(pk=issued.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = keyed(issued.key).get(JOBS)
    status, code, message = error(response)
    assert (status, code) == (401, "ERR-AUTH-401")
    assert "expired" in message
    assert response["WWW-Authenticate"] == "Token"


def test_a_revoked_token_is_401_at_once():
    issued = token_create(user=UserFactory(), name="ci")
    client = keyed(issued.key)
    assert client.get(JOBS).status_code == 200
    assert token_revoke(token=issued.token) is True
    assert token_revoke(token=issued.token) is False  # once
    status, code, message = error(client.get(JOBS))
    assert (status, code) == (401, "ERR-AUTH-401") and "revoked" in message
    assert AuditLog.objects.filter(chain="ops", event_type="token_revoked").count() == 1


def test_a_token_is_one_query_and_last_used_is_written_about_once_a_minute(
    django_assert_num_queries,
):
    issued = token_create(user=UserFactory(), name="ci")
    client = keyed(issued.key)
    client.get(JOBS)  # first use: records last_used_at
    first = ApiToken.objects.get(pk=issued.token.pk).last_used_at
    assert first is not None
    # The token and its user in one statement, then the memberships and the list.
    with django_assert_num_queries(3):
        assert client.get(JOBS).status_code == 200
    assert ApiToken.objects.get(pk=issued.token.pk).last_used_at == first
    ApiToken.objects.filter(pk=issued.token.pk).update(
        last_used_at=timezone.now() - timedelta(minutes=2)
    )
    client.get(JOBS)
    assert ApiToken.objects.get(pk=issued.token.pk).last_used_at > first


def test_a_legacy_token_keeps_every_scope(broker):
    user = role_user("operator")
    api = client_for(user)  # DRF's authtoken
    assert api.get(JOBS).status_code == 200
    job = api.post(JOBS, SIM, format="json").json()
    assert api.post(f"{JOBS}/{job['id']}/cancel").status_code == 200
    # admin:dlq too: refused for want of an OTP grant, not of a scope.
    assert error(api.get(DLQ))[1] == "ERR-DLQ-401"
    granted = api.post(OTP, {"otp_token": totp_code(totp_device(user))}, format="json")
    assert granted.status_code == 200
    assert api.get(DLQ).status_code == 200


def test_rotating_a_legacy_token_replaces_it_with_a_full_scope_api_token():
    user = StaffFactory()
    old = Token.objects.create(user=user).key
    issued = legacy_token_rotate(user=user, expires_at=timezone.now() + timedelta(days=1))
    assert not Token.objects.filter(user=user).exists()
    assert error(keyed(old).get(JOBS))[:2] == (401, "ERR-AUTH-401")
    assert keyed(issued.key).get(JOBS).status_code == 200
    assert issued.token.scopes == list(ALL_SCOPES)
    with pytest.raises(TenancyInputError):
        legacy_token_rotate(user=user)  # nothing left to rotate


def test_a_member_s_token_never_gets_the_operators_scope_a_staff_token_does():
    member = UserFactory()
    staff = StaffFactory()
    assert token_create(user=member, name="ci").token.scopes == [
        "jobs:read",
        "jobs:write",
        "jobs:cancel",
    ]
    assert token_create(user=staff, name="ops").token.scopes == list(ALL_SCOPES)
    with pytest.raises(TenancyInputError, match="admin:dlq is for staff tokens"):
        token_create(user=member, name="x", scopes=[Scope.JOBS_READ, Scope.ADMIN_DLQ])
    Token.objects.create(user=member)
    Token.objects.create(user=staff)
    rotated = legacy_token_rotate(user=member, expires_at=timezone.now() + timedelta(days=1))
    assert Scope.ADMIN_DLQ not in rotated.token.scopes
    rotated = legacy_token_rotate(user=staff, expires_at=timezone.now() + timedelta(days=1))
    assert rotated.token.scopes == list(ALL_SCOPES)


def test_unknown_or_no_scopes_are_refused():
    with pytest.raises(TenancyInputError, match="jobs:delete"):
        token_create(user=UserFactory(), name="x", scopes=["jobs:read", "jobs:delete"])
    with pytest.raises(TenancyInputError):
        token_create(user=UserFactory(), name="x", scopes=[])


# --- scopes ---------------------------------------------------------------------------


def _client_without(user, missing: str) -> APIClient:
    scopes = [s for s in scopes_allowed(user) if s != missing]
    return keyed(token_create(user=user, name="scoped", scopes=scopes).key)


def _job_with_artefact(owner) -> Job:
    job = make_job(owner=owner)
    artefact_save(job_id=job.id, kind="report", name="a.csv", data=b"a\n")
    return job


def _requests(job: Job):
    artefact = job.artefacts.get()
    return {
        Scope.JOBS_READ: [
            ("get", JOBS, None),
            ("get", f"{JOBS}/{job.id}", None),
            ("get", f"{JOBS}/{job.id}/artefacts/{artefact.id}", None),
        ],
        Scope.JOBS_WRITE: [("post", JOBS, SIM)],
        Scope.JOBS_CANCEL: [("post", f"{JOBS}/{job.id}/cancel", None)],
    }


@pytest.mark.parametrize("scope", [Scope.JOBS_READ, Scope.JOBS_WRITE, Scope.JOBS_CANCEL])
def test_each_jobs_endpoint_needs_its_scope(broker, scope):
    user = UserFactory()
    job = _job_with_artefact(user)
    without = _client_without(user, scope)
    with_only = keyed(token_create(user=user, name="only", scopes=[scope]).key)
    for method, url, body in _requests(job)[scope]:
        refused = getattr(without, method)(url, body, format="json")
        status, code, message = error(refused)
        assert (status, code) == (403, "ERR-AUTH-403"), (url, refused.content)
        assert scope in message and refused.json()["error"]["details"]["required_scope"] == scope
        allowed = getattr(with_only, method)(url, body, format="json")
        assert allowed.status_code in (200, 201), (url, allowed.content)


def test_the_admin_api_needs_admin_dlq_after_the_otp_grant():
    user = role_user("operator")
    device = totp_device(user)
    without = _client_without(user, Scope.ADMIN_DLQ)
    # Unverified callers hear 401 first, whatever their scopes.
    assert error(without.get(DLQ))[:2] == (401, "ERR-DLQ-401")
    # The grant binds to the ApiToken (keyed by its digest) ...
    assert without.post(OTP, {"otp_token": totp_code(device)}, format="json").status_code == 200
    status, code, message = error(without.get(DLQ))
    assert (status, code) == (403, "ERR-AUTH-403") and "admin:dlq" in message
    # ... and a token that has the scope gets through once it holds its own grant.
    with_scope = keyed(token_create(user=user, name="ops", scopes=[Scope.ADMIN_DLQ]).key)
    assert error(with_scope.get(DLQ))[:2] == (401, "ERR-DLQ-401")


def test_a_session_has_every_scope(otp_admin_client):
    assert otp_admin_client.get(JOBS).status_code == 200
    assert otp_admin_client.get(DLQ).status_code == 200


def test_every_api_view_declares_its_scope():
    """A new endpoint must say which scope it needs, else a read-only token could use it."""
    from django.urls import get_resolver

    from core.api.otp import OtpGrantApi

    def views(patterns):
        for p in patterns:
            if hasattr(p, "url_patterns"):
                yield from views(p.url_patterns)
            else:
                yield getattr(p.callback, "cls", None)

    api_views = {
        v
        for v in views(get_resolver().url_patterns)
        if v is not None and v.__module__.split(".")[0] in {"jobs", "dlq"}
    }
    assert len(api_views) >= 10
    assert all(getattr(v, "required_scope", None) for v in api_views), api_views
    assert not getattr(OtpGrantApi, "required_scope", None)  # a grant is no action


# --- service accounts -----------------------------------------------------------------


def test_a_service_token_creates_a_job_owned_by_the_account_and_audited_as_service(broker):
    org = OrganisationFactory()
    account = service_account_create(org=org, name="ci")
    assert not account.user.has_usable_password()
    issued = token_create(user=account.user, name="ci", scopes=[Scope.JOBS_WRITE])
    created = keyed(issued.key).post(JOBS, SIM, format="json")
    assert created.status_code == 201, created.content
    job = Job.objects.get(id=created.json()["id"])
    assert (job.owner_id, job.org_id) == (account.user.pk, org.pk)
    entry = AuditLog.objects.get(chain=job_chain(job.id), event_type="created")
    assert (entry.actor_type, entry.actor_id) == ("service", str(account.user.pk))


def test_the_openapi_schema_names_each_operations_scope(client):
    schema = client.get("/api/v1/schema/", {"format": "json"}).json()
    scopes = {
        (path, method): op.get("x-required-scope")
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    }
    assert scopes[("/api/v1/jobs", "get")] == "jobs:read"
    assert scopes[("/api/v1/jobs", "post")] == "jobs:write"
    assert scopes[("/api/v1/jobs/{job_id}/cancel", "post")] == "jobs:cancel"
    assert scopes[("/api/v1/admin/dlq", "get")] == "admin:dlq"
    assert scopes[("/api/v1/admin/otp", "post")] is None
    assert "403" in schema["paths"]["/api/v1/jobs/{job_id}"]["get"]["responses"]
