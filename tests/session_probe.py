"""Not collected by the suite (no `test_` prefix): tests/test_session_cleanup.py runs it
in a pytest of its own, which makes a Redis key and uses its vhost, so that what that
session removes at its end can be checked from outside."""

from __future__ import annotations

import os
from urllib.parse import quote, urlsplit

from django.conf import settings
from kombu import Connection

from core.kv import redis_client


def test_makes_a_redis_key_on_its_own_vhost():
    redis_client().set(os.environ["PROBE_KEY"], "made by the probe session")
    with Connection(settings.BROKER_URL, connect_timeout=10) as conn:
        conn.connect()  # the vhost exists while the session runs
    # The vhost as the URL names it: "//" is the default vhost "/", quoted as "%2F".
    assert quote(urlsplit(settings.BROKER_URL).path[1:], safe="") == os.environ["PROBE_VHOST"]
