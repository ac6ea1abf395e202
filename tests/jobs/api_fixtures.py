"""Fixtures shared by the API tests (imported by test_api*.py, test_ratelimit.py)."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from jobs.redis_client import redis_client, redis_key
from tests.factories import StaffFactory, UserFactory


def client_for(user) -> APIClient:
    token, _ = Token.objects.get_or_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    client.user = user
    return client


@pytest.fixture
def user():
    return UserFactory()


@pytest.fixture
def api(user) -> APIClient:
    """A token-authenticated client for `user`."""
    return client_for(user)


@pytest.fixture
def other_api() -> APIClient:
    return client_for(UserFactory())


@pytest.fixture
def staff_api() -> APIClient:
    return client_for(StaffFactory())


@pytest.fixture
def clean_redis():
    """Forget rate-limit buckets and cached queue depths, before and after the test."""

    def wipe() -> None:
        client = redis_client()
        for pattern in ("ratelimit", "queue-depth"):
            keys = list(client.scan_iter(redis_key(pattern, "*")))
            if keys:
                client.delete(*keys)

    wipe()
    yield
    wipe()
