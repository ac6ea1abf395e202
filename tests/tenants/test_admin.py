"""Tenancy in the portal (tenants/admin.py): the pages load for a superuser, stay shut
to the viewer and operator roles, and every change goes through the audited services."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditLog
from tenants.models import ApiToken, Membership, OperatorScope, Organisation, ServiceAccount
from tenants.services import service_account_create, token_create
from tests.factories import OrganisationFactory, ProjectFactory, UserFactory, otp_login, role_user

pytestmark = pytest.mark.django_db
BASE = "/admin/tenants"


def ops_entries(event_type: str) -> list[AuditLog]:
    return list(AuditLog.objects.filter(chain="ops", event_type=event_type))


@pytest.fixture
def fixtures():
    org = OrganisationFactory(slug="acme")
    ProjectFactory(organisation=org, slug="web")
    account = service_account_create(org=org, name="ci")
    token = token_create(user=account.user, name="ci").token
    scope = OperatorScope.objects.create(user=role_user("operator"))
    scope.organisations.add(org)
    return {
        "organisation": org,
        "project": org.projects.get(),
        "serviceaccount": account,
        "apitoken": token,
        "operatorscope": scope,
    }


@pytest.mark.parametrize(
    "model", ["organisation", "project", "serviceaccount", "apitoken", "operatorscope"]
)
def test_each_page_loads_for_a_superuser(otp_admin_client, fixtures, model):
    for url in (
        f"{BASE}/{model}/",
        f"{BASE}/{model}/add/",
        f"{BASE}/{model}/{fixtures[model].pk}/change/",
    ):
        assert otp_admin_client.get(url).status_code == 200, url


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_the_portal_roles_do_not_manage_tenants(role):
    client = otp_login(Client(), role_user(role))
    assert client.get(f"{BASE}/organisation/").status_code == 403
    assert client.get(f"{BASE}/apitoken/").status_code == 403


def test_the_token_page_never_shows_the_digest(otp_admin_client, fixtures):
    token = fixtures["apitoken"]
    page = otp_admin_client.get(f"{BASE}/apitoken/{token.pk}/change/")
    assert token.digest.encode() not in page.content
    assert token.prefix.encode() in page.content
    listing = otp_admin_client.get(f"{BASE}/apitoken/")
    assert token.digest.encode() not in listing.content and b"jobs:read" in listing.content


def test_a_token_made_in_the_admin_shows_its_key_once_and_works(otp_admin_client):
    user = UserFactory()
    response = otp_admin_client.post(
        f"{BASE}/apitoken/add/",
        {
            "name": "laptop",
            "user": user.pk,
            "scopes": ["jobs:read"],
            "expires_at_0": "2099-01-01",
            "expires_at_1": "00:00:00",
        },
        follow=True,
    )
    assert response.status_code == 200
    shown = " ".join(str(m) for m in get_messages(response.wsgi_request))
    key = re.search(r" is (jo_\S+) ", shown).group(1)
    token = ApiToken.objects.get(user=user)
    assert (token.name, token.scopes, token.expires_at.year) == ("laptop", ["jobs:read"], 2099)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/v1/jobs").status_code == 200
    assert api.post("/api/v1/jobs", {}, format="json").status_code == 403  # read-only
    entry = ops_entries("token_created")[-1]
    assert (entry.actor_type, entry.actor_id) == ("operator", str(otp_admin_client.user.pk))
    assert key.encode() not in otp_admin_client.get(f"{BASE}/apitoken/").content


def test_the_admin_refuses_admin_dlq_for_a_token_of_a_non_staff_user(otp_admin_client):
    user = UserFactory()
    response = otp_admin_client.post(
        f"{BASE}/apitoken/add/",
        {"name": "laptop", "user": user.pk, "scopes": ["jobs:read", "admin:dlq"]},
    )
    assert response.status_code == 200  # the form again, with the reason
    assert b"admin:dlq is for staff tokens" in response.content
    assert not ApiToken.objects.filter(user=user).exists()


def test_revoke_asks_then_revokes(otp_admin_client, fixtures):
    token = fixtures["apitoken"]
    asked = {"action": "revoke", "_selected_action": [token.pk]}
    page = otp_admin_client.post(f"{BASE}/apitoken/", asked)
    assert page.status_code == 200 and b"confirm-action" in page.content
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None
    otp_admin_client.post(f"{BASE}/apitoken/", {**asked, "confirm": "yes"})
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert ops_entries("token_revoked")[0].actor_type == "operator"


def test_suspend_and_resume_ask_then_act_audited_as_the_operator(otp_admin_client, fixtures):
    org = fixtures["organisation"]
    for action, event, suspended in (
        ("suspend", "org_suspended", True),
        ("resume", "org_resumed", False),
    ):
        asked = {"action": action, "_selected_action": [org.pk]}
        page = otp_admin_client.post(f"{BASE}/organisation/", asked)
        assert b"confirm-action" in page.content
        assert Organisation.objects.get(pk=org.pk).suspended is not suspended
        otp_admin_client.post(f"{BASE}/organisation/", {**asked, "confirm": "yes"})
        assert Organisation.objects.get(pk=org.pk).suspended is suspended
        entry = ops_entries(event)[0]
        assert (entry.actor_type, entry.actor_id) == ("operator", str(otp_admin_client.user.pk))
        assert json.loads(entry.payload)["data"]["org_id"] == org.pk


def test_a_service_account_made_in_the_admin_gets_its_user_and_membership(otp_admin_client):
    org = OrganisationFactory(slug="beta")
    otp_admin_client.post(f"{BASE}/serviceaccount/add/", {"organisation": org.pk, "name": "etl"})
    account = ServiceAccount.objects.get(organisation=org, name="etl")
    assert Membership.objects.get(user=account.user).organisation == org
    assert ops_entries("service_account_created")[0].actor_type == "operator"


def test_members_and_projects_added_inline_are_audited(otp_admin_client):
    org = OrganisationFactory(slug="gamma")
    user = UserFactory()
    form = {
        "slug": "gamma",
        "name": "Gamma",
        "projects-TOTAL_FORMS": "1",
        "projects-INITIAL_FORMS": "0",
        "projects-0-slug": "web",
        "projects-0-name": "Web",
        "memberships-TOTAL_FORMS": "1",
        "memberships-INITIAL_FORMS": "0",
        "memberships-0-user": str(user.pk),
        "memberships-0-role": "admin",
    }
    response = otp_admin_client.post(f"{BASE}/organisation/{org.pk}/change/", form)
    assert response.status_code == 302, response.content[:2000]
    assert Membership.objects.get(user=user, organisation=org).role == "admin"
    assert org.projects.get().slug == "web"
    assert ops_entries("org_member_added")[0].actor_type == "operator"
    assert ops_entries("project_created")[0].actor_type == "operator"
