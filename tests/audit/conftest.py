"""Fixtures of the audit tests."""

from __future__ import annotations

import pytest

from jobs.models import Job
from tests.factories import job_in_state


@pytest.fixture
def history() -> Job:
    """A job with a real four-event chain: created, queued, started, succeeded."""
    return job_in_state("succeeded")
