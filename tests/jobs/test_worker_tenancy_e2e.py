"""Tenancy with a real worker and dispatcher (docs/tenancy.md#execution, #suspension):
a suspended organisation's job is not published, a message that reaches a worker
anyway is held without spending an attempt, `resume` runs it; a forged message's
org_id fails the job with TENANT_MISMATCH."""

from __future__ import annotations

import pytest
from django.utils import timezone

from audit.verification import audit_verify
from jobs.integrations.publisher import messages_publish
from jobs.models import DeadLetter, Job
from jobs.services import job_publish
from tenants.models import Organisation
from tests.factories import OrganisationFactory, UserFactory, make_job
from tests.polling import wait_for
from tests.processes import celery_worker, dispatcher_process, job_events, job_finished
from tests.queues import topology_declare_and_purge

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]

SIM = {"steps": 2, "step_seconds": 0}


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker):
    """One worker on `sim` for both tests: neither needs it fresh (a suspension and a
    message's org_id are read at each claim)."""
    with django_db_blocker.unblock():
        topology_declare_and_purge()
        with celery_worker(queues=["sim"], name="tenancy-e2e") as worker:
            yield worker


def test_a_suspended_organisations_job_waits_is_held_and_runs_after_resume(worker):
    acme = OrganisationFactory(slug="acme")
    # Made just before the suspension (a suspended organisation takes no new job), while
    # no dispatcher runs to publish it.
    job = make_job(owner=UserFactory(org=acme), params=SIM)
    Organisation.objects.filter(id=acme.id).update(suspended_at=timezone.now())
    with dispatcher_process(interval=0.2, name="tenancy-e2e-dispatcher") as dispatcher:
        # Several passes of its publish step, all begun after the job was made.
        dispatcher.wait_for_runs("publish", 2)
        assert Job.objects.get(id=job.id).status == "pending"
        # Never published (a worker would hold a published one: pending again).
        assert job_events(job.id) == ["created"]
        # An operator's publish (or a message already in the queue at `suspend`) reaches
        # the worker anyway: it holds the job, no attempt spent, and acks the message.
        assert job_publish(job_id=job.id)
        wait_for(lambda: "held" in job_events(job.id), timeout=30, what="the hold")
        held = Job.objects.get(id=job.id)
        assert (held.status, held.attempts) == ("pending", 0), worker.log_text()[-3000:]
        trail = job_events(job.id)
        # Still held: two more publish runs (one begun after the hold) left it alone.
        runs = dispatcher.metric("dispatcher_step_runs_total", step="publish")
        dispatcher.wait_for_runs("publish", runs + 2)
        assert Job.objects.get(id=job.id).status == "pending"
        assert job_events(job.id) == trail
        Organisation.objects.filter(id=acme.id).update(suspended_at=None)
        done = job_finished(job.id, timeout=30)
    assert (done.status, done.attempts) == ("succeeded", 1), worker.log_text()[-3000:]
    trail = job_events(job.id)
    after = trail[trail.index("held") - 1 :]
    assert after[:4] == ["queued", "held", "queued", "started"] and after[-1] == "succeeded"
    assert trail.count("started") == 1  # one run, after resume
    assert audit_verify(job_ids=[job.id]).ok


def test_a_forged_org_id_on_the_message_fails_the_job_with_tenant_mismatch(worker):
    acme, globex = OrganisationFactory(slug="acme"), OrganisationFactory(slug="globex")
    job = make_job(owner=UserFactory(org=acme), params=SIM)  # pending: no dispatcher
    forged = Job.objects.get(id=job.id)
    forged.org_id = globex.id  # in memory only: the message lies, the row does not
    assert messages_publish(jobs=[forged]) == {}
    done = job_finished(job.id, timeout=30)
    assert done.status == "failed", worker.log_text()[-3000:]
    assert (done.last_error_code, done.attempts, done.org_id) == ("TENANT_MISMATCH", 0, acme.id)
    letter = DeadLetter.objects.get(job_id=job.id, state="open")
    assert (letter.reason, letter.error_code) == ("nonretryable", "TENANT_MISMATCH")
    assert "started" not in job_events(job.id)  # the handler never ran
