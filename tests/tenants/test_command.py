"""`manage.py org ...` (docs/tenancy.md#the-org-command): each subcommand and its errors;
suspend and resume audited on the ops chain."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from audit.models import AuditLog
from tenants.models import DEFAULT_ORG_SLUG, ApiToken, Membership, Organisation, ServiceAccount
from tests.factories import OrganisationFactory, UserFactory

pytestmark = pytest.mark.django_db


def org(*args: str) -> str:
    out = io.StringIO()
    call_command("org", *args, stdout=out)
    return out.getvalue()


def ops(event_type: str) -> list[dict]:
    return [
        json.loads(e.payload)
        for e in AuditLog.objects.filter(chain="ops", event_type=event_type).order_by("seq")
    ]


def test_create_makes_an_organisation_once():
    assert "created organisation acme (ACME Ltd)" in org("create", "acme", "--name", "ACME Ltd")
    assert Organisation.objects.get(slug="acme").name == "ACME Ltd"
    with pytest.raises(CommandError, match="exists already"):
        org("create", "acme")
    with pytest.raises(CommandError, match="'no good'"):
        org("create", "no good")
    assert len(ops("org_created")) == 1


def test_add_member_adds_and_changes_roles():
    acme = OrganisationFactory(slug="acme")
    user = UserFactory(username="alice")
    assert "alice is a member of acme" in org("add-member", "acme", "alice")
    assert "alice is an admin of acme" in org("add-member", "acme", "alice", "--role", "admin")
    assert Membership.objects.get(user=user, organisation=acme).role == "admin"
    assert [e["event_type"] for e in ops("org_member_added")] == ["org_member_added"]
    assert len(ops("org_member_role_set")) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("add-member", "nope", "alice"), "No organisation 'nope'"),
        (("add-member", "acme", "nobody"), "No user 'nobody'"),
        (("suspend", "nope"), "No organisation 'nope'"),
        (("resume", "nope"), "No organisation 'nope'"),
        (("token", "nope", "ci"), "No organisation 'nope'"),
        (("token", "acme", "ci", "--scopes", "jobs:fly"), "Unknown scope"),
        (("token", "acme", "ci", "--expires-in", "soon"), "--expires-in"),
        (("token-revoke", "jo_zzzz"), "No token"),
        (("rotate", "nobody"), "No user 'nobody'"),
        (("tokens", "nope"), "No organisation 'nope'"),
    ],
)
def test_unknown_names_are_clear_errors(args, message):
    OrganisationFactory(slug="acme")
    UserFactory(username="alice")
    with pytest.raises(CommandError, match=message):
        org(*args)


def test_suspend_and_resume_are_audited_on_the_ops_chain_once_each():
    acme = OrganisationFactory(slug="acme")
    assert "suspended acme" in org("suspend", "acme")
    assert "acme was suspended" in org("suspend", "acme")
    acme.refresh_from_db()
    assert acme.suspended_at is not None
    assert "resumed acme" in org("resume", "acme")
    assert "was not suspended" in org("resume", "acme")
    acme.refresh_from_db()
    assert acme.suspended_at is None
    entries = AuditLog.objects.filter(chain="ops").order_by("seq")
    assert [(e.event_type, e.actor_type, e.actor_id) for e in entries] == [
        ("org_suspended", "system", "manage.py"),
        ("org_resumed", "system", "manage.py"),
    ]
    assert json.loads(entries[0].payload)["data"]["org_id"] == acme.pk


def test_token_makes_the_service_account_and_prints_a_working_key_once(broker):
    OrganisationFactory(slug="acme")
    out = org("token", "acme", "ci")
    assert "created service account acme:ci" in out
    key = next(line.split()[-1] for line in out.splitlines() if "key:" in line)
    account = ServiceAccount.objects.get(organisation__slug="acme", name="ci")
    token = ApiToken.objects.get(user=account.user)
    assert token.scopes == ["jobs:read", "jobs:write", "jobs:cancel"]  # not admin:dlq
    assert timedelta(days=89) < token.expires_at - timezone.now() <= timedelta(days=90)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/v1/jobs").status_code == 200
    # Again: the same account, a second token; --quiet prints the key alone.
    quiet = org("token", "acme", "ci", "--quiet", "--scopes", "jobs:read", "--expires-in", "1h")
    assert quiet.strip().startswith("jo_") and len(quiet.strip().split()) == 1
    assert ServiceAccount.objects.count() == 1 and ApiToken.objects.count() == 2
    newest = ApiToken.objects.first()
    assert newest.scopes == ["jobs:read"]
    assert newest.expires_at - timezone.now() <= timedelta(hours=1)
    never = org("token", "acme", "ci", "--expires-in", "never")
    assert "expires: never" in never


def test_the_default_ttl_is_a_setting(settings):
    settings.JOBOPS_TOKEN_DEFAULT_TTL = timedelta(days=7)
    OrganisationFactory(slug="acme")
    org("token", "acme", "ci", "--quiet")
    assert ApiToken.objects.get().expires_at - timezone.now() <= timedelta(days=7)


def test_token_revoke_by_prefix():
    OrganisationFactory(slug="acme")
    org("token", "acme", "ci", "--quiet")
    token = ApiToken.objects.get()
    assert f"revoked {token.prefix}" in org("token-revoke", token.prefix)
    assert "revoked already" in org("token-revoke", token.prefix)
    assert ApiToken.objects.get().revoked_at is not None


def test_rotate_swaps_a_legacy_token_for_an_expiring_one():
    user = UserFactory(username="alice")
    Token.objects.create(user=user)
    key = org("rotate", "alice", "--quiet").strip()
    assert key.startswith("jo_") and not Token.objects.filter(user=user).exists()
    assert ApiToken.objects.get(user=user).expires_at is not None


def test_rotate_without_a_legacy_token_makes_a_person_s_token_without_operator_scopes(broker):
    alice = UserFactory(username="alice")  # a plain member of the default organisation
    out = org("rotate", "alice")
    assert "alice had no legacy token: this is a new one" in out
    key = next(line.split()[-1] for line in out.splitlines() if "key:" in line)
    token = ApiToken.objects.get(user=alice)
    assert token.scopes == ["jobs:read", "jobs:write", "jobs:cancel"]  # never admin:dlq
    assert token.expires_at is not None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    created = client.post(
        "/api/v1/jobs", {"type": "sim", "params": {"steps": 1, "step_seconds": 0}}, format="json"
    )
    assert created.status_code == 201, created.content
    assert [e["data"]["user_id"] for e in ops("token_created")] == [alice.pk]
    # A member with a legacy token: rotated, still without the operators' scope.
    Token.objects.create(user=alice)
    org("rotate", "alice", "--quiet")
    assert not Token.objects.filter(user=alice).exists()
    assert "admin:dlq" not in ApiToken.objects.filter(user=alice).first().scopes


def test_rotate_tells_what_to_do_for_a_user_in_no_organisation():
    UserFactory(username="bob", org=False)
    with pytest.raises(CommandError, match=r"belongs to no organisation: add them first"):
        org("rotate", "bob")
    assert not ApiToken.objects.exists()


def test_list_and_tokens_show_organisations_and_tokens():
    OrganisationFactory(slug="acme")
    UserFactory(org=Organisation.objects.get(slug="acme"))
    org("suspend", "acme")
    org("token", "acme", "ci", "--quiet")
    rows = {r["slug"]: r for r in json.loads(org("list", "--json"))}
    assert rows["acme"]["members"] == 2 and rows["acme"]["suspended_at"]
    listing = org("list")
    assert "acme" in listing and "suspended" in listing
    tokens = org("tokens", "acme")
    assert ApiToken.objects.get().prefix in tokens and "svc-acme-ci" in tokens


def test_bootstrap_makes_the_default_organisation_and_its_first_admin():
    Organisation.objects.filter(slug=DEFAULT_ORG_SLUG).delete()
    admin = get_user_model().objects.create_superuser("root", "root@example.test", "pw")
    assert "root is an admin of default" in org("bootstrap")
    membership = Membership.objects.get(user=admin)
    assert (membership.organisation.slug, membership.role) == (DEFAULT_ORG_SLUG, "admin")
    assert "nothing to add" in org("bootstrap")  # idempotent
    assert Membership.objects.filter(user=admin).count() == 1
