"""Test settings: only what tests need differently. Services stay real."""

import os
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

# Tests run with development values (DEBUG defaults to off, which would refuse the
# development secrets); set before config.settings reads the environment.
os.environ.setdefault("DEBUG", "true")
# Job events on, in this process and in every process a test starts (they inherit the
# environment): the suite checks the events of every path; tests/jobs/test_events_off.py
# runs without them.
os.environ.setdefault("JOBOPS_EVENTS_PUBLISH", "on")

from config import settings as _base
from config.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast user factories
# No limit binds unless a test asks: in this process with the `settings` fixture, in a
# server it starts with JOBOPS_TEST_RATE_LIMITS (tests/jobs/test_create_burst.py runs
# gunicorn under the real limits). Not JOBOPS_RATE_LIMITS: a developer's own stays out.
JOBOPS_RATE_LIMITS = {
    "create_per_user": 100_000,
    "create_per_org": 1_000_000,
    "create_global": 1_000_000,
    "admin_dlq": 100_000,
} | _base.env_json("JOBOPS_TEST_RATE_LIMITS", {})
MEDIA_ROOT = BASE_DIR / "var" / "test-media"  # noqa: F405
STORAGES = {  # no manifest needed for tests
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "artefacts": artefact_storage_config(),  # noqa: F405
}
# Serve static files from the apps in tests; no collectstatic run needed.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
# No verification runs started by a test's dispatcher (they would add `audit_verified`
# entries to the ops chain the test reads); tests/audit/test_verification_runs.py sets them.
AUDIT_VERIFY_INCREMENTAL_EVERY = AUDIT_VERIFY_FULL_EVERY = _base.timedelta(0)
# Each test sees the dashboard of its own data (the cache would serve the previous test's).
JOBOPS_DASHBOARD_CACHE_SECONDS = 0

# pytest-xdist (docs/development.md#parallel-test-workers): worker gwN runs on its own
# RabbitMQ vhost (<vhost>_gwN, created by tests/conftest.py) and its own Redis db (the
# run's db + N: tests empty it); pytest-django gives it its own test database
# (<name>_gwN). Written back to the environment, so that every worker, dispatcher and
# manage.py run a test starts inherits them; the marker keeps those processes, which
# load these settings again, from deriving a second time.
# A Redis server's `databases` (16 by default); a server configured with more (several
# checkouts sharing one server, each on its own range of dbs) says so here.
REDIS_DATABASES = int(os.environ.get("JOBOPS_TEST_REDIS_DATABASES", "16"))


def xdist_worker_urls(worker: str, broker_url: str, redis_url: str) -> tuple[str, str]:
    """The broker and Redis URLs of xdist worker `worker` ("gw3") from the run's own."""
    broker = urlsplit(broker_url)
    vhost = unquote(broker.path[1:]) or "/"  # kombu's reading: no path is "/"
    vhost = ("jobops" if vhost == "/" else vhost) + f"_{worker}"
    redis = urlsplit(redis_url)
    db = int(redis.path.strip("/") or 0) + int(worker.removeprefix("gw"))
    if db >= REDIS_DATABASES:
        raise ImproperlyConfigured(
            f"REDIS_URL={redis_url} leaves no Redis db for xdist worker {worker}"
            f" (db {db} of 0..{REDIS_DATABASES - 1}): use a lower db or fewer workers"
        )
    return (
        urlunsplit(broker._replace(path="/" + quote(vhost, safe=""))),
        urlunsplit(redis._replace(path=f"/{db}")),
    )


_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
# Whether this process derived its own vhost and Redis db (an xdist worker's pytest): only
# such a session removes its vhost at its end (tests/conftest.py), never one it inherited.
TEST_XDIST_DERIVED = bool(
    _xdist_worker and os.environ.get("JOBOPS_TEST_XDIST_WORKER") != _xdist_worker
)
if TEST_XDIST_DERIVED:
    BROKER_URL, REDIS_URL = xdist_worker_urls(_xdist_worker, _base.BROKER_URL, _base.REDIS_URL)
    CACHES["default"]["LOCATION"] = REDIS_URL  # noqa: F405
    os.environ.update(
        BROKER_URL=BROKER_URL, REDIS_URL=REDIS_URL, JOBOPS_TEST_XDIST_WORKER=_xdist_worker
    )
