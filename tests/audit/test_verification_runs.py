"""The dispatcher starts the verification runs when due, as child processes, and never
waits for them; the gauge reads the newest successful run of each mode."""

from __future__ import annotations

import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from audit import verification_runs
from audit.verification_runs import FULL, INCREMENTAL, audit_verify_due
from jobs.integrations.metrics import metrics_refresh_gauges
from tests.factories import make_job


@pytest.fixture
def children(monkeypatch):
    """Children that stand in for verify_audit_chain: a process that sleeps `seconds`."""
    started: list[str] = []

    def command(mode: str) -> list[str]:
        started.append(mode)
        return [sys.executable, "-c", "import time; time.sleep(0.5)"]

    monkeypatch.setattr(verification_runs, "_command", command)
    monkeypatch.setattr(verification_runs, "_children", {})
    monkeypatch.setattr(verification_runs, "_started", {})
    yield started
    for child in verification_runs._children.values():
        child.wait(5)


@pytest.mark.django_db
def test_due_runs_start_once_as_children_and_a_recorded_run_is_not_due(settings, children):
    settings.AUDIT_VERIFY_FULL_EVERY = timedelta(days=7)
    settings.AUDIT_VERIFY_INCREMENTAL_EVERY = timedelta(days=1)
    settings.AUDIT_CHECKPOINT_EXPORT = ""  # no trusted start: no incremental run
    assert audit_verify_due() == {FULL: "started"}
    # Running: not started again, and the step returned at once.
    assert audit_verify_due() == {FULL: "running"}
    verification_runs._children[FULL].wait(5)
    # Ended without a record (as a usage error would): not retried within the hour.
    assert audit_verify_due() == {}
    assert children == [FULL]

    make_job()
    call_command("verify_audit_chain", "--record", stdout=StringIO())
    verification_runs._started.clear()
    assert audit_verify_due() == {}  # the recorded run is a day old at most


@pytest.mark.django_db
def test_zero_disables_a_mode(settings, children, tmp_path):
    settings.AUDIT_VERIFY_FULL_EVERY = timedelta(0)
    settings.AUDIT_VERIFY_INCREMENTAL_EVERY = timedelta(days=1)
    settings.AUDIT_CHECKPOINT_EXPORT = str(tmp_path / "checkpoints.jsonl")
    assert audit_verify_due() == {INCREMENTAL: "started"}
    assert children == [INCREMENTAL]


@pytest.mark.django_db
def test_the_gauge_holds_the_newest_successful_run_per_mode():
    make_job()
    values = metrics_refresh_gauges()
    assert values[f"audit_verified_{FULL}"] == 0.0
    call_command("verify_audit_chain", "--record", stdout=StringIO())
    values = metrics_refresh_gauges()
    assert values[f"audit_verified_{FULL}"] > 0
    assert values[f"audit_verified_{INCREMENTAL}"] == 0.0
