"""Job categories (docs/configuration.md#job-categories): each type's category decides
its idempotency key's TTL and its retention, a type may override either."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from core.durations import format_duration, parse_duration
from jobs.types import all_types
from tests.factories import make_job
from tests.processes import ROOT

DAY = timedelta(days=1)


def test_each_type_has_its_category_with_that_categorys_durations():
    types = all_types()
    assert {name: t.category for name, t in types.items()} == {
        "ai": "planning",
        "model": "planning",
        "cam": "planning",
        "sim": "planning",
        "report": "import_export",
        "erp": "notification",
    }
    assert (types["erp"].key_ttl, types["erp"].retention) == (7 * DAY, 7 * DAY)
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


def _settings(**env: str) -> subprocess.CompletedProcess[str]:
    program = (
        "import django, json; django.setup(); from jobs.types import all_types; "
        "print(json.dumps({n: [t.key_ttl.total_seconds(), t.retention.total_seconds()] "
        "for n, t in all_types().items()}))"
    )
    return subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_environment_sets_categories_and_types():
    result = _settings(
        JOBOPS_RETENTION="planning=12h,notification=1m",
        JOBOPS_KEY_TTL="import_export=2d",
        JOBOPS_JOB_TYPES=json.dumps({"cam": {"key_ttl": "3h"}}),
    )
    assert result.returncode == 0, result.stderr
    seconds = json.loads(result.stdout)
    assert seconds["sim"] == [30 * 86400, 12 * 3600]
    assert seconds["cam"] == [3 * 3600, 12 * 3600]
    assert seconds["erp"] == [7 * 86400, 60]
    assert seconds["report"] == [2 * 86400, 30 * 86400]


def test_the_single_key_ttl_of_earlier_versions_still_applies_where_not_named():
    result = _settings(JOBOPS_IDEMPOTENCY_KEY_DAYS="2", JOBOPS_KEY_TTL="notification=1d")
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
def test_a_bad_duration_refuses_to_start_and_is_named(env, named):
    result = _settings(**env)
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
