"""One representation of a job (jobs/selectors/representation.py): the body's fields and the
event's, pinned here once, and every place that shows a job held to them."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobs.api.serializers import ArtefactOutputSerializer, JobOutputSerializer
from jobs.models import EventOutbox, Job
from jobs.selectors import job_get_for_user
from jobs.selectors.representation import (
    ARTEFACT_FIELDS,
    EVENT_FIELDS,
    JOB_FIELDS,
    job_representation,
)
from jobs.services import artefact_save, job_key_repeat
from tests.factories import job_in_state

pytestmark = pytest.mark.django_db

# Written out here, apart from the code: a field added, dropped or moved fails this.
BODY = tuple(
    "id type category queue org_id project_id status progress attempts max_attempts "
    "priority cancel_requested dead_letter_queue idempotency_key request_id correlation_id "
    "run_at created_at updated_at artefacts "
    "last_error result rerun_of".split()
)
ARTEFACT = tuple("id kind name content_type s3_key sha256 size url".split())
EVENT = tuple(
    "event_id type job_id job_type seq status previous_status progress attempt "
    "timestamp request_id correlation_id org_id project_id".split()
)


def test_the_job_body_and_the_event_have_these_fields_in_this_order():
    assert JOB_FIELDS == BODY
    assert tuple(JobOutputSerializer().fields) == BODY
    assert EVENT_FIELDS == EVENT


def test_an_artefact_has_these_fields_in_this_order():
    assert ARTEFACT_FIELDS == ARTEFACT
    assert tuple(ArtefactOutputSerializer().fields) == ARTEFACT


def test_every_read_of_a_job_lists_its_artefacts_alike():
    """The API's read (job_read), a repeated create (job_repeat_by_key: both through
    jobs_artefacts_json) and the ORM relation (the list, the command) give the same
    artefact bodies."""
    job = job_in_state("succeeded", key="artefact-key")
    artefact_save(job_id=job.id, kind="report", name="z.csv", data=b"z\n", content_type="text/csv")
    artefact_save(job_id=job.id, kind="log", name="a.txt", data=b"a")
    by_relation = job_representation(Job.objects.get(id=job.id))["artefacts"]
    by_read = job_representation(job_get_for_user(job_id=job.id, user=job.owner))["artefacts"]
    repeat = job_key_repeat(
        owner=job.owner,
        org_id=job.org_id,
        key="artefact-key",
        params_hash=job.params_hash,
        project_id=job.project_id,
        now=timezone.now(),
    )
    assert repeat is not None
    by_repeat = job_representation(repeat)["artefacts"]
    assert by_read == by_repeat
    # The relation is read in no set order (the list, the command): the same bodies.
    assert sorted(by_relation, key=lambda a: (a["kind"], a["name"])) == by_read
    assert [(a["kind"], a["name"]) for a in by_read] == [("log", "a.txt"), ("report", "z.csv")]
    assert [tuple(a) for a in by_read] == [ARTEFACT, ARTEFACT]
    assert by_read[1]["content_type"] == "text/csv" and by_read[1]["size"] == 2


def test_the_api_the_command_and_the_outbox_show_exactly_those_fields():
    job = job_in_state("succeeded")
    assert tuple(job_representation(job)) == BODY
    out = StringIO()
    call_command("job_status", str(job.id), "--json", stdout=out)
    assert tuple(json.loads(out.getvalue())) == BODY
    # Every event of its life, from creation (job_insert) to the end (the transition functions).
    events = EventOutbox.objects.filter(job_id=job.id).order_by("seq")
    assert [e.payload["status"] for e in events] == ["pending", "queued", "running", "succeeded"]
    for event in events:
        assert set(event.payload) == set(EVENT)
        assert event.payload["job_id"] == str(job.id)
