"""Fixtures of the Python client's tests (clients/python): a live jobops under gunicorn,
one per module, and a service account's token for it."""

from __future__ import annotations

import json

import pytest

from tenants.services import service_account_get_or_create, token_create
from tests.e2e.live_api import gunicorn_server
from tests.factories import OrganisationFactory
from tests.jobs.conftest import clean_redis  # noqa: F401 (a fixture, used by name)

# The per-user create limit the live server runs with: 30 a minute, one each 2 s, so
# that a test spends the allowance with one batch and hears a 429 of a second or two.
RATE_LIMITS = {"create_per_user": 30}


@pytest.fixture(scope="module")
def live_api(django_db_setup, django_db_blocker):
    env = {"JOBOPS_TEST_RATE_LIMITS": json.dumps(RATE_LIMITS)}
    with django_db_blocker.unblock(), gunicorn_server(workers=1, threads=4, env=env) as base:
        yield base


@pytest.fixture
def account(transactional_db):
    """A committed service account of a new organisation, and a token of it."""
    org = OrganisationFactory(slug="acme")
    service, _ = service_account_get_or_create(org=org, name="ci")
    issued = token_create(
        user=service.user, name="ci", scopes=["jobs:read", "jobs:write", "jobs:cancel"]
    )
    return service.user, issued.key
