"""One representation of a job (jobs/representation.py): the body's fields and the
event's, pinned here once, and every place that shows a job held to them."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from jobs.api.serializers import JobOutputSerializer
from jobs.models import EventOutbox
from jobs.representation import EVENT_FIELDS, JOB_FIELDS, job_representation
from tests.factories import job_in_state

pytestmark = pytest.mark.django_db

# Written out here, apart from the code: a field added, dropped or moved fails this.
BODY = tuple(
    "id type category queue org_id project_id status progress attempts max_attempts "
    "priority cancel_requested dead_letter_queue idempotency_key request_id correlation_id "
    "run_at created_at updated_at artefacts "
    "last_error result rerun_of".split()
)
EVENT = tuple(
    "event_id type job_id job_type seq status previous_status progress attempt "
    "timestamp request_id correlation_id org_id project_id".split()
)


def test_the_job_body_and_the_event_have_these_fields_in_this_order():
    assert JOB_FIELDS == BODY
    assert tuple(JobOutputSerializer().fields) == BODY
    assert EVENT_FIELDS == EVENT


def test_the_api_the_command_and_the_outbox_show_exactly_those_fields():
    job = job_in_state("succeeded")
    assert tuple(job_representation(job)) == BODY
    out = StringIO()
    call_command("job_status", str(job.id), "--json", stdout=out)
    assert tuple(json.loads(out.getvalue())) == BODY
    # Every event of its life, from creation (job_insert) to the end (job_append).
    events = EventOutbox.objects.filter(job_id=job.id).order_by("seq")
    assert [e.payload["status"] for e in events] == ["pending", "queued", "running", "succeeded"]
    for event in events:
        assert set(event.payload) == set(EVENT)
        assert event.payload["job_id"] == str(job.id)
