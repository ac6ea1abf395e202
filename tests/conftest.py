"""Suite-wide fixtures. Every test talks to the real PostgreSQL, RabbitMQ and Redis."""

from __future__ import annotations

import time

import pytest
from django.db import OperationalError
from django.db.backends.postgresql.operations import DatabaseOperations
from psycopg.errors import DeadlockDetected

# `broker` fixture (topology declared, queues purged) for every test package.
pytest_plugins = ["tests.workers"]

APPEND_ONLY_TABLES = ("audit_logs", "audit_checkpoints")
FLUSH_ATTEMPTS = 5


@pytest.fixture(autouse=True, scope="session")
def _allow_flush_of_append_only_tables():
    """pytest-django empties tables with TRUNCATE after transactional tests.

    The audit triggers refuse TRUNCATE, as they must in production. For the flush
    only, and as the table owner, disable the user triggers around it; they are
    re-enabled in the same transaction, so no other statement ever runs without them.
    """
    original = DatabaseOperations.execute_sql_flush

    def execute_sql_flush(self, sql_list):
        disable = [f"ALTER TABLE {t} DISABLE TRIGGER USER" for t in APPEND_ONLY_TABLES]
        enable = [f"ALTER TABLE {t} ENABLE TRIGGER USER" for t in APPEND_ONLY_TABLES]
        # A module-scoped worker or dispatcher keeps polling the tables while the flush
        # takes its exclusive locks one table at a time: PostgreSQL may break the
        # resulting deadlock by aborting the flush. The flush is all-or-nothing (one
        # transaction), so trying it again is safe.
        for attempt in range(FLUSH_ATTEMPTS):
            try:
                return original(self, [*disable, *sql_list, *enable])
            except OperationalError as exc:
                if not isinstance(exc.__cause__, DeadlockDetected) or attempt + 1 == FLUSH_ATTEMPTS:
                    raise
                time.sleep(0.2)

    DatabaseOperations.execute_sql_flush = execute_sql_flush
    yield
    DatabaseOperations.execute_sql_flush = original


@pytest.fixture
def otp_admin_client(client):
    """A client logged in as a superuser whose session passed OTP verification."""
    from django_otp import DEVICE_ID_SESSION_KEY
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from tests.factories import UserFactory

    user = UserFactory(username="otp-admin", is_staff=True, is_superuser=True)
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    client.force_login(user)
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = device.persistent_id
    session.save()
    client.user = user
    return client
