"""Settings come from the environment and refuse unsafe production defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.processes import PRODUCTION_SAFE as SAFE
from tests.processes import ROOT, operator_env
from tests.starter import Starter


@pytest.fixture(scope="module")
def starter() -> Iterator[Starter]:
    """Fresh interpreters forked from one process (tests/starter.py): each start below
    is a new process with its own environment, without spawning a Python for each."""
    with Starter() as one:
        yield one


def _start(starter: Starter, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in SAFE}
    env.update(SAFE)
    env.update(overrides)
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    return starter.run(
        "import django; django.setup(); print('started')",
        {k: v for k, v in env.items() if v is not None},
    )


def test_it_starts_in_production_mode_with_safe_settings(starter):
    result = _start(starter)
    assert result.returncode == 0, result.stderr
    assert "started" in result.stdout


def test_a_manage_py_command_prints_no_banner_of_django_axes():
    """django-axes logged "AXES: BEGIN version ..." at every start: on stderr of every
    manage.py command an operator runs."""
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=operator_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
    assert "AXES" not in result.stdout + result.stderr, result.stderr


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"SECRET_KEY": ""}, "SECRET_KEY"),
        ({"SECRET_KEY": "dev-insecure-jobops-secret-key-change-me"}, "SECRET_KEY"),
        ({"ALLOWED_HOSTS": ""}, "ALLOWED_HOSTS"),
        ({"AUDIT_SIGNING_KEY": "short"}, "AUDIT_SIGNING_KEY"),
        ({"AUDIT_SIGNING_ED25519_KEY": ""}, "AUDIT_SIGNING_ED25519_KEY"),
        (
            {"AUDIT_SIGNING_ED25519_KEY": "kdmcBnfGMe7AYYOcQfdm8KgY6+9twS41i2nc30Fgw+8="},
            "AUDIT_SIGNING_ED25519_KEY",
        ),
        ({"METRICS_TOKEN": ""}, "METRICS_TOKEN"),
        ({"JOBOPS_SECRET_PARAM_NAMES": ""}, "JOBOPS_SECRET_PARAM_NAMES is empty"),
        ({"JOBOPS_WEBHOOK_SECRET_KEY": ""}, "JOBOPS_WEBHOOK_SECRET_KEY is unset"),
    ],
)
def test_production_refuses_unsafe_value_and_names_it(overrides, named, starter):
    result = _start(starter, **overrides)
    assert result.returncode != 0
    assert "Refusing to start with DEBUG off" in result.stderr
    assert named in result.stderr


@pytest.mark.parametrize(
    "value", ["not base64!", "c2hvcnQ=", "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB"]
)
def test_an_ed25519_key_that_is_not_32_bytes_of_base64_is_refused_and_named(value, starter):
    result = _start(starter, DEBUG="true", AUDIT_SIGNING_ED25519_KEY=value)
    assert result.returncode != 0
    assert "AUDIT_SIGNING_ED25519_KEY must be the base64 of 32 bytes" in result.stderr


def test_bad_boolean_is_named(starter):
    result = _start(starter, DEBUG="maybe")
    assert result.returncode != 0
    assert "DEBUG='maybe' is not a boolean" in result.stderr


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2"])
def test_a_work_budget_fraction_outside_zero_to_one_is_refused_and_named(value, starter):
    result = _start(starter, JOBOPS_WORK_BUDGET_FRACTION=value)
    assert result.returncode != 0
    assert "JOBOPS_WORK_BUDGET_FRACTION" in result.stderr and "(0, 1]" in result.stderr


def test_a_negative_time_limit_retries_is_refused_and_named(starter):
    result = _start(starter, JOBOPS_TIME_LIMIT_RETRIES="-1")
    assert result.returncode != 0
    assert "JOBOPS_TIME_LIMIT_RETRIES=-1 is negative" in result.stderr


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"ARTEFACT_STORAGE": "ftp"}, "ARTEFACT_STORAGE='ftp': use filesystem or s3"),
        ({"ARTEFACT_DOWNLOAD": "email"}, "ARTEFACT_DOWNLOAD='email': use stream or presigned"),
        ({"ARTEFACT_PRESIGNED_EXPIRY_SECONDS": "0"}, "ARTEFACT_PRESIGNED_EXPIRY_SECONDS"),
        ({"JOBOPS_MAX_MESSAGE_BYTES": "1000"}, "JOBOPS_MAX_MESSAGE_BYTES=1000 is below"),
        ({"JOBOPS_QUORUM_GROUP_SIZE": "-1"}, "JOBOPS_QUORUM_GROUP_SIZE=-1"),
        ({"JOBOPS_QUORUM_GROUP_SIZE": "100"}, "JOBOPS_QUORUM_GROUP_SIZE=100"),
        ({"JOBOPS_DLQ_QUEUE_TYPE": "stream"}, "JOBOPS_DLQ_QUEUE_TYPE='stream'"),
        ({"JOBOPS_WORKER_PREFETCH": "0"}, "JOBOPS_WORKER_PREFETCH=0 must be 1-64"),
        ({"JOBOPS_WORKER_PREFETCH": "65"}, "JOBOPS_WORKER_PREFETCH=65 must be 1-64"),
        ({"JOBOPS_SECRET_PARAM_NAMES": "password,-_"}, "JOBOPS_SECRET_PARAM_NAMES: every name"),
        (
            {"ARTEFACT_STORAGE": "s3", "ARTEFACT_S3_BUCKET": ""},
            "ARTEFACT_STORAGE is s3 but ARTEFACT_S3_BUCKET is unset",
        ),
    ],
)
def test_a_bad_artefact_or_message_setting_refuses_to_start_and_is_named(overrides, named, starter):
    result = _start(starter, **overrides)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and named in result.stderr


def test_production_starts_with_s3_artefacts_and_a_bucket(starter):
    result = _start(starter, ARTEFACT_STORAGE="s3", ARTEFACT_S3_BUCKET="jobops-artefacts")
    assert result.returncode == 0, result.stderr


def test_development_defaults_start_without_any_variable(starter):
    result = _start(starter, **{k: "" for k in SAFE} | {"DEBUG": "true"})
    assert result.returncode == 0, result.stderr


def test_check_deploy_is_clean_with_production_settings():
    env = {k: v for k, v in os.environ.items() if k not in SAFE}
    env.update(SAFE, SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https")
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNINGS" not in result.stdout + result.stderr


def test_debug_is_off_unless_asked_for(starter):
    env = {k: v for k, v in os.environ.items() if k != "DEBUG"}
    env.update({k: v for k, v in SAFE.items() if k != "DEBUG"})
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.DEBUG, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE)"
    )
    result = starter.run(code, env)
    assert result.stdout.split() == ["False", "True", "31536000", "True"], result.stderr
    # And without production values, a forgotten DEBUG refuses to start.
    bare = {k: v for k, v in os.environ.items() if k not in SAFE}
    bare["DJANGO_SETTINGS_MODULE"] = "config.settings"
    refused = starter.run("import django; django.setup()", bare)
    assert refused.returncode != 0 and "Refusing to start with DEBUG off" in refused.stderr


def test_each_xdist_worker_gets_its_own_vhost_and_redis_db(monkeypatch):
    from config import settings_test
    from config.settings_test import xdist_worker_urls

    monkeypatch.setattr(settings_test, "REDIS_DATABASES", 16)  # a server's default

    assert xdist_worker_urls(
        "gw2", "amqp://guest:guest@127.0.0.1:5672/jobops_h4", "redis://127.0.0.1:6379/4"
    ) == ("amqp://guest:guest@127.0.0.1:5672/jobops_h4_gw2", "redis://127.0.0.1:6379/6")
    # The default vhost "/" (and none at all) becomes jobops_gwN; db 0 when none is named.
    for broker in ("amqp://guest:guest@127.0.0.1:5672//", "amqp://guest:guest@127.0.0.1:5672"):
        assert xdist_worker_urls("gw0", broker, "redis://127.0.0.1:6379") == (
            "amqp://guest:guest@127.0.0.1:5672/jobops_gw0",
            "redis://127.0.0.1:6379/0",
        )
    with pytest.raises(ImproperlyConfigured, match="no Redis db for xdist worker gw3"):
        xdist_worker_urls("gw3", "amqp://127.0.0.1//", "redis://127.0.0.1:6379/13")


def test_a_process_started_by_an_xdist_worker_keeps_that_workers_vhost_and_redis_db(starter):
    """A worker or dispatcher started by a test inherits the worker's derived URLs and the
    marker, and loads config.settings_test again without deriving a second time."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "PYTEST_XDIST_WORKER": "gw1",
        "JOBOPS_TEST_XDIST_WORKER": "gw1",
        "BROKER_URL": "amqp://guest:guest@127.0.0.1:5672/jobops_gw1",
        "REDIS_URL": "redis://127.0.0.1:6379/1",
    }
    code = "from django.conf import settings as s; print(s.BROKER_URL, s.REDIS_URL)"
    started = starter.run(code, env)
    assert started.stdout.split() == [env["BROKER_URL"], env["REDIS_URL"]], started.stderr


@pytest.mark.django_db
def test_processes_a_test_starts_use_this_xdist_workers_database_vhost_and_redis_db():
    from django.conf import settings
    from django.db import connection

    from tests.processes import subprocess_env

    env, name = subprocess_env(), connection.settings_dict["NAME"]
    assert env["DATABASE_URL"].endswith(f"/{name}")
    assert (env["BROKER_URL"], env["REDIS_URL"]) == (settings.BROKER_URL, settings.REDIS_URL)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # pytest-django's suffix, and config/settings_test.py's
        assert name.endswith(f"_{worker}") and settings.BROKER_URL.endswith(f"_{worker}")


POSTGRES_QUEUES = {
    f"JOBOPS_EXECUTOR_{q}": "postgres" for q in ("DEFAULT", "MODEL", "CAM", "SIM", "REPORT", "ERP")
}


def test_without_a_broker_every_queue_must_be_a_postgres_queue_and_each_other_is_named(starter):
    result = _start(starter, DEBUG="true", JOBOPS_BROKER="off", JOBOPS_EXECUTOR_SIM="postgres")
    assert result.returncode != 0
    assert "JOBOPS_BROKER=off needs every queue on the PostgreSQL executor" in result.stderr
    assert "JOBOPS_EXECUTOR_DEFAULT=postgres" in result.stderr
    assert "JOBOPS_EXECUTOR_SIM" not in result.stderr


def test_postgres_alone_starts_with_every_queue_on_postgres(starter):
    result = _start(
        starter, DEBUG="true", JOBOPS_BROKER="off", JOBOPS_REDIS="off", **POSTGRES_QUEUES
    )
    assert result.returncode == 0, result.stderr


def test_an_unknown_executor_is_named(starter):
    result = _start(starter, DEBUG="true", JOBOPS_EXECUTOR_SIM="rq")
    assert result.returncode != 0
    assert "JOBOPS_EXECUTOR_SIM='rq' must be one of celery, postgres" in result.stderr


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"JOBOPS_CONNECTORS": '{"erp": {"failures": 0}}'}, "JOBOPS_CONNECTORS: erp.failures=0"),
        (
            {"JOBOPS_CONNECTORS": '{"erp": {"cooldown_seconds": "1h"}}'},
            "erp.cooldown_seconds='1h'",
        ),
        ({"JOBOPS_CONNECTORS": '{"erp": {"speed": 1}}'}, "erp.speed=1"),
        ({"JOBOPS_CONNECTORS": '{"crm": {"failures": 3}}'}, "'crm' is no job type's connector"),
        ({"JOBOPS_CONNECTOR_JITTER_SECONDS": "-1"}, "(defaults).jitter_seconds=-1.0"),
        (
            {"JOBOPS_CONNECTORS": '{"erp": {"providers": [{"name": "a"}], "fallback": "b"}}'},
            "JOBOPS_CONNECTORS: erp.fallback='b' is none of its providers (a)",
        ),
        ({"JOBOPS_CONNECTORS": '{"erp": {"fallback": "b"}}'}, "a fallback needs a providers"),
        ({"JOBOPS_JOB_TYPES": '{"ai": {"connector": "Open AI"}}'}, "ai.connector='Open AI'"),
        ({"JOBOPS_JOB_TYPES": '{"erp": {"connector_open": "409"}}'}, "erp.connector_open='409'"),
        ({"JOBOPS_RETRY_AFTER_MAX_SECONDS": "-5"}, "JOBOPS_RETRY_AFTER_MAX_SECONDS=-5.0"),
    ],
)
def test_a_bad_connector_setting_refuses_to_start_and_is_named(overrides, named, starter):
    result = _start(starter, **overrides)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and named in result.stderr, result.stderr[-500:]


def test_a_connector_named_by_a_type_gets_its_own_breaker_settings(starter):
    result = starter.run(
        "import django; django.setup(); from django.conf import settings as s; "
        "c = s.JOBOPS_CONNECTORS; print(c['openai']['failures'], c['erp']['failures'])",
        {
            **{k: v for k, v in os.environ.items() if k not in SAFE},
            "DEBUG": "true",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "JOBOPS_JOB_TYPES": '{"ai": {"connector": "openai"}}',
            "JOBOPS_CONNECTORS": '{"openai": {"failures": 2}}',
        },
    )
    assert result.stdout.split()[-2:] == ["2", "5"], result.stderr[-500:]


def test_a_connector_lists_its_providers_and_keeps_its_breaker_settings(starter):
    erp = {
        "failures": 2,
        "providers": [{"name": "acme", "weight": 3}, {"name": "spare"}],
        "fallback": "spare",
    }
    result = starter.run(
        "import django; django.setup(); from django.conf import settings as s; "
        "e = s.JOBOPS_CONNECTORS['erp']; "
        "print(e['failures'], [(p['name'], p['weight'], p['fallback']) for p in e['providers']])",
        {
            **{k: v for k, v in os.environ.items() if k not in SAFE},
            "DEBUG": "true",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "JOBOPS_CONNECTORS": json.dumps({"erp": erp}),
        },
    )
    assert result.stdout.strip().splitlines()[-1] == (
        "2 [('acme', 3, False), ('spare', 0, True)]"
    ), result.stderr[-500:]


def test_events_off_with_an_erp_configured_refuses_to_start_and_says_why(starter):
    result = _start(
        starter, JOBOPS_EVENTS_PUBLISH="off", JOBOPS_ERP_EVENTS_URL="http://erp.example/events"
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr, result.stderr[-500:]
    assert "JOBOPS_EVENTS_PUBLISH=off writes no job events" in result.stderr


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "erp", "session"),
    [
        ("off", "", "off"),
        ("on", "", None),
        (None, "", "off"),  # no consumer configured: off by default
        (None, "http://erp.example/events", None),  # the ERP bridge reads them: on
    ],
)
def test_events_off_starts_every_database_session_with_it(value, erp, session, starter):
    """The transitions read `jobops.events` (jobs_events_on): off where set off, and
    by default where no consumer (the ERP bridge) is configured."""
    from tests.processes import subprocess_env

    env = {k: v for k, v in subprocess_env().items() if k != "JOBOPS_EVENTS_PUBLISH"}
    # The deployment's settings, not the suite's (which turn events on for every test).
    env.update(DJANGO_SETTINGS_MODULE="config.settings", JOBOPS_ERP_EVENTS_URL=erp)
    result = starter.run(
        "import django; django.setup(); from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute(\"SELECT current_setting('jobops.events', true)\")\n"
        "    print('session', c.fetchone()[0])",
        {**env, **({"JOBOPS_EVENTS_PUBLISH": value} if value is not None else {})},
    )
    assert result.returncode == 0, result.stderr[-500:]
    assert f"session {session}" in result.stdout


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("JOBOPS_WEBHOOK_SECRET_KEY", "short", "JOBOPS_WEBHOOK_SECRET_KEY must be a Fernet key"),
        ("JOBOPS_WEBHOOK_RETRY_SCHEDULE", "5s,5 minutes", "'5 minutes' is not a duration"),
        ("JOBOPS_WEBHOOK_CONCURRENCY", "0", "JOBOPS_WEBHOOK_CONCURRENCY must be 1-64"),
    ],
)
def test_a_bad_webhook_setting_is_refused_and_named(name, value, said, starter):
    result = _start(starter, DEBUG="true", **{name: value})
    assert result.returncode != 0
    assert said in result.stderr
