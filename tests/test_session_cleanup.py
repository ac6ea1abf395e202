"""A test session removes what it made when it ends: an xdist worker's vhost and the
Redis keys made meanwhile, never a vhost it did not derive for itself nor a key that
was there before it (tests/conftest.py, docs/development.md#parallel-test-workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from types import SimpleNamespace
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from amqp.exceptions import NotAllowed
from django.conf import settings
from kombu import Connection

from config.settings_test import xdist_worker_urls
from core.kv import redis_client
from tests import conftest
from tests.processes import ROOT

# What a pytest started here must not inherit: being an xdist worker already.
XDIST_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "JOBOPS_TEST_XDIST_WORKER")


def _session(broker_url: str, vhost: str, key: str, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in XDIST_ENV}
    env |= {"BROKER_URL": broker_url, "REDIS_URL": settings.REDIS_URL}
    env |= {"PROBE_KEY": key, "PROBE_VHOST": quote(vhost, safe="")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/session_probe.py",
            "-q",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _vhost_exists(url: str) -> bool:
    try:
        with Connection(url, connect_timeout=10) as conn:
            conn.connect()
    except NotAllowed:  # "vhost ... not found"
        return False
    return True


# Two pytest start-ups (the xdist controller and its worker, about 5 s each here) and
# three rabbitmqctl runs: over the 15 s of `make test` on a loaded machine.
@pytest.mark.heavy
def test_an_xdist_session_removes_its_vhost_and_the_redis_keys_it_made():
    base = f"jobops_probe_{uuid.uuid4().hex[:8]}"
    broker = urlunsplit(urlsplit(settings.BROKER_URL)._replace(path=f"/{base}"))
    derived, redis_url = xdist_worker_urls("gw0", broker, settings.REDIS_URL)
    assert redis_url == settings.REDIS_URL  # gw0 works on this session's db
    vhost = derived.rsplit("/", 1)[1]
    kept, made = f"probe-kept-{uuid.uuid4().hex}", f"probe-made-{uuid.uuid4().hex}"
    redis_client().set(kept, "here before the session")
    try:
        _session(broker, vhost, made, "-n", "1")
        assert not _vhost_exists(derived)
        assert redis_client().get(made) is None
        assert redis_client().get(kept) is not None
    finally:
        redis_client().delete(kept)
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True)


# A pytest start-up (5 s and more here, more under coverage): the in-process case below
# runs the same hooks in `make test`.
@pytest.mark.heavy
def test_a_plain_session_keeps_the_vhost_of_its_environment():
    own = urlsplit(settings.BROKER_URL).path[1:]
    kept, made = f"probe-kept-{uuid.uuid4().hex}", f"probe-made-{uuid.uuid4().hex}"
    redis_client().set(kept, "here before the session")
    try:
        _session(settings.BROKER_URL, own, made)
        assert _vhost_exists(settings.BROKER_URL)  # not the session's to delete
        assert redis_client().get(made) is None
        assert redis_client().get(kept) is not None
    finally:
        redis_client().delete(kept)


def _hooks_session(*, xdist_worker: bool) -> SimpleNamespace:
    """What the hooks read of a pytest session: an xdist worker's has `workerinput`."""
    config = SimpleNamespace(option=SimpleNamespace(numprocesses=None), stash=pytest.Stash())
    if xdist_worker:
        config.workerinput = {"workerid": "gw0"}
    return SimpleNamespace(config=config)


def test_a_worker_sessions_hooks_make_and_remove_its_vhost_and_the_redis_keys_it_made(settings):
    """The hooks of the heavy tests above, in this process (for `make test`):
    pytest_sessionstart of a session whose settings derived its vhost creates it and
    notes the Redis keys; pytest_sessionfinish deletes the vhost and the keys made
    since, and keeps those that were there before."""
    vhost = f"jobops_probe_{uuid.uuid4().hex[:8]}_gw0"
    url = urlunsplit(urlsplit(settings.BROKER_URL)._replace(path=f"/{vhost}"))
    settings.BROKER_URL, settings.TEST_XDIST_DERIVED = url, True
    session = _hooks_session(xdist_worker=True)
    kept, made = f"probe-kept-{uuid.uuid4().hex}", f"probe-made-{uuid.uuid4().hex}"
    redis_client().set(kept, "here before the session")
    try:
        conftest.pytest_sessionstart(session)
        assert _vhost_exists(url)
        redis_client().set(made, "made by the session")
        conftest.pytest_sessionfinish(session)
        assert not _vhost_exists(url)
        assert redis_client().get(made) is None
        assert redis_client().get(kept) is not None
    finally:
        redis_client().delete(kept, made)
        if _vhost_exists(url):  # the hook failed to: not left behind by this test either
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True)


def test_a_plain_sessions_hooks_keep_the_vhost_of_its_environment(settings):
    """A session that did not derive its vhost (a plain pytest, or a process a test
    started, which inherits its parent's) deletes the keys it made, never the vhost."""
    settings.TEST_XDIST_DERIVED = False
    kept, made = f"probe-kept-{uuid.uuid4().hex}", f"probe-made-{uuid.uuid4().hex}"
    redis_client().set(kept, "here before the session")
    try:
        for xdist_worker in (False, True):
            session = _hooks_session(xdist_worker=xdist_worker)
            conftest.pytest_sessionstart(session)
            redis_client().set(made, "made by the session")
            conftest.pytest_sessionfinish(session)
            assert _vhost_exists(settings.BROKER_URL)  # not the session's to delete
            assert redis_client().get(made) is None
            assert redis_client().get(kept) is not None
    finally:
        redis_client().delete(kept, made)
