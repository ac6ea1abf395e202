"""Fixtures of the jobs tests: API clients and a Redis without rate-limit state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from jobs.integrations.backpressure import queue_depths_forget
from jobs.integrations.redis_client import redis_client, redis_key
from tests.factories import StaffFactory, UserFactory, client_for, client_with_grant, role_user


@pytest.fixture
def user() -> Any:
    return UserFactory()


@pytest.fixture
def api(user: Any) -> APIClient:
    """A token-authenticated client for `user`."""
    return client_for(user)


@pytest.fixture
def other_api() -> APIClient:
    return client_for(UserFactory())


@pytest.fixture
def staff_api() -> APIClient:
    """A viewer's token holding a live OTP grant: staff powers on the public API."""
    return client_with_grant(role_user("viewer"))


@pytest.fixture
def staff_api_without_grant() -> APIClient:
    """A staff token with no OTP grant: the public API treats it as its plain user."""
    return client_for(StaffFactory())


@pytest.fixture
def clean_redis() -> Iterator[None]:
    """Forget rate-limit buckets and cached queue depths (in Redis and in this process),
    before and after the test."""

    def wipe() -> None:
        queue_depths_forget()
        client = redis_client()
        for pattern in ("ratelimit", "queue-depth"):
            keys = list(client.scan_iter(redis_key(pattern, "*")))
            if keys:
                client.delete(*keys)

    wipe()
    yield
    wipe()
