"""jobops settings: one module, every value overridable from the environment.

Development defaults point at the local services of docs/operations/deploying.md. With
DEBUG off, `check_production_safety` refuses to start on an unsafe default.
"""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.connector_providers import providers_parse
from config.env import (
    env_bool,
    env_duration,
    env_durations,
    env_float,
    env_int,
    env_json,
    env_list,
    env_str,
)
from core.durations import parse_duration
from core.logging import configure_masking, configure_structlog, logging_config

BASE_DIR = Path(__file__).resolve().parent.parent

# --- core ------------------------------------------------------------------
DEV_SECRET_KEY = "dev-insecure-jobops-secret-key-change-me"
DEV_SIGNING_KEY = "dev-insecure-audit-signing-key"
# Base64 of 32 bytes anyone can recompute: sha256("dev-insecure-audit-ed25519-key").
DEV_SIGNING_ED25519_KEY = "kdmcBnfGMe7AYYOcQfdm8KgY6+9twS41i2nc30Fgw+8="

# Off unless asked for: a deployment that forgets it must not run with the development
# secret and an open /metrics. `make run`/`make test` set DEBUG=true explicitly.
DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", DEV_SECRET_KEY)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "config.apps.JobopsAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc served from here (offline docs)
    "django_celery_results",
    "django_prometheus",
    # Portal login throttling: failed passwords counted per user and per address in the
    # database (every web host sees the same counts).
    "axes",
    # Plumbing below every app; installed for the portal's template tags and the OTP
    # commands (core/apps.py).
    "core",
    "audit",
    "tenants",
    "jobs",
    "dlq",
]

MIDDLEWARE = [
    # First: probes skip host checks, SSL redirect, logging and metrics (core/health.py).
    "core.health.HealthMiddleware",
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "core.request_id.RequestIdMiddleware",
    # Early, and after the request id, which its refusals carry like any answer.
    "core.middleware.RequestLimitsMiddleware",
    "core.middleware.RejectNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Answers a login refused for a lockout with the lockout page (AXES_LOCKOUT_CALLABLE).
    "axes.middleware.AxesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

# AxesStandaloneBackend refuses a locked-out user or address before any password check.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jobops")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
if not DATABASES["default"]["ENGINE"].endswith("postgresql"):
    raise ImproperlyConfigured("DATABASE_URL must point at PostgreSQL (triggers, SKIP LOCKED)")
# Django's PostgreSQL backend with django-prometheus' counters: statements, their
# durations, errors and new connections (django_db_*, docs/operations/observability.md).
DATABASES["default"]["ENGINE"] = "django_prometheus.db.backends.postgresql"
DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", "test_jobops")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Dates and times as the portal shows them: "2026-11-29 08:09:16 UTC" (config/formats).
FORMAT_MODULE_PATH = ["config.formats"]

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
MEDIA_ROOT = Path(env_str("JOBOPS_MEDIA_ROOT", str(BASE_DIR / "var" / "media")))

# --- artefacts (docs/configuration.md#artefacts) -----------------------------------
# The files jobs write go through the "artefacts" storage (jobs/artefact_storage.py):
# this host's file system by default, which only serves a single host (or a shared
# volume); S3 or an S3-compatible server (MinIO, Ceph, R2) when web and workers run on
# hosts without a shared disk. boto3 reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY
# (or an instance role) itself: no credential is a setting.
ARTEFACT_STORAGE = env_str("ARTEFACT_STORAGE", "filesystem")
ARTEFACT_S3_BUCKET = env_str("ARTEFACT_S3_BUCKET", "jobops-artefacts" if DEBUG else "")
ARTEFACT_S3_ENDPOINT_URL = env_str("ARTEFACT_S3_ENDPOINT_URL", "")  # empty: AWS itself
ARTEFACT_S3_REGION = env_str("ARTEFACT_S3_REGION", "")
# Seconds before the S3 client gives up connecting or reading: a storage that is down
# fails the job's attempt (retried) within this, rather than holding its worker.
ARTEFACT_S3_TIMEOUT_SECONDS = env_float("ARTEFACT_S3_TIMEOUT_SECONDS", 10.0)
# How GET .../artefacts/{id} answers: "stream" the file through the web process, or
# "presigned": a redirect to a URL of the object that expires (S3 only; the file
# system always streams).
ARTEFACT_DOWNLOAD = env_str("ARTEFACT_DOWNLOAD", "stream")
ARTEFACT_PRESIGNED_EXPIRY_SECONDS = env_int("ARTEFACT_PRESIGNED_EXPIRY_SECONDS", 300)
if ARTEFACT_DOWNLOAD not in ("stream", "presigned"):
    raise ImproperlyConfigured(f"ARTEFACT_DOWNLOAD={ARTEFACT_DOWNLOAD!r}: use stream or presigned")
if not 1 <= ARTEFACT_PRESIGNED_EXPIRY_SECONDS <= 7 * 24 * 3600:  # S3's longest
    raise ImproperlyConfigured("ARTEFACT_PRESIGNED_EXPIRY_SECONDS must be 1-604800")


def artefact_storage_config(
    kind: str = ARTEFACT_STORAGE,
    *,
    bucket: str = ARTEFACT_S3_BUCKET,
    endpoint_url: str = ARTEFACT_S3_ENDPOINT_URL,
    region: str = ARTEFACT_S3_REGION,
    timeout: float = ARTEFACT_S3_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """The STORAGES entry of the "artefacts" alias: by default the one ARTEFACT_STORAGE
    and the ARTEFACT_S3_* settings name."""
    if kind == "filesystem":
        # No location: it follows MEDIA_ROOT (the tests' own, for one).
        return {"BACKEND": "django.core.files.storage.FileSystemStorage"}
    if kind != "s3":
        raise ImproperlyConfigured(
            f"ARTEFACT_STORAGE={kind!r}: use filesystem or s3 (docs/configuration.md)"
        )
    from botocore.config import Config

    return {
        # django-storages' S3Storage, its calls to S3 timed and counted.
        "BACKEND": "jobs.integrations.artefact_s3.MeteredS3Storage",
        "OPTIONS": {
            "bucket_name": bucket,
            "endpoint_url": endpoint_url or None,
            "region_name": region or None,
            # A rerun's file gets a name of its own, as on the file system: the row
            # switches to it on commit, so a rolled-back write never replaced the file
            # the row still names (jobs/services/artefacts.py).
            "file_overwrite": False,
            "client_config": Config(
                # Path-style addressing and v4 signatures: what MinIO, Ceph and R2 take
                # as well as S3.
                s3={"addressing_style": "path" if endpoint_url else "auto"},
                signature_version="s3v4",
                connect_timeout=timeout,
                read_timeout=timeout,
                retries={"mode": "standard", "max_attempts": 3},
                # CRC checksums only where S3 requires them: not every S3-compatible
                # server takes boto3's default ones, and each costs a read of the file.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        },
    }


STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    "artefacts": artefact_storage_config(),
}

SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
# An operator's admin session ends with the shift, not weeks later on a shared machine.
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 3600)
X_FRAME_OPTIONS = "DENY"
# Where a login goes when its `next` is missing or unsafe (another host, a scheme):
# the portal's index. Django's default, /accounts/profile/, is a 404 here.
LOGIN_REDIRECT_URL = "admin:index"

# --- HTTPS (production runs behind a TLS-terminating proxy) ------------------
# "HTTP_X_FORWARDED_PROTO,https" when the proxy sets that header (and strips a client's).
_PROXY_SSL_HEADER = env_list("SECURE_PROXY_SSL_HEADER", [])
if _PROXY_SSL_HEADER and len(_PROXY_SSL_HEADER) != 2:
    raise ImproperlyConfigured("SECURE_PROXY_SSL_HEADER must be 'HEADER_NAME,value'")
SECURE_PROXY_SSL_HEADER = tuple(_PROXY_SSL_HEADER) if _PROXY_SSL_HEADER else None
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
# Preloading is a commitment for the whole domain, the owner's to make.
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
if not SECURE_HSTS_PRELOAD:
    SILENCED_SYSTEM_CHECKS = ["security.W021"]

# --- services ----------------------------------------------------------------
# One URL, or every node of a RabbitMQ cluster separated by `;` (each a full URL): every
# connection jobops opens tries them in turn and moves to the next when one is lost.
BROKER_URL = env_str("BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# The smallest deployment (docs/smallest-deployment.md): PostgreSQL alone. Off, nothing
# in jobops opens a connection to RabbitMQ (every queue must then run on the PostgreSQL
# executor, checked below) or to Redis (core/kv.py keeps its few short-lived facts in
# an UNLOGGED table instead, and the cache is that table too).
JOBOPS_BROKER = env_bool("JOBOPS_BROKER", True)
JOBOPS_REDIS = env_bool("JOBOPS_REDIS", True)
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache"
        if JOBOPS_REDIS
        else "core.kv.KvCache",
        "LOCATION": REDIS_URL if JOBOPS_REDIS else "",
        "KEY_PREFIX": env_str("JOBOPS_CACHE_PREFIX", "jobops"),
    }
}

# --- job types: the one table of facts (docs/architecture.md) --------------------------
# Job categories (docs/configuration.md#job-categories): what kind of work a type does
# decides how long its idempotency key returns its job, how long the job is kept once
# it ended, and the retry policy its types use unless they set their own (in JOB_TYPES,
# as `ai` does, or in JOBOPS_JOB_TYPES: {"sim": {"retention": "14d"}}). One row per
# category; JOBOPS_KEY_TTL, JOBOPS_RETENTION and JOBOPS_CATEGORY_RETRIES change it.
_DAY = timedelta(days=1)
_CATEGORY_DEFAULTS: dict[str, dict[str, Any]] = {
    "planning": {"key_ttl": 30 * _DAY, "retention": 90 * _DAY, "max_retries": 5, "backoff_cap": 60},
    "import_export": {
        "key_ttl": 30 * _DAY,
        "retention": 30 * _DAY,
        "max_retries": 5,
        "backoff_cap": 45,
    },
    "notification": {
        "key_ttl": 7 * _DAY,
        "retention": 7 * _DAY,
        "max_retries": 5,
        "backoff_cap": 45,
    },
    "maintenance": {
        "key_ttl": 7 * _DAY,
        "retention": 7 * _DAY,
        "max_retries": 3,
        "backoff_cap": 60,
    },
    # Jobs that append to or enrich the audit record of other jobs and never change a
    # domain entity (jobs.services.annotations). Their entries outlive them, but the
    # portal shows an annotation only while its job is kept: kept as long as the
    # longest-kept work they annotate (planning's 90 days). Their work is a few reads
    # and one append: a retry only outlasts a database hiccup.
    "audit_enrichment": {
        "key_ttl": 30 * _DAY,
        "retention": 90 * _DAY,
        "max_retries": 3,
        "backoff_cap": 20,
    },
}
JOB_CATEGORIES = tuple(_CATEGORY_DEFAULTS)
# JOBOPS_IDEMPOTENCY_KEY_DAYS, the single TTL of earlier versions, still sets every
# category's key TTL that JOBOPS_KEY_TTL does not name.
_key_days = env_str("JOBOPS_IDEMPOTENCY_KEY_DAYS", "")
JOBOPS_IDEMPOTENCY_KEY_DAYS = env_int("JOBOPS_IDEMPOTENCY_KEY_DAYS", 30)
JOBOPS_KEY_TTL = env_durations(
    "JOBOPS_KEY_TTL",
    {
        category: timedelta(days=JOBOPS_IDEMPOTENCY_KEY_DAYS) if _key_days else row["key_ttl"]
        for category, row in _CATEGORY_DEFAULTS.items()
    },
)
JOBOPS_RETENTION = env_durations(
    "JOBOPS_RETENTION",
    {category: row["retention"] for category, row in _CATEGORY_DEFAULTS.items()},
)
# A category's retry policy: {"notification": {"max_retries": 8}} in JOBOPS_CATEGORY_RETRIES.
_RETRY_FIELDS = {"max_retries": 0, "backoff_cap": 1}  # each field's least value
JOBOPS_CATEGORY_RETRIES: dict[str, dict[str, int]] = {
    category: {field: row[field] for field in _RETRY_FIELDS}
    for category, row in _CATEGORY_DEFAULTS.items()
}
for _category, _fields in env_json("JOBOPS_CATEGORY_RETRIES", {}).items():
    if _category not in JOBOPS_CATEGORY_RETRIES or not isinstance(_fields, dict):
        raise ImproperlyConfigured(
            f"JOBOPS_CATEGORY_RETRIES: {_category!r} is not one of {', '.join(JOB_CATEGORIES)}"
        )
    for _field, _value in _fields.items():
        if _field not in _RETRY_FIELDS or not (
            type(_value) is int and _value >= _RETRY_FIELDS[_field]
        ):
            raise ImproperlyConfigured(
                f"JOBOPS_CATEGORY_RETRIES: {_category}.{_field}={_value!r}: the fields are "
                "max_retries (0 or more) and backoff_cap (seconds, 1 or more)"
            )
    JOBOPS_CATEGORY_RETRIES[_category].update(_fields)

JOB_TYPES: dict[str, dict[str, Any]] = {
    "ai": {
        "category": "planning",
        "queue": "default",
        # Its own retry policy (planning's is 5 and 60 s), as before categories.
        "max_retries": 3,
        "backoff_cap": 20,
        "soft_time_limit": 240,
        "time_limit": 300,
        "params_serializer": "jobs.domain.params.AiParams",
        "handler": "jobs.handlers.ai.run",
    },
    "model": {
        "category": "planning",
        "queue": "model",
        "soft_time_limit": 840,
        "time_limit": 900,
        "params_serializer": "jobs.domain.params.ModelParams",
        "handler": "jobs.handlers.model.run",
    },
    "cam": {
        "category": "planning",
        "queue": "cam",
        "soft_time_limit": 840,
        "time_limit": 900,
        "params_serializer": "jobs.domain.params.CamParams",
        "handler": "jobs.handlers.cam.run",
    },
    "sim": {
        "category": "planning",
        "queue": "sim",
        "soft_time_limit": 840,
        "time_limit": 900,
        "params_serializer": "jobs.domain.params.SimParams",
        "handler": "jobs.handlers.sim.run",
    },
    "report": {
        "category": "import_export",
        "queue": "report",
        "soft_time_limit": 540,
        "time_limit": 600,
        "params_serializer": "jobs.domain.params.ReportParams",
        "handler": "jobs.handlers.report.run",
    },
    # Reads an upload (POST /api/v1/uploads) after checking its sha256 again; on the
    # import_export queue with `report`, its kin (docs/api.md#uploading-an-input).
    "import": {
        "category": "import_export",
        "queue": "report",
        "soft_time_limit": 540,
        "time_limit": 600,
        "params_serializer": "jobs.handlers.imports.ImportParams",
        "handler": "jobs.handlers.imports.run",
    },
    "erp": {
        "category": "notification",
        "queue": "erp",
        "soft_time_limit": 240,
        "time_limit": 300,
        "params_serializer": "jobs.domain.params.ErpParams",
        "handler": "jobs.handlers.erp.run",
        # The external system its handler calls: its breaker (docs/connectors.md).
        "connector": "erp",
    },
    "annotate": {
        "category": "audit_enrichment",
        # A light job (two reads, one append): beside `ai` on the light queue.
        "queue": "default",
        "soft_time_limit": 30,
        "time_limit": 60,
        "params_serializer": "jobs.domain.params.AnnotateParams",
        "handler": "jobs.handlers.annotate.run",
    },
}
# A deployment swaps handlers without code changes: {"sim": "mypkg.handlers.sim"}.
for _type, _path in env_json("JOBOPS_HANDLERS", {}).items():
    if _type not in JOB_TYPES:
        raise ImproperlyConfigured(f"JOBOPS_HANDLERS names unknown job type {_type!r}")
    JOB_TYPES[_type]["handler"] = _path

# A deployment (or a test worker) tunes the table without code changes:
# {"sim": {"max_retries": 2, "soft_time_limit": 2, "time_limit": 3}}.
# A type's own key TTL or retention (a duration: "14d") replaces its category's.
# A type's own max_retries or backoff_cap replaces its category's (JOBOPS_CATEGORY_RETRIES).
_TYPE_DURATIONS = {"key_ttl", "retention"}
# A type's connector (and whether its create answers 409 while the connector is open) may
# be set on any type: {"ai": {"connector": "openai", "connector_open": "refuse"}}.
_TYPE_FIELDS = _TYPE_DURATIONS | set(_RETRY_FIELDS) | {"connector", "connector_open"}
for _type, _fields in env_json("JOBOPS_JOB_TYPES", {}).items():
    if _type not in JOB_TYPES or not set(_fields) <= set(JOB_TYPES[_type]) | _TYPE_FIELDS:
        raise ImproperlyConfigured(f"JOBOPS_JOB_TYPES: unknown type or field in {_type!r}")
    for _field in _TYPE_DURATIONS & set(_fields):
        try:
            _fields[_field] = parse_duration(str(_fields[_field]))
        except ValueError as exc:
            raise ImproperlyConfigured(f"JOBOPS_JOB_TYPES: {_type}.{_field}: {exc}") from exc
    JOB_TYPES[_type].update(_fields)
for _type, _spec in JOB_TYPES.items():
    if _spec["category"] not in JOB_CATEGORIES:
        raise ImproperlyConfigured(
            f"JOB_TYPES: {_type!r} has category {_spec['category']!r}, not one of "
            f"{', '.join(JOB_CATEGORIES)}"
        )

# The executor of each queue (docs/postgres-executor.md), one row per queue of the
# types table: `celery` (the default: the dispatcher publishes its jobs to RabbitMQ and
# Celery workers run them) or `postgres` (`manage.py run_worker` claims its jobs from
# PostgreSQL in batches; nothing goes through the broker).
# JOBOPS_EXECUTOR_<QUEUE>=postgres, e.g. JOBOPS_EXECUTOR_SIM=postgres.
JOBOPS_EXECUTORS = ("celery", "postgres")
JOBOPS_QUEUE_EXECUTORS: dict[str, str] = {}
for _queue in dict.fromkeys(str(_spec["queue"]) for _spec in JOB_TYPES.values()):
    _variable = f"JOBOPS_EXECUTOR_{_queue.upper()}"
    _executor = env_str(_variable, "celery").strip().lower()
    if _executor not in JOBOPS_EXECUTORS:
        raise ImproperlyConfigured(
            f"{_variable}={_executor!r} must be one of {', '.join(JOBOPS_EXECUTORS)}"
        )
    JOBOPS_QUEUE_EXECUTORS[_queue] = _executor
# Without a broker every queue must be a postgres queue: a celery queue's jobs would
# wait `pending` forever (docs/smallest-deployment.md).
_broker_queues = [q for q, e in JOBOPS_QUEUE_EXECUTORS.items() if e != "postgres"]
if not JOBOPS_BROKER and _broker_queues:
    raise ImproperlyConfigured(
        "JOBOPS_BROKER=off needs every queue on the PostgreSQL executor; set "
        + ", ".join(f"JOBOPS_EXECUTOR_{q.upper()}=postgres" for q in _broker_queues)
    )
# run_worker (the postgres executor): its runners are processes (`processes`, the
# default: a handler's time limits are enforced, CPU-bound work runs in parallel) or
# threads (`threads`: cheaper, for I/O-bound types; no time limit can stop a thread, the
# reaper reclaims a job that overran its hard limit); --pool overrides it.
JOBOPS_WORKER_POOL = env_str("JOBOPS_WORKER_POOL", "processes")
if JOBOPS_WORKER_POOL not in ("processes", "threads"):
    raise ImproperlyConfigured(
        f"JOBOPS_WORKER_POOL={JOBOPS_WORKER_POOL!r} must be processes or threads"
    )
# run_worker claims ahead: at most concurrency x this many jobs in hand (running, or
# claimed and waiting in its buffer: `running` in the database, their `started` entry
# written). Only short jobs are claimed ahead (jobs.processes.executor.BUFFER_HORIZON_SECONDS), so
# a long job never waits behind another; 1 claims only for free runners.
JOBOPS_WORKER_PREFETCH = env_int("JOBOPS_WORKER_PREFETCH", 32)
if not 1 <= JOBOPS_WORKER_PREFETCH <= 64:
    raise ImproperlyConfigured(f"JOBOPS_WORKER_PREFETCH={JOBOPS_WORKER_PREFETCH} must be 1-64")
# With no NOTIFY (a retry coming due, a resumed queue), run_worker looks for due jobs
# at least this often; and on SIGTERM it lets running jobs finish for this long.
JOBOPS_WORKER_POLL_SECONDS = env_float("JOBOPS_WORKER_POLL_SECONDS", 1.0)
JOBOPS_WORKER_GRACE_SECONDS = env_float("JOBOPS_WORKER_GRACE_SECONDS", 30.0)
if JOBOPS_WORKER_POLL_SECONDS <= 0 or JOBOPS_WORKER_GRACE_SECONDS < 0:
    raise ImproperlyConfigured(
        "JOBOPS_WORKER_POLL_SECONDS must be above 0 and JOBOPS_WORKER_GRACE_SECONDS not negative"
    )

# Connectors and their breakers (docs/connectors.md). A type names the external system
# its handler calls (`connector`); each connector's breaker opens after `failures`
# consecutive connector failures (timeouts, 5xx, connection errors), stays open
# `cooldown_seconds`, then lets one job probe. Jobs that meet an open breaker wait
# `retrying` until its probe time plus up to `jitter_seconds`; those that meet a probe
# under way wait `probe_wait_seconds` (plus jitter). A type's `connector_open`: "wait"
# (the default: creation accepts and the job waits) or "refuse" (POST /api/v1/jobs
# answers 409 ERR-CONNECTOR-OPEN while its connector is open).
_CONNECTOR_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
JOBOPS_CONNECTOR_DEFAULTS: dict[str, float] = {
    "failures": env_int("JOBOPS_CONNECTOR_FAILURES", 5),
    "cooldown_seconds": env_float("JOBOPS_CONNECTOR_COOLDOWN_SECONDS", 1800.0),
    "probe_wait_seconds": env_float("JOBOPS_CONNECTOR_PROBE_WAIT_SECONDS", 30.0),
    "jitter_seconds": env_float("JOBOPS_CONNECTOR_JITTER_SECONDS", 60.0),
}
# Each field's bounds: a breaker that opens at once, or never closes, is a mistake.
_CONNECTOR_BOUNDS: dict[str, tuple[float, float]] = {
    "failures": (1, 1000),
    "cooldown_seconds": (1, 7 * 86400),
    "probe_wait_seconds": (0.1, 86400),
    "jitter_seconds": (0, 86400),
}
for _type, _spec in JOB_TYPES.items():
    _connector = _spec.get("connector")
    if _connector is not None and not (
        isinstance(_connector, str) and _CONNECTOR_NAME.match(_connector)
    ):
        raise ImproperlyConfigured(
            f"JOB_TYPES: {_type}.connector={_connector!r}: lower-case letters, digits, "
            "'_', '.' or '-', at most 64"
        )
    if _spec.get("connector_open", "wait") not in ("wait", "refuse"):
        raise ImproperlyConfigured(
            f"JOB_TYPES: {_type}.connector_open={_spec['connector_open']!r}: wait or refuse"
        )
_connector_names = sorted({s["connector"] for s in JOB_TYPES.values() if s.get("connector")})
_connector_overrides = env_json("JOBOPS_CONNECTORS", {})
if not isinstance(_connector_overrides, dict):
    raise ImproperlyConfigured("JOBOPS_CONNECTORS: a JSON object, connector -> settings")
# Per connector: {"failures", "cooldown_seconds", "probe_wait_seconds", "jitter_seconds"},
# and optionally its providers, each with its own breaker, chosen by weight, and one
# fallback for while every primary one is open (config/connector_providers.py):
# {"erp": {"providers": [{"name": "acme", "weight": 3, "url": "https://..."},
#                        {"name": "spare", "url": "https://..."}], "fallback": "spare"}}.
JOBOPS_CONNECTORS: dict[str, dict[str, Any]] = {
    name: dict(JOBOPS_CONNECTOR_DEFAULTS) for name in _connector_names
}
for _name, _fields in {"(defaults)": JOBOPS_CONNECTOR_DEFAULTS, **_connector_overrides}.items():
    if _name != "(defaults)" and (_name not in JOBOPS_CONNECTORS or not isinstance(_fields, dict)):
        raise ImproperlyConfigured(
            f"JOBOPS_CONNECTORS: {_name!r} is no job type's connector "
            f"({', '.join(_connector_names) or 'none'})"
        )
    _fields = dict(_fields)
    if _name != "(defaults)" and ("providers" in _fields or "fallback" in _fields):
        if "providers" not in _fields:
            raise ImproperlyConfigured(
                f"JOBOPS_CONNECTORS: {_name}.fallback: a fallback needs a providers list"
            )
        JOBOPS_CONNECTORS[_name]["providers"] = providers_parse(
            _name, _fields.pop("providers"), _fields.pop("fallback", None)
        )
    for _field, _value in _fields.items():
        _low, _high = _CONNECTOR_BOUNDS.get(_field, (1.0, 0.0))  # an unknown field: never
        if (
            isinstance(_value, bool)
            or not isinstance(_value, int | float)
            or not _low <= _value <= _high
            or (_field == "failures" and not isinstance(_value, int))
        ):
            raise ImproperlyConfigured(
                f"JOBOPS_CONNECTORS: {_name}.{_field}={_value!r}: the fields are failures "
                "(1-1000), cooldown_seconds (1 s to 7 days), probe_wait_seconds (0.1 s to "
                "a day) and jitter_seconds (0 to a day)"
            )
    if _name != "(defaults)":
        JOBOPS_CONNECTORS[_name].update(_fields)
# A job-level wait a connector asked for (Retry-After on a 429 or 503, or a handler's
# RetryableError(retry_after=...)) is honoured up to this many seconds: a provider
# answering "come back next week" must not park a job beyond what an operator sees.
JOBOPS_RETRY_AFTER_MAX_SECONDS = env_float("JOBOPS_RETRY_AFTER_MAX_SECONDS", 3600.0)
if not 0 <= JOBOPS_RETRY_AFTER_MAX_SECONDS <= 7 * 86400:
    raise ImproperlyConfigured(
        f"JOBOPS_RETRY_AFTER_MAX_SECONDS={JOBOPS_RETRY_AFTER_MAX_SECONDS!r}: 0 to 7 days"
    )
# How long a process trusts its copy of the breakers (a claim reads none while its
# connector is closed): a breaker opened on another host is seen within this.
JOBOPS_CONNECTOR_CACHE_SECONDS = env_float("JOBOPS_CONNECTOR_CACHE_SECONDS", 1.0)

# The work a job's params plan (a schema's estimate, e.g. sim steps x step_seconds) may
# fill at most this fraction of its type's soft time limit. The rest is headroom for a
# slow host and the database: a job planned to the limit itself hits it near the end of
# every attempt, so it is refused at creation instead (jobs.domain.types.JobType.work_budget).
JOBOPS_WORK_BUDGET_FRACTION = env_float("JOBOPS_WORK_BUDGET_FRACTION", 0.8)
if not 0 < JOBOPS_WORK_BUDGET_FRACTION <= 1:
    raise ImproperlyConfigured(
        f"JOBOPS_WORK_BUDGET_FRACTION={JOBOPS_WORK_BUDGET_FRACTION!r} must be in (0, 1]"
    )

# A job stopped by its soft time limit is retried at most this many times (not up to its
# max_retries): a second overrun of the same work is not transient, and each attempt
# holds a slot of its queue for the whole limit. The next one dead-letters it.
JOBOPS_TIME_LIMIT_RETRIES = env_int("JOBOPS_TIME_LIMIT_RETRIES", 1)
if JOBOPS_TIME_LIMIT_RETRIES < 0:
    raise ImproperlyConfigured(f"JOBOPS_TIME_LIMIT_RETRIES={JOBOPS_TIME_LIMIT_RETRIES} is negative")

JOBOPS_LOCK_TIMEOUT = env_int("JOBOPS_LOCK_TIMEOUT", 60)
JOBOPS_HEARTBEAT_SECONDS = env_int("JOBOPS_HEARTBEAT_SECONDS", 10)
# Execution (docs/architecture.md); tests shrink these through the environment.
JOBOPS_BACKOFF_BASE_SECONDS = env_float("JOBOPS_BACKOFF_BASE_SECONDS", 2.0)
JOBOPS_PROGRESS_INTERVAL_SECONDS = env_float("JOBOPS_PROGRESS_INTERVAL_SECONDS", 2.0)
JOBOPS_CANCEL_CHECK_SECONDS = env_float("JOBOPS_CANCEL_CHECK_SECONDS", 0.5)
# A pending job is published once it is this old (0: at once; the request never
# publishes, NOTIFY jobs_pending wakes the dispatcher). Raise it to hold new jobs back.
JOBOPS_DISPATCH_PENDING_AFTER_SECONDS = env_float("JOBOPS_DISPATCH_PENDING_AFTER_SECONDS", 0.0)
# Scheduled jobs and recurring schedules (docs/operator-controls.md): a job's run_at at
# most this many days ahead; a dispatcher that was down creates at most this many of a
# schedule's missed fires (the latest ones) when it comes back.
JOBOPS_MAX_SCHEDULE_AHEAD = env_int("JOBOPS_MAX_SCHEDULE_AHEAD", 90)
JOBOPS_SCHEDULE_CATCH_UP = env_int("JOBOPS_SCHEDULE_CATCH_UP", 1)
# The dispatcher runs every step at least this often; a NOTIFY runs the publish step
# at once in between.
JOBOPS_DISPATCHER_INTERVAL_SECONDS = env_float("JOBOPS_DISPATCHER_INTERVAL_SECONDS", 1.0)
# The dispatcher loop's steps, in order: (name, dotted path of a no-argument callable).
# Listed here, where the apps are composed, so that jobs never names the dlq app.
JOBOPS_DISPATCHER_STEPS: list[tuple[str, str]] = [
    # Scheduled jobs come due -> pending (jobs/services/scheduling.py), before the
    # publish step so that they go out in the same loop; then recurring schedules' fires.
    ("scheduled", "jobs.services.scheduling.promote_due_once"),
    ("schedules", "jobs.services.schedules.schedules_fire_due"),
    ("publish", "jobs.services.publishing.publish_due_once"),
    ("reap", "jobs.services.reaper.reap_once"),
    # Idempotency keys past their category's TTL (jobs/services/keys.py), in batches.
    ("release_keys", "jobs.services.keys.release_keys_once"),
    ("outbox", "jobs.processes.events.outbox_relay_once"),
    ("checkpoint", "audit.checkpoints.checkpoint_write_if_due"),
    # The next months' audit_logs partitions (audit/partitions.py), about once an hour.
    ("audit_partitions", "audit.partitions.partitions_step"),
    # Archives of the audit_logs partitions ready for it, into AUDIT_ARCHIVE_DIR (none
    # when unset), and the gauge of those ready to detach (audit/partition_archive.py),
    # about once an hour. Never a detach: that is the owner role's, by hand.
    ("audit_archives", "audit.partition_archive.archive_step"),
    ("queue_depths", "jobs.integrations.backpressure.queue_depths_step"),
    ("dlq_watch", "dlq.watcher.watch_once"),
    # Background replays and discards (dlq/bulk.py): one chunk per loop.
    ("dlq_bulk", "dlq.bulk.bulk_operations_run_once"),
    # Retention (jobs/services/purge.py): ended jobs past their category's retention.
    ("purge", "jobs.services.purge.purge_once"),
    # Audit verification (audit/verification_runs.py): starts `verify_audit_chain
    # --since-checkpoint` every AUDIT_VERIFY_INCREMENTAL_EVERY and the full walk every
    # AUDIT_VERIFY_FULL_EVERY, each as a process of its own: the loop never waits for one.
    ("audit_verify", "audit.verification_runs.audit_verify_due"),
    # Expired entries of the key-value store's table (core/kv.py; nothing with Redis).
    ("kv_sweep", "core.kv.kv_sweep_once"),
]
# With JOBOPS_BROKER off (docs/smallest-deployment.md) the steps that talk to RabbitMQ
# are left out (None) or run in their database form: nothing is published (a postgres
# queue's workers claim their jobs from the table), there is no dead-letter queue to
# watch, and the outbox has no exchange to go to (jobs/processes/events.py: outbox_settle_once;
# the ERP bridge reads it directly). Applied by jobs.processes.dispatcher.role_steps.
JOBOPS_BROKERLESS_STEPS: dict[str, str | None] = {
    "publish": None,
    "dlq_watch": None,
    "outbox": "jobs.processes.events.outbox_settle_once",
}
# Retention and purge (docs/operations/retention.md). Due jobs go in batches of
# JOBOPS_PURGE_BATCH rows (one transaction each), with JOBOPS_PURGE_PAUSE_SECONDS
# between two batches, for at most JOBOPS_PURGE_STEP_SECONDS per run of the step (the
# loop's other steps take their turn in between); once none is due, the purge looks
# again after JOBOPS_PURGE_INTERVAL_SECONDS.
# The pace keeps the create p99 and the drain within 20 % of the same without a purge
# on two busy cores, at about 150 jobs/s: a hundred times what 100,000 jobs a day bring
# (docs/benchmarks.md#retention). 500 per 0.05 s cost the drain 30 %.
JOBOPS_PURGE_BATCH = env_int("JOBOPS_PURGE_BATCH", 100)
JOBOPS_PURGE_PAUSE_SECONDS = env_float("JOBOPS_PURGE_PAUSE_SECONDS", 1.0)
JOBOPS_PURGE_STEP_SECONDS = env_float("JOBOPS_PURGE_STEP_SECONDS", 0.5)
JOBOPS_PURGE_INTERVAL_SECONDS = env_float("JOBOPS_PURGE_INTERVAL_SECONDS", 300.0)
# An artefact file or object with no row, older than this, is swept (a purge deletes
# the row first and the file after commit; a failed delete or a rolled-back write
# leaves an orphan). Also how often the sweep runs.
JOBOPS_ARTEFACT_ORPHAN_GRACE = parse_duration(env_str("JOBOPS_ARTEFACT_ORPHAN_GRACE", "1h"))
# How long a finished bulk operation (done, stopped, failed) is kept.
JOBOPS_DLQ_BULK_RETENTION = parse_duration(env_str("JOBOPS_DLQ_BULK_RETENTION", "30d"))
# What the purge removes besides jobs: (name, dotted path of a callable taking
# `older_than` (a timedelta overriding its retention, or None) and `dry_run`, returning
# a count). Listed here so that jobs never names the dlq app.
JOBOPS_PURGE_EXTRAS: list[tuple[str, str]] = [
    ("bulk_operations", "dlq.bulk.bulk_operations_purge"),
    ("uploads", "jobs.services.uploads.uploads_sweep"),
    ("webhook_deliveries", "jobs.services.webhooks.webhook_deliveries_purge"),
]
# Uploads (POST /api/v1/uploads, docs/api.md#uploading-an-input): the largest file
# accepted (a bigger one is 413 ERR-JOB-413, nothing stored), and how long one that no
# job names is kept (its expires_at); the purge step sweeps it, bytes and row, after that.
JOBOPS_UPLOAD_MAX_BYTES = env_int("JOBOPS_UPLOAD_MAX_BYTES", 50 * 1024 * 1024)
if not 1 <= JOBOPS_UPLOAD_MAX_BYTES <= 5 * 1024**3:
    raise ImproperlyConfigured(
        f"JOBOPS_UPLOAD_MAX_BYTES={JOBOPS_UPLOAD_MAX_BYTES}: use 1 byte to 5 GiB"
    )
JOBOPS_UPLOAD_TTL = env_duration("JOBOPS_UPLOAD_TTL", "24h")
if JOBOPS_UPLOAD_TTL < timedelta(minutes=1):
    raise ImproperlyConfigured("JOBOPS_UPLOAD_TTL must be at least 1m")
JOBOPS_PUBLISH_TIMEOUT_SECONDS = env_float("JOBOPS_PUBLISH_TIMEOUT_SECONDS", 5.0)
# RabbitMQ's consumer_timeout (default 30 min); workers refuse prefetch settings that
# could keep a reserved message waiting past half of it.
JOBOPS_CONSUMER_TIMEOUT_SECONDS = env_int("JOBOPS_CONSUMER_TIMEOUT_SECONDS", 1800)
# On a RabbitMQ cluster (docs/operations/scaling.md#a-rabbitmq-cluster): how many nodes
# hold a replica of each quorum queue (x-quorum-initial-group-size, fixed when the queue
# is declared); 0 leaves it to the broker (every node, up to its limit).
JOBOPS_QUORUM_GROUP_SIZE = env_int("JOBOPS_QUORUM_GROUP_SIZE", 0)
if not 0 <= JOBOPS_QUORUM_GROUP_SIZE <= 99:
    raise ImproperlyConfigured(
        f"JOBOPS_QUORUM_GROUP_SIZE={JOBOPS_QUORUM_GROUP_SIZE}: use 0 (the broker's "
        "default) or a number of nodes from 1 to 99 (an odd one: 3 or 5)"
    )
# The queue type of the dead-letter queues and dlq.watch: quorum (replicated: they survive
# the loss of a node) or classic (a deployment that declared them before quorum became
# the default keeps them until it converts them: `manage.py setup_topology --convert`).
JOBOPS_DLQ_QUEUE_TYPE = env_str("JOBOPS_DLQ_QUEUE_TYPE", "quorum")
if JOBOPS_DLQ_QUEUE_TYPE not in ("quorum", "classic"):
    raise ImproperlyConfigured(
        f"JOBOPS_DLQ_QUEUE_TYPE={JOBOPS_DLQ_QUEUE_TYPE!r}: use quorum or classic"
    )
# Pause before handing a message back when the database is unreachable, so that an
# outage does not burn through the queue's delivery limit in a tight loop.
JOBOPS_DB_DOWN_REQUEUE_DELAY_SECONDS = env_float("JOBOPS_DB_DOWN_REQUEUE_DELAY_SECONDS", 1.0)
JOBOPS_MAX_PAYLOAD_BYTES = env_int("JOBOPS_MAX_PAYLOAD_BYTES", 256 * 1024)
# The largest job message the publisher hands to the broker (jobs/integrations/publisher.py); set
# RabbitMQ's max_message_size to match (docs/operations/deploying.md). A job the API
# accepted must fit in its message, so it may not be below JOBOPS_MAX_PAYLOAD_BYTES.
JOBOPS_MAX_MESSAGE_BYTES = env_int("JOBOPS_MAX_MESSAGE_BYTES", 10 * 1024 * 1024)
if JOBOPS_MAX_MESSAGE_BYTES < JOBOPS_MAX_PAYLOAD_BYTES:
    raise ImproperlyConfigured(
        f"JOBOPS_MAX_MESSAGE_BYTES={JOBOPS_MAX_MESSAGE_BYTES} is below "
        f"JOBOPS_MAX_PAYLOAD_BYTES={JOBOPS_MAX_PAYLOAD_BYTES}: accepted jobs would not fit"
    )
# A batch create (POST /api/v1/jobs/batch, docs/api.md#creating-jobs-in-a-batch): at
# most this many jobs in one request, and a body of at most this many bytes (each job's
# params still within JOBOPS_MAX_PAYLOAD_BYTES). More is 413 ERR-JOB-413, unread.
JOBOPS_BATCH_CREATE_MAX = env_int("JOBOPS_BATCH_CREATE_MAX", 1000)
JOBOPS_BATCH_MAX_BYTES = env_int("JOBOPS_BATCH_MAX_BYTES", 4 * 1024 * 1024)
# Deepest JSON nesting accepted anywhere in a request body, job message or result.
JOBOPS_MAX_JSON_DEPTH = env_int("JOBOPS_MAX_JSON_DEPTH", 32)
# Params keys refused at any depth (jobs.domain.params.params_secret_check): a secret in
# params travels in the broker message and rests on the job row. Compared exactly after
# lowercasing and dropping "-" and "_" (API-Key is api_key; password_policy is allowed).
JOBOPS_SECRET_PARAM_NAMES = env_list(
    "JOBOPS_SECRET_PARAM_NAMES",
    [
        "password",
        "passwd",
        "secret",
        "api_key",
        "apikey",
        "access_token",
        "refresh_token",
        "private_key",
        "client_secret",
        "authorization",
    ],
)
if any(not re.sub(r"[-_]", "", name) for name in JOBOPS_SECRET_PARAM_NAMES):
    raise ImproperlyConfigured(
        "JOBOPS_SECRET_PARAM_NAMES: every name needs a letter or digit (it is compared "
        "without '-' and '_')"
    )
# Request line and headers (core.middleware.RequestLimitsMiddleware): a longer URI is
# 414 ERR-HTTP-414, a longer header or more headers 431 ERR-HTTP-431, in the envelope.
# gunicorn's own limits (config/gunicorn_conf.py) sit above these, so that it is Django
# that answers; the URI limit must leave room in gunicorn's 8190-byte request line.
JOBOPS_MAX_URI_CHARS = env_int("JOBOPS_MAX_URI_CHARS", 4096)
JOBOPS_MAX_HEADER_BYTES = env_int("JOBOPS_MAX_HEADER_BYTES", 16 * 1024)  # one header line
JOBOPS_MAX_HEADERS = env_int("JOBOPS_MAX_HEADERS", 100)
if not 0 < JOBOPS_MAX_URI_CHARS <= 8000:
    raise ImproperlyConfigured(
        "JOBOPS_MAX_URI_CHARS must be 1-8000 (gunicorn reads request lines up to 8190 bytes)"
    )
# Retry-After of the 503 answered while the database is down or read-only.
JOBOPS_DB_RETRY_AFTER_SECONDS = env_int("JOBOPS_DB_RETRY_AFTER_SECONDS", 5)
# Defaults first, so that an override naming one limit keeps the others.
# create_per_org: every member's and service account's creates in one organisation
# together (docs/tenancy.md#limits).
JOBOPS_RATE_LIMITS: dict[str, int] = {
    "create_per_user": 60,
    # As the global limit by default: a deployment upgraded into one (the default)
    # organisation keeps its allowance. Lower it when several organisations share one.
    "create_per_org": 500,
    "create_global": 500,
    "admin_dlq": 30,
} | env_json("JOBOPS_RATE_LIMITS", {})
JOBOPS_QUEUE_DEPTH_LIMITS: dict[str, int] = {
    queue: 100_000 for queue in {str(t["queue"]) for t in JOB_TYPES.values()}
} | env_json("JOBOPS_QUEUE_DEPTH_LIMITS", {})
# jobops' own Redis keys (rate-limit buckets, cached queue depths) live under this
# prefix, like the cache's keys, so that parallel deployments on one Redis never collide.
JOBOPS_REDIS_PREFIX = env_str("JOBOPS_REDIS_PREFIX", CACHES["default"]["KEY_PREFIX"])
# How long a cached queue depth counts; an older (expired) depth is unknown and never refuses.
JOBOPS_QUEUE_DEPTH_TTL = env_int("JOBOPS_QUEUE_DEPTH_TTL", 15)
# The broker window (docs/operator-controls.md#priority): at most this many messages per
# queue in RabbitMQ (its `queued` jobs), the rest wait `pending` in PostgreSQL and enter
# highest priority first, then oldest (quorum queues have no priorities). Twice what a
# queue's consumers hold at once (prefetch 3 x concurrency 8 on the light workers) keeps
# them busy while the dispatcher refills the window on each claim; a smaller window
# lets a priority job overtake sooner, a larger one keeps more in flight.
JOBOPS_BROKER_WINDOW = env_int("JOBOPS_BROKER_WINDOW", 50)
if JOBOPS_BROKER_WINDOW < 1:
    raise ImproperlyConfigured(f"JOBOPS_BROKER_WINDOW={JOBOPS_BROKER_WINDOW} must be at least 1")
JOBOPS_ERP_WEBHOOK_URL = env_str("JOBOPS_ERP_WEBHOOK_URL", "")
JOBOPS_ERP_EVENTS_URL = env_str("JOBOPS_ERP_EVENTS_URL", "")
# Job events (docs/architecture.md#progress-events-and-the-outbox): on, every status change
# writes its event to the outbox and the relay publishes it to `events.jobs`, where the
# ERP bridge and any queue a consumer bound receive it. Off, the transitions write no
# outbox row at all: the SQL functions read the session setting `jobops.events`, which
# every connection of this process then sets at its start. On only where a consumer is
# configured: the ERP bridge (JOBOPS_ERP_EVENTS_URL), or JOBOPS_EVENTS_PUBLISH=on for a
# queue of one's own bound to `events.jobs` (jobops cannot see it). Without one, every
# change of every job paid an outbox row and the relay's publish for no reader.
JOBOPS_EVENTS_PUBLISH = env_bool("JOBOPS_EVENTS_PUBLISH", bool(JOBOPS_ERP_EVENTS_URL))
if not JOBOPS_EVENTS_PUBLISH:
    if JOBOPS_ERP_EVENTS_URL:
        raise ImproperlyConfigured(
            "JOBOPS_EVENTS_PUBLISH=off writes no job events, but JOBOPS_ERP_EVENTS_URL is "
            "set: the ERP bridge would receive nothing; turn JOBOPS_EVENTS_PUBLISH on"
        )
    DATABASES["default"].setdefault("OPTIONS", {})
    DATABASES["default"]["OPTIONS"]["options"] = " ".join(
        filter(None, [DATABASES["default"]["OPTIONS"].get("options"), "-c jobops.events=off"])
    )
# ERP outbound bridge (jobs/processes/erp_bridge.py): per-POST timeout, and the backoff before a
# failed delivery (5xx, timeout, connection error) goes back to the queue.
JOBOPS_ERP_BRIDGE_TIMEOUT_SECONDS = env_float("JOBOPS_ERP_BRIDGE_TIMEOUT_SECONDS", 10.0)
JOBOPS_ERP_BRIDGE_BACKOFF_SECONDS = env_float("JOBOPS_ERP_BRIDGE_BACKOFF_SECONDS", 1.0)
JOBOPS_ERP_BRIDGE_BACKOFF_CAP_SECONDS = env_float("JOBOPS_ERP_BRIDGE_BACKOFF_CAP_SECONDS", 30.0)
# Whether the ERP receives job.progress events too (one per running job every
# JOBOPS_PROGRESS_INTERVAL_SECONDS at most): off, only changes of status. setup_topology
# binds (or unbinds) `erp.events` accordingly; the brokerless bridge skips them.
JOBOPS_ERP_EVENTS_PROGRESS = env_bool("JOBOPS_ERP_EVENTS_PROGRESS", False)

# The event stream process (GET /api/v1/jobs/{id}/events, jobs/api/stream.py, the
# Procfile's `events`): open streams at most, in the process and per user in it (over
# either: 429); a comment line every HEARTBEAT seconds on an idle stream; how often the
# heads of the open streams' jobs are read (one query for all of them; a stream whose job
# moved then reads its entries, at most once a second); the threads
# (each a database connection while it reads, closed after) that run its reads.
JOBOPS_SSE_MAX_STREAMS = env_int("JOBOPS_SSE_MAX_STREAMS", 1000)
JOBOPS_SSE_MAX_STREAMS_PER_USER = env_int("JOBOPS_SSE_MAX_STREAMS_PER_USER", 20)
JOBOPS_SSE_HEARTBEAT_SECONDS = env_float("JOBOPS_SSE_HEARTBEAT_SECONDS", 15.0)
JOBOPS_SSE_POLL_SECONDS = env_float("JOBOPS_SSE_POLL_SECONDS", 0.25)
JOBOPS_SSE_DB_CONNECTIONS = env_int("JOBOPS_SSE_DB_CONNECTIONS", 4)
for _name, _value, _low, _high in (
    ("JOBOPS_SSE_MAX_STREAMS", JOBOPS_SSE_MAX_STREAMS, 1, 100_000),
    ("JOBOPS_SSE_MAX_STREAMS_PER_USER", JOBOPS_SSE_MAX_STREAMS_PER_USER, 1, 100_000),
    ("JOBOPS_SSE_HEARTBEAT_SECONDS", JOBOPS_SSE_HEARTBEAT_SECONDS, 0.1, 300),
    ("JOBOPS_SSE_POLL_SECONDS", JOBOPS_SSE_POLL_SECONDS, 0.1, 60),
    ("JOBOPS_SSE_DB_CONNECTIONS", JOBOPS_SSE_DB_CONNECTIONS, 1, 10),
):
    if not _low <= _value <= _high:
        raise ImproperlyConfigured(f"{_name}={_value} must be between {_low} and {_high}")

# --- webhooks per organisation (docs/webhooks.md) --------------------------------------------
# Endpoint secrets are stored encrypted with this Fernet key (32 bytes, url-safe base64:
# `python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"`).
# The development default is derived from SECRET_KEY; production refuses to start without
# one of its own. Changing it makes every stored secret unreadable: rotate endpoints then.
JOBOPS_WEBHOOK_DEV_SECRET_KEY = base64.urlsafe_b64encode(
    hashlib.sha256(b"jobops-webhook-secrets:" + SECRET_KEY.encode()).digest()
).decode()
JOBOPS_WEBHOOK_SECRET_KEY = env_str("JOBOPS_WEBHOOK_SECRET_KEY", "")
if JOBOPS_WEBHOOK_SECRET_KEY:
    try:
        if len(base64.urlsafe_b64decode(JOBOPS_WEBHOOK_SECRET_KEY.encode())) != 32:
            raise ValueError("not 32 bytes")
    except ValueError as exc:
        raise ImproperlyConfigured(
            "JOBOPS_WEBHOOK_SECRET_KEY must be a Fernet key (url-safe base64 of 32 bytes)"
        ) from exc
# The waits before each retry of a failed delivery (the last repeats), for up to the
# window after an endpoint's first failure without a success in between (then it is
# disabled, its queue kept, until someone enables it again); how long delivered
# deliveries and their attempts are kept; how long the old secret also signs after a
# rotation.
try:
    JOBOPS_WEBHOOK_RETRY_SCHEDULE = [
        parse_duration(part)
        for part in env_list("JOBOPS_WEBHOOK_RETRY_SCHEDULE", ["5s", "30s", "2m", "10m", "1h"])
    ]
except ValueError as exc:
    raise ImproperlyConfigured(f"JOBOPS_WEBHOOK_RETRY_SCHEDULE: {exc}") from exc
JOBOPS_WEBHOOK_RETRY_WINDOW = env_duration("JOBOPS_WEBHOOK_RETRY_WINDOW", "3d")
JOBOPS_WEBHOOK_LOG_RETENTION = env_duration("JOBOPS_WEBHOOK_LOG_RETENTION", "14d")
JOBOPS_WEBHOOK_ROTATION_OVERLAP = env_duration("JOBOPS_WEBHOOK_ROTATION_OVERLAP", "24h")
if not JOBOPS_WEBHOOK_RETRY_SCHEDULE:
    raise ImproperlyConfigured("JOBOPS_WEBHOOK_RETRY_SCHEDULE names no duration")
# Receivers on loopback, private, link-local or CGNAT addresses are refused unless this
# is on (local development, tests).
JOBOPS_WEBHOOK_ALLOW_PRIVATE = env_bool("JOBOPS_WEBHOOK_ALLOW_PRIVATE", False)
# Per POST: connect and read timeout; endpoints delivered at once by one process.
JOBOPS_WEBHOOK_TIMEOUT_SECONDS = env_float("JOBOPS_WEBHOOK_TIMEOUT_SECONDS", 10.0)
JOBOPS_WEBHOOK_CONCURRENCY = env_int("JOBOPS_WEBHOOK_CONCURRENCY", 8)
if not 1 <= JOBOPS_WEBHOOK_CONCURRENCY <= 64:
    raise ImproperlyConfigured("JOBOPS_WEBHOOK_CONCURRENCY must be 1-64")

# --- operator portal and admin API (docs/operations/portal.md) -------------------------------
# How long a grant from POST /api/v1/admin/otp lets a token make admin calls.
JOBOPS_OTP_GRANT_SECONDS = env_int("JOBOPS_OTP_GRANT_SECONDS", 15 * 60)
# How long a token made by `manage.py org token` (or in the admin) lives unless told
# otherwise (docs/tenancy.md#service-accounts-and-tokens).
JOBOPS_TOKEN_DEFAULT_TTL = parse_duration(env_str("JOBOPS_TOKEN_DEFAULT_TTL", "90d"))
# A replay or discard selecting more dead letters than this runs in the background
# (a bulk operation the dispatcher works through in chunks, stoppable from the portal).
JOBOPS_DLQ_BACKGROUND_THRESHOLD = env_int("JOBOPS_DLQ_BACKGROUND_THRESHOLD", 100)
# Four eyes on a fix-forward (a replay with edited params): the edit is only requested,
# and a second operator approves (then it runs) or rejects it (docs/operator-controls.md).
JOBOPS_REPLAY_APPROVAL = env_bool("JOBOPS_REPLAY_APPROVAL", False)
JOBOPS_DLQ_BULK_CHUNK = env_int("JOBOPS_DLQ_BULK_CHUNK", 100)
# A dispatcher that dies mid-chunk leaves its claim; another takes the operation over
# after this long.
JOBOPS_DLQ_BULK_LEASE_SECONDS = env_int("JOBOPS_DLQ_BULK_LEASE_SECONDS", 60)
# The dashboard's figures are computed at most this often (shared by every viewer).
JOBOPS_DASHBOARD_CACHE_SECONDS = env_float("JOBOPS_DASHBOARD_CACHE_SECONDS", 5.0)
# How often the dashboard, DLQ overview and bulk operation pages refresh themselves.
JOBOPS_PORTAL_REFRESH_SECONDS = env_int("JOBOPS_PORTAL_REFRESH_SECONDS", 5)

# --- audit (docs/architecture.md) ------------------------------------------------------
AUDIT_SIGNING_KEY = env_str("AUDIT_SIGNING_KEY", DEV_SIGNING_KEY)
AUDIT_SIGNING_KEY_ID = env_str("AUDIT_SIGNING_KEY_ID", "k1")
# Older keys stay readable for verification after a rotation: {"k0": "old secret"}.
AUDIT_SIGNING_KEYS: dict[str, str] = env_json("AUDIT_SIGNING_KEYS", {}) | {
    AUDIT_SIGNING_KEY_ID: AUDIT_SIGNING_KEY
}
# The Ed25519 private key (base64 of its 32 raw bytes) that also signs each checkpoint, so
# that an archive verifies with the public key alone (docs/security.md#audit-archives).
AUDIT_SIGNING_ED25519_KEY = env_str("AUDIT_SIGNING_ED25519_KEY", DEV_SIGNING_ED25519_KEY)
try:
    _ed25519_seed = base64.b64decode(AUDIT_SIGNING_ED25519_KEY, validate=True)
except ValueError:
    _ed25519_seed = b""
if len(_ed25519_seed) != 32:
    raise ImproperlyConfigured("AUDIT_SIGNING_ED25519_KEY must be the base64 of 32 bytes")
AUDIT_CHECKPOINT_SECONDS = env_int("AUDIT_CHECKPOINT_SECONDS", 60)
# Append each checkpoint's hash here too (JSON lines), on storage the database host
# cannot rewrite; `verify_audit_chain --expect-checkpoints-file` checks against it.
AUDIT_CHECKPOINT_EXPORT = env_str("AUDIT_CHECKPOINT_EXPORT", "")
# Where the dispatcher writes the archive of each audit_logs partition that is ready
# (every job chain closed, its month over): audit_archive --partition, verified and
# recorded; empty: the dispatcher writes none. It never detaches
# (docs/operations/audit-archives.md).
AUDIT_ARCHIVE_DIR = env_str("AUDIT_ARCHIVE_DIR", "")
# Days after a job partition's retention ended (its month's end plus the longest
# retention of any job type) that a job still in it is listed on the dashboard as a
# straggler holding the partition (docs/operations/retention.md#stragglers).
AUDIT_STRAGGLER_DAYS = env_int("AUDIT_STRAGGLER_DAYS", 30)
# With DEBUG off, web, workers and the dispatcher refuse a superuser or the audit tables'
# owner as their database role (audit/db_roles.py); true accepts that risk knowingly.
JOBOPS_DB_ALLOW_PRIVILEGED = env_bool("JOBOPS_DB_ALLOW_PRIVILEGED", False)
# Checks verify_audit_chain runs in its snapshot besides the chains themselves:
# dotted paths of `check(report, chains)` (jobs: each job's status against its chain,
# and a row for every job chain that does not end in `purged`).
AUDIT_VERIFY_CHECKS: list[str] = [
    "jobs.selectors.audit_checks.job_status_matches_chain",
    "jobs.selectors.audit_checks.job_rows_present",
]
# A full verification of a table over AUDIT_VERIFY_PARALLEL_MIN_ROWS rows reads it in
# this many chain ranges at once, each on its own connection (one more backend each)
# sharing one snapshot: the server's index scan, not Python's hashing, is the slower half.
AUDIT_VERIFY_STREAMS = env_int("AUDIT_VERIFY_STREAMS", 2)
AUDIT_VERIFY_PARALLEL_MIN_ROWS = env_int("AUDIT_VERIFY_PARALLEL_MIN_ROWS", 200_000)
# How often the dispatcher starts `verify_audit_chain --since-checkpoint --record` (the
# entries appended since the newest exported checkpoint) and the full walk
# (docs/operations/audit-archives.md#incremental-verification); 0 disables either.
AUDIT_VERIFY_INCREMENTAL_EVERY = (
    env_duration("AUDIT_VERIFY_INCREMENTAL_EVERY", "1d")
    if env_str("AUDIT_VERIFY_INCREMENTAL_EVERY", "1d").strip() != "0"
    else timedelta(0)
)
AUDIT_VERIFY_FULL_EVERY = (
    env_duration("AUDIT_VERIFY_FULL_EVERY", "7d")
    if env_str("AUDIT_VERIFY_FULL_EVERY", "7d").strip() != "0"
    else timedelta(0)
)
# The keyring (docs/operations/keys.md#the-keyring): the Ed25519 public keys published
# before the current one, each {key_id, public_key, not_before, not_after}, and since when
# the current key (under AUDIT_SIGNING_KEY_ID) signs (ISO 8601; empty: no lower bound).
AUDIT_PUBLISHED_KEYS: list[dict[str, Any]] = env_json("AUDIT_PUBLISHED_KEYS", [])
AUDIT_SIGNING_KEY_NOT_BEFORE = env_str("AUDIT_SIGNING_KEY_NOT_BEFORE", "")

# --- Celery (the broker half lives in config/celery.py) -------------------------

# --- API --------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # ApiTokens (expiring, scoped) and the legacy DRF tokens: docs/tenancy.md.
        "tenants.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        # Each view's `required_scope` against the token's scopes (docs/tenancy.md#scopes).
        "tenants.permissions.HasRequiredScope",
    ],
    "DEFAULT_PARSER_CLASSES": ["core.api.parsers.BoundedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.api.exceptions.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "jobops API",
    "DESCRIPTION": "Submit, watch and cancel background jobs; operators' admin calls (an OTP "
    "grant, the dead-letter queues) under /api/v1/admin/. Authenticate with "
    "`Authorization: Token <key>` (or `Bearer`): a token expires (401 ERR-AUTH-401) and has "
    "scopes (jobs:read, jobs:write, jobs:cancel, admin:dlq; 403 ERR-AUTH-403 without the "
    "operation's, named by its x-required-scope).",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Paths are served with and without a trailing slash; document each once.
    "PREPROCESSING_HOOKS": ["core.api.schema.drop_slash_aliases"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "jobs.api.schema.close_request_bodies",
        "core.api.schema.close_request_bodies",
        "tenants.schema.document_scopes",
        "core.api.schema.document_correlation_id",
    ],
    "COMPONENT_SPLIT_REQUEST": True,
    # A batch result's status is not a job's: its own enum, named, and the job's keeps
    # its name (a collision would rename both, breaking generated clients).
    "ENUM_NAME_OVERRIDES": {
        "StatusEnum": "jobs.domain.states.Status",
        "BatchResultStatusEnum": "jobs.api.batch.BATCH_STATUSES",
    },
    # The docs pages load their JavaScript and CSS from this server, not from a CDN: they
    # work without internet access (an operator's network often has none).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- observability ------------------------------------------------------------------
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# Refreshed at each /metrics scrape: dotted paths of no-argument callables that set the
# gauges derived from the database (core/metrics.py stays ignorant of the apps).
JOBOPS_METRICS_REFRESH: list[str] = ["jobs.integrations.metrics.metrics_refresh_gauges"]
# What /readyz adds to its detail beside the checks (core/health.py, which names no app):
# each a no-argument callable returning a dict merged into the body (never a check).
JOBOPS_READY_DETAIL: list[str] = [
    "jobs.selectors.paused_queues_detail",
    "jobs.integrations.liveness.broker_nodes_detail",
]
# Workers and dispatchers have no web server: each serves /metrics here (0: off).
# Organisations (slugs) whose jobs the job_create and job_finished counters count under
# their own `org` label; every other organisation's under "other". Empty (the default):
# no org label at all. Kept small: each slug multiplies those series.
JOBOPS_METRICS_TENANT_LABELS: list[str] = env_list("JOBOPS_METRICS_TENANT_LABELS", [])
if len(JOBOPS_METRICS_TENANT_LABELS) > 20 or "other" in JOBOPS_METRICS_TENANT_LABELS:
    raise ImproperlyConfigured(
        "JOBOPS_METRICS_TENANT_LABELS takes at most 20 organisation slugs, not 'other' "
        "(the label of every organisation not listed)"
    )
JOBOPS_METRICS_PORT = env_int("JOBOPS_METRICS_PORT", 0)
JOBOPS_METRICS_ADDR = env_str("JOBOPS_METRICS_ADDR", "127.0.0.1")
# /readyz: each dependency must answer within this; the answer is reused this long.
JOBOPS_READY_TIMEOUT_SECONDS = env_float("JOBOPS_READY_TIMEOUT_SECONDS", 1.0)
JOBOPS_READY_CACHE_SECONDS = env_float("JOBOPS_READY_CACHE_SECONDS", 2.0)
# Workers and dispatchers refresh a Redis liveness key this often (jobs/integrations/liveness.py).
JOBOPS_PROCESS_HEARTBEAT_SECONDS = env_float("JOBOPS_PROCESS_HEARTBEAT_SECONDS", 10.0)
LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
LOG_JSON = env_bool("LOG_JSON", not DEBUG)
# structlog and stdlib records share one chain (core/logging.py): timestamp, level,
# bound context (request_id, job_id, ...), secrets and PII masked; JSON lines if LOG_JSON.
LOGGING = logging_config(json=LOG_JSON, level=LOG_LEVEL)
configure_structlog()
# Field names of personal data in this deployment's job params and events, masked in
# every log line like passwords and tokens are (comma-separated, e.g. "phone,iban").
LOG_MASK_FIELDS = env_list("LOG_MASK_FIELDS", [])
configure_masking(LOG_MASK_FIELDS)

# --- portal login throttling (django-axes) ------------------------------------------
# JOBOPS_LOGIN_FAILURE_LIMIT wrong passwords in a row for one username, or from one
# address, lock that username or address out of the portal login for
# JOBOPS_LOGIN_LOCKOUT_MINUTES, counted from the last failure (a failure during the
# lockout starts it again); a successful login clears the count. Audited on the ops
# chain (`login_locked_out`, `login_unlocked`); `manage.py login_unlock` ends one early.
AXES_FAILURE_LIMIT = env_int("JOBOPS_LOGIN_FAILURE_LIMIT", 5)
JOBOPS_LOGIN_LOCKOUT_MINUTES = env_int("JOBOPS_LOGIN_LOCKOUT_MINUTES", 15)
AXES_COOLOFF_TIME = timedelta(minutes=JOBOPS_LOGIN_LOCKOUT_MINUTES)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "config.admin_site.login_locked_out"
# Behind a reverse proxy REMOTE_ADDR is the proxy's, and one attacker would lock every
# operator out: name the request header the proxy sets to the client's address (e.g.
# HTTP_X_REAL_IP, or HTTP_X_FORWARDED_FOR whose last entry the proxy appended).
JOBOPS_CLIENT_IP_HEADER = env_str("JOBOPS_CLIENT_IP_HEADER", "")
AXES_CLIENT_IP_CALLABLE = "core.client_ip.client_ip"
# The typed name, cut to the 255 characters axes stores (a longer one was a 500).
AXES_USERNAME_CALLABLE = "audit.logins.login_username"
# Masked in axes' log lines and in the form data it keeps of each failure (passwords
# always are): the typed name, the address, the one-time code and the CSRF token.
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "otp_token", "csrfmiddlewaretoken"]
# Not its "AXES: BEGIN version ..." banner at every start of every process (each
# manage.py command printed it on stderr); its lines name only the lockout parameters.
AXES_VERBOSE = False

OTP_TOTP_ISSUER = "jobops"
# No device secret (TOTP key, QR code) is ever shown in the portal, not even to
# superusers: devices are enrolled with `manage.py otp_enroll` on the host.
OTP_ADMIN_HIDE_SENSITIVE_DATA = True


def check_production_safety() -> None:
    """Refuse to start with DEBUG off on a development default."""
    if DEBUG:
        return
    problems = []
    # Django's own bar (check --deploy, security.W009): 50 characters, 5 distinct.
    if SECRET_KEY == DEV_SECRET_KEY or len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5:
        problems.append(
            "SECRET_KEY is unset, the development default or weak (need >= 50 characters, "
            ">= 5 distinct)"
        )
    if not ALLOWED_HOSTS:
        problems.append("ALLOWED_HOSTS is empty")
    if AUDIT_SIGNING_KEY == DEV_SIGNING_KEY or len(AUDIT_SIGNING_KEY) < 32:
        problems.append("AUDIT_SIGNING_KEY is unset or the development default")
    if AUDIT_SIGNING_ED25519_KEY == DEV_SIGNING_ED25519_KEY:
        problems.append("AUDIT_SIGNING_ED25519_KEY is unset or the development default")
    if not METRICS_TOKEN:
        problems.append("METRICS_TOKEN is unset (/metrics would be public)")
    if not JOBOPS_SECRET_PARAM_NAMES:
        problems.append("JOBOPS_SECRET_PARAM_NAMES is empty (no params key would be refused)")
    if not JOBOPS_WEBHOOK_SECRET_KEY:
        problems.append("JOBOPS_WEBHOOK_SECRET_KEY is unset (webhook secrets need their own key)")
    if ARTEFACT_STORAGE == "s3" and not ARTEFACT_S3_BUCKET:
        problems.append("ARTEFACT_STORAGE is s3 but ARTEFACT_S3_BUCKET is unset")
    if problems:
        raise ImproperlyConfigured("Refusing to start with DEBUG off: " + "; ".join(problems) + ".")


check_production_safety()
