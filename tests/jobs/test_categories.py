"""Job categories (docs/configuration.md#job-categories): each type's category decides
its idempotency key's TTL, its retention and its retry policy; a type may override each."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from core.durations import format_duration, parse_duration
from jobs.domain.types import all_types
from tests.factories import make_job
from tests.starter import Starter

DAY = timedelta(days=1)


def test_each_type_has_its_category_with_that_categorys_durations():
    types = all_types()
    assert {name: t.category for name, t in types.items()} == {
        "ai": "planning",
        "model": "planning",
        "cam": "planning",
        "sim": "planning",
        "report": "import_export",
        "import": "import_export",
        "erp": "notification",
        "annotate": "audit_enrichment",
    }
    assert (types["erp"].key_ttl, types["erp"].retention) == (7 * DAY, 7 * DAY)
    assert (types["annotate"].key_ttl, types["annotate"].retention) == (30 * DAY, 90 * DAY)
    assert (types["sim"].key_ttl, types["sim"].retention) == (30 * DAY, 90 * DAY)
    assert (types["report"].key_ttl, types["report"].retention) == (30 * DAY, 30 * DAY)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("job_type", "params", "days"),
    [("erp", {"event": "order.created"}, 7), ("sim", None, 30)],
)
def test_a_key_lives_as_long_as_its_categorys_ttl(job_type, params, days):
    before = timezone.now()
    job = make_job(job_type=job_type, params=params, key=f"key-{job_type}")
    expires = job.idempotency_expires_at - before
    assert timedelta(days=days) <= expires < timedelta(days=days, seconds=30)


def test_a_type_override_replaces_its_categorys_value(settings):
    settings.JOB_TYPES = {
        **settings.JOB_TYPES,
        "sim": {**settings.JOB_TYPES["sim"], "retention": 14 * DAY},
    }
    types = all_types()
    assert types["sim"].retention == 14 * DAY
    assert types["model"].retention == 90 * DAY  # the category's, untouched


@pytest.fixture(scope="module")
def starter() -> Iterator[Starter]:
    """Fresh interpreters forked from one process (tests/starter.py), as the settings
    tests start theirs: each start below is a new process with its own environment,
    without spawning a Python for each."""
    with Starter() as one:
        yield one


def _settings(starter: Starter, **env: str) -> subprocess.CompletedProcess[str]:
    """Each type's [key TTL, retention] in seconds, as a process with `env` reads them."""
    return _types_with(starter, "[t.key_ttl.total_seconds(), t.retention.total_seconds()]", env)


def _retries(starter: Starter, **env: str) -> subprocess.CompletedProcess[str]:
    """Each type's [max_retries, backoff_cap], as a process with `env` reads them."""
    return _types_with(starter, "[t.max_retries, t.backoff_cap]", env)


def _types_with(
    starter: Starter, value: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    program = (
        "import django, json; django.setup(); from jobs.domain.types import all_types; "
        f"print(json.dumps({{n: {value} for n, t in all_types().items()}}))"
    )
    return starter.run(program, {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env})


def test_the_environment_sets_categories_and_types(starter):
    result = _settings(
        starter,
        JOBOPS_RETENTION="planning=12h,notification=1m,audit_enrichment=1d",
        JOBOPS_KEY_TTL="import_export=2d",
        JOBOPS_JOB_TYPES=json.dumps({"cam": {"key_ttl": "3h"}}),
    )
    assert result.returncode == 0, result.stderr
    seconds = json.loads(result.stdout)
    assert seconds["sim"] == [30 * 86400, 12 * 3600]
    assert seconds["cam"] == [3 * 3600, 12 * 3600]
    assert seconds["erp"] == [7 * 86400, 60]
    assert seconds["report"] == [2 * 86400, 30 * 86400]
    assert seconds["annotate"] == [30 * 86400, 86400]


def test_the_single_key_ttl_of_earlier_versions_still_applies_where_not_named(starter):
    result = _settings(starter, JOBOPS_IDEMPOTENCY_KEY_DAYS="2", JOBOPS_KEY_TTL="notification=1d")
    assert result.returncode == 0, result.stderr
    seconds = json.loads(result.stdout)
    assert seconds["sim"][0] == 2 * 86400 and seconds["erp"][0] == 86400


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"JOBOPS_RETENTION": "planing=90d"}, "JOBOPS_RETENTION: 'planing=90d' is not one of"),
        ({"JOBOPS_RETENTION": "planning=90"}, "'90' is not a duration"),
        ({"JOBOPS_KEY_TTL": "notification"}, "JOBOPS_KEY_TTL: 'notification' is not one of"),
        ({"JOBOPS_JOB_TYPES": '{"sim": {"retention": "soon"}}'}, "sim.retention"),
    ],
)
def test_a_bad_duration_refuses_to_start_and_is_named(env, named, starter):
    result = _settings(starter, **env)
    assert result.returncode != 0
    assert named in result.stderr


@pytest.mark.parametrize(
    ("text", "value"),
    [("90d", 90 * DAY), ("12h", timedelta(hours=12)), ("30m", timedelta(minutes=30))],
)
def test_durations_read_and_write_the_same_text(text, value):
    assert parse_duration(text) == value
    assert format_duration(value) == text
    assert format_duration(timedelta(seconds=45)) == "45s"


@pytest.mark.parametrize("text", ["", "d", "1.5d", "-1d", "10w", "1d2h", "9999999999s"])
def test_a_malformed_duration_is_refused(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


# --- retry policies (JOBOPS_CATEGORY_RETRIES) -----------------------------------------

# Each type's [max_retries, backoff_cap] before categories had a retry policy.
RETRIES = {
    "ai": [3, 20],
    "model": [5, 60],
    "cam": [5, 60],
    "sim": [5, 60],
    "report": [5, 45],
    "import": [5, 45],  # new with the category's policy: import_export's
    "erp": [5, 45],
    # audit_enrichment's policy (a few reads and one append: a retry outlasts a hiccup)
    "annotate": [3, 20],
}


def test_every_type_keeps_its_retry_policy_by_default():
    assert {n: [t.max_retries, t.backoff_cap] for n, t in all_types().items()} == RETRIES


def test_a_categorys_retry_policy_applies_to_its_types_that_set_none_of_their_own(starter):
    result = _retries(
        starter,
        JOBOPS_CATEGORY_RETRIES=json.dumps(
            {"notification": {"max_retries": 8}, "planning": {"backoff_cap": 90}}
        ),
        JOBOPS_JOB_TYPES=json.dumps({"cam": {"max_retries": 1}}),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        **RETRIES,
        "erp": [8, 45],
        "model": [5, 90],
        "sim": [5, 90],
        "cam": [1, 90],  # its own max_retries, the category's backoff cap
        # ai sets both in the types table: the category's policy does not reach it.
    }


@pytest.mark.django_db
def test_a_job_of_the_category_gets_the_attempts_of_its_policy(settings):
    settings.JOBOPS_CATEGORY_RETRIES = {
        **settings.JOBOPS_CATEGORY_RETRIES,
        "notification": {"max_retries": 8, "backoff_cap": 45},
    }
    job = make_job(job_type="erp", params={"event": "order.created"})
    assert job.max_attempts == 9
    assert make_job(job_type="report", params={}).max_attempts == 6  # another category


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ('{"notifications": {"max_retries": 8}}', "'notifications' is not one of"),
        ('{"planning": {"retries": 8}}', "planning.retries=8"),
        ('{"planning": {"max_retries": -1}}', "planning.max_retries=-1"),
        ('{"planning": {"backoff_cap": 0}}', "planning.backoff_cap=0"),
        ('{"planning": {"max_retries": "8"}}', "planning.max_retries='8'"),
    ],
)
def test_a_bad_retry_policy_refuses_to_start_and_is_named(value, named, starter):
    result = _retries(starter, JOBOPS_CATEGORY_RETRIES=value)
    assert result.returncode != 0
    assert f"JOBOPS_CATEGORY_RETRIES: {named}" in result.stderr
