"""Test settings: only what tests need differently. Services stay real."""

import os

# Tests run with development values (DEBUG defaults to off, which would refuse the
# development secrets); set before config.settings reads the environment.
os.environ.setdefault("DEBUG", "true")

from config.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast user factories
JOBOPS_RATE_LIMITS = {"create_per_user": 100_000, "create_global": 1_000_000, "admin_dlq": 100_000}
MEDIA_ROOT = BASE_DIR / "var" / "test-media"  # noqa: F405
STORAGES = {  # no manifest needed for tests
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "artefacts": artefact_storage_config(),  # noqa: F405
}
# Serve static files from the apps in tests; no collectstatic run needed.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
# Each test sees the dashboard of its own data (the cache would serve the previous test's).
JOBOPS_DASHBOARD_CACHE_SECONDS = 0
