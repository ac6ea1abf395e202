"""Audit enrichment (docs/architecture.md#annotations): an `annotate` job appends an
`annotated` entry to its own chain naming another job's entry (seq and hash), never
touching that job; creation checks the target (404 unseen, 422 purged or no such
entry, 422 out of bounds); the target's page lists its annotations."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from celery.exceptions import Reject
from django.db import connection, transaction
from django.urls import reverse

from audit.models import AuditLog
from audit.services import job_chain
from audit.verification import audit_verify
from jobs.domain.exceptions import JobLost
from jobs.domain.params import ANNOTATION_LABEL_MAX, ANNOTATION_NOTE_MAX
from jobs.models import DeadLetter, Job
from jobs.processes.runtime import job_execute
from jobs.selectors import job_timeline, job_visible_queryset
from jobs.selectors.annotations import ANNOTATED_TARGET, job_annotations
from jobs.services import Fence, job_claim, job_create
from jobs.services.annotations import job_annotate
from jobs.services.purge import purge_run
from tenants.models import Membership, Role
from tests.audit.test_command import verify
from tests.factories import (
    OrganisationFactory,
    UserFactory,
    backdate,
    client_for,
    fence_of,
    job_in_state,
)

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs"
HOST = "annotations-host"


def annotate(client: Any, target: Job, seq: int = 2, **fields: Any) -> Any:
    params = {"target_job_id": str(target.id), "target_seq": seq, "label": "reviewed", **fields}
    return client.post(JOBS, {"type": "annotate", "params": params}, format="json")


def run(job_id: Any) -> Job:
    """One delivery of the job's message in this process (what the Celery task runs)."""
    try:
        job_execute(payload={"job_id": str(job_id)}, hostname=HOST)
    except Reject as rejected:  # a dead letter: the broker copy goes to the DLQ
        assert rejected.requeue is False
    return Job.objects.get(id=job_id)


def row(job: Job) -> dict[str, Any]:
    """Every column of the job's row as stored."""
    return Job.objects.filter(id=job.id).values().get()


def annotated_entries(job_id: Any) -> list[AuditLog]:
    return list(AuditLog.objects.filter(chain=job_chain(job_id), event_type="annotated"))


def purged(job: Job) -> None:
    backdate(job, created_at=120, updated_at=120)
    removed, _ = purge_run(older_than=timedelta(minutes=1))
    assert sum(removed["jobs"].values()) >= 1 and not Job.objects.filter(id=job.id).exists()


def error(response: Any) -> dict[str, Any]:
    return response.json()["error"]


# --- creation through the API, then a run -------------------------------------------------


def test_an_annotation_names_the_targets_entry_in_its_own_chain_and_changes_nothing(user, api):
    target = job_in_state("succeeded", owner=user)
    before = row(target)
    entry = AuditLog.objects.get(chain=job_chain(target.id), seq=2)  # its `queued`
    note = "Checked against the order: é ✓\nno change needed"

    response = annotate(api, target, seq=2, note=note)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["type"], body["category"], body["queue"]) == (
        "annotate",
        "audit_enrichment",
        "default",
    )
    done = run(body["id"])

    assert done.status == "succeeded", done.last_error_message
    [written] = annotated_entries(done.id)
    assert written.job_id == done.id and written.actor_type == "system"
    data = json.loads(written.payload)["data"]
    assert (data["target_job_id"], data["target_seq"], data["target_hash"]) == (
        str(target.id),
        entry.seq,
        entry.chain_hash,
    )
    assert (data["label"], data["note"]) == ("reviewed", note)
    assert done.result["target_hash"] == entry.chain_hash
    assert done.result["annotated_seq"] == written.seq
    # The target: its row and its chain exactly as before (nothing appended to it).
    assert row(target) == before
    assert AuditLog.objects.filter(chain=job_chain(target.id)).count() == target.audit_seq
    report = audit_verify(job_ids=[done.id, target.id])
    assert report.ok, report.problems
    assert verify()[0] == 0  # manage.py verify_audit_chain over the whole log


def test_the_append_is_fenced_and_happens_once_per_job(user):
    target = job_in_state("succeeded", owner=user)
    job, _ = job_create(
        owner=user,
        job_type="annotate",
        params={"target_job_id": str(target.id), "target_seq": 1, "label": "x"},
    )
    claimed = job_claim(job_id=job.id, locked_by="w1")
    entry = AuditLog.objects.get(chain=job_chain(target.id), seq=1)
    stale = Fence(claimed.locked_by, claimed.attempts + 1)  # as if reclaimed meanwhile
    with pytest.raises(JobLost), transaction.atomic():
        job_annotate(job_id=job.id, fence=stale, target=entry, label="x", note="")
    assert annotated_entries(job.id) == []

    first = job_annotate(job_id=job.id, fence=fence_of(claimed), target=entry, label="x", note="")
    again = job_annotate(job_id=job.id, fence=fence_of(claimed), target=entry, label="x", note="")
    assert again.pk == first.pk and len(annotated_entries(job.id)) == 1
    assert Job.objects.get(id=job.id).audit_seq == first.seq  # the head moved with it
    assert audit_verify(job_ids=[job.id]).ok


# --- what creation refuses ------------------------------------------------------------------


def test_another_organisations_job_is_404_and_nothing_is_created(api):
    theirs = job_in_state("succeeded", owner=UserFactory(org=OrganisationFactory()))
    response = annotate(api, theirs)
    assert response.status_code == 404
    assert error(response)["code"] == "ERR-JOB-404"
    assert "target_job_id" in error(response)["details"]
    assert not Job.objects.filter(type="annotate").exists()


def test_a_job_of_the_same_organisation_its_owner_may_not_see_is_404():
    org = OrganisationFactory()
    member, other = UserFactory(org=org), UserFactory(org=org)
    theirs = job_in_state("succeeded", owner=other)
    assert annotate(client_for(member), theirs).status_code == 404
    # An admin of the organisation sees every job of it: may annotate it.
    Membership.objects.filter(user=member).update(role=Role.ADMIN)
    assert annotate(client_for(member), theirs).status_code == 201


def test_a_purged_target_is_422_and_another_orgs_purged_job_stays_404(user, api):
    mine = job_in_state("succeeded", owner=user)
    theirs = job_in_state("succeeded", owner=UserFactory(org=OrganisationFactory()))
    purged(mine)
    purged(theirs)
    response = annotate(api, mine)
    assert response.status_code == 422
    assert error(response)["code"] == "ERR-JOB-422"
    assert "purged" in error(response)["details"]["target_job_id"][0]
    assert annotate(api, theirs).status_code == 404  # no probing of other tenants' ids


def test_an_entry_past_the_targets_chain_head_is_422(user, api):
    target = job_in_state("succeeded", owner=user)
    response = annotate(api, target, seq=target.audit_seq + 1)
    assert response.status_code == 422
    assert "target_seq" in error(response)["details"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"label": "x" * (ANNOTATION_LABEL_MAX + 1)}, "label"),
        ({"label": "   "}, "label"),
        ({"label": "two\nlines"}, "label"),
        ({"note": "n" * (ANNOTATION_NOTE_MAX + 1)}, "note"),
        ({"note": "a\x07bell"}, "note"),
        ({"note": 12}, "note"),
        ({"seq": 0}, "target_seq"),
        ({"target_job_id": "not-a-uuid"}, "target_job_id"),
        ({"extra": "x"}, "extra"),
    ],
)
def test_out_of_bounds_annotations_are_422_naming_the_field(user, api, fields, field):
    target = job_in_state("succeeded", owner=user)
    response = annotate(api, target, **fields)
    assert response.status_code == 422, response.content
    assert error(response)["code"] == "ERR-JOB-422"
    assert field in error(response)["details"]
    assert not Job.objects.filter(type="annotate").exists()


def test_the_longest_label_and_note_are_accepted(user, api):
    target = job_in_state("succeeded", owner=user)
    label, note = "l" * ANNOTATION_LABEL_MAX, "é" * ANNOTATION_NOTE_MAX
    assert annotate(api, target, label=label, note=note).status_code == 201


# --- the handler's own check ------------------------------------------------------------------


def test_a_target_purged_before_the_run_fails_the_job_for_good(user, api):
    target = job_in_state("succeeded", owner=user)
    job_id = annotate(api, target).json()["id"]
    purged(target)
    done = run(job_id)
    assert done.status == "failed" and done.attempts == 1
    assert done.last_error_code == "ANNOTATION_TARGET_PURGED"
    assert DeadLetter.objects.get(job_id=job_id).reason == "nonretryable"
    assert annotated_entries(job_id) == []


# --- the target's timeline ---------------------------------------------------------------------


def test_the_targets_timeline_lists_its_annotations_visible_to_the_viewer(user, api):
    target = job_in_state("succeeded", owner=user)
    first = run(annotate(api, target, seq=1, label="first look").json()["id"])
    second = run(annotate(api, target, seq=3, label="second", note="why").json()["id"])
    stored = Job.objects.get(id=target.id)

    timeline = job_timeline(job=stored, visible=job_visible_queryset(user=user))
    shown = {e["seq"]: [a["annotation"] for a in e["annotations"]] for e in timeline}
    assert [(a.label, a.job_id) for a in shown[1]] == [("first look", first.id)]
    assert [(a.label, a.note, a.job_id) for a in shown[3]] == [("second", "why", second.id)]
    assert all(a["hash_matches"] for e in timeline for a in e["annotations"])
    # Another member of the organisation sees neither annotating job: no annotation.
    stranger = UserFactory()
    assert job_annotations(job=stored, visible=job_visible_queryset(user=stranger)) == []
    # Without `visible`, the timeline is the chain alone.
    assert all(e["annotations"] == [] for e in job_timeline(job=stored))
    # The annotating job's own timeline links the job it annotates.
    [own] = [e for e in job_timeline(job=second) if e["event"] == "annotated"]
    assert own["link"] == {"id": target.id, "label": "annotates"}
    assert "entry #3: second" in own["summary"]


def test_the_job_page_shows_an_annotation_with_a_link_to_its_job(user, api, otp_admin_client):
    target = job_in_state("succeeded", owner=user)
    note = run(annotate(api, target, seq=2, label="audited <ok>").json()["id"])
    page = otp_admin_client.get(reverse("admin:jobs_job_change", args=[target.id]))
    text = page.content.decode()
    timeline = text[text.index('id="timeline"') :]
    assert "audited &lt;ok&gt;" in timeline  # escaped, as every text a client chose
    assert reverse("admin:jobs_job_change", args=[note.id]) in timeline
    assert "the hash it recorded is not this entry" not in timeline


def test_the_lookup_by_target_uses_its_partial_index(user):
    query = (
        AuditLog.objects.alias(target=ANNOTATED_TARGET)
        .filter(event_type="annotated", target=str(user.pk))
        .only("id")
    )
    sql, params = query.query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(r[0] for r in cursor.fetchall())
        # audit_logs is partitioned: the index is a partitioned index, and each
        # partition scans its own child of it.
        cursor.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits "
            "WHERE inhparent = 'audit_annotated_target_idx'::regclass"
        )
        children = {r[0] for r in cursor.fetchall()}
    used = set(re.findall(r"Index Scan using (\S+) on", plan))
    assert used and used <= children, plan
    assert "Seq Scan" not in plan, plan


def test_a_batch_answers_an_unseen_target_in_its_own_item(user, api):
    mine = job_in_state("succeeded", owner=user)
    theirs = job_in_state("succeeded", owner=UserFactory(org=OrganisationFactory()))
    items = [
        {
            "type": "annotate",
            "params": {"target_job_id": str(job.id), "target_seq": 1, "label": "batch"},
        }
        for job in (mine, theirs)
    ]
    response = api.post(f"{JOBS}/batch", {"jobs": items}, format="json")
    assert response.status_code in (200, 201, 207), response.content
    results = response.json()["results"]
    assert results[0]["status"] == "created"
    assert (results[1]["status"], results[1]["error"]["code"]) == ("error", "ERR-JOB-404")
