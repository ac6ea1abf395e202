"""An ERP outage seen by the `erp` connector's breaker, with a real Celery worker and
dispatcher (docs/connectors.md): issue 30's "done when".

The ERP stand-in answers 503: `erp` jobs fail five times in all, the breaker opens;
jobs created after that wait `retrying` until its probe time without spending an
attempt and none reaches a dead letter. The ERP answers 200 again: once the cool-down
has passed one job probes and closes the breaker, and every waiting job succeeds
exactly once, counted at the ERP. The cool-down is long (nothing ends the hold before
the test has looked at it, however busy the machine); the test then moves the clock of
the breaker and of the waiting jobs past it (`cooldown_passes`) instead of waiting.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction

from audit.models import AuditLog
from audit.services import OPS_CHAIN
from audit.verification import audit_verify
from jobs.models import ConnectorBreaker, DeadLetter, Job
from tests.erp_receiver import Receiver
from tests.factories import UserFactory, make_job
from tests.polling import wait_for
from tests.processes import celery_worker, dispatcher_process, job_events, job_finished

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]

# A cool-down no busy machine outlasts while the test looks at the held jobs (the test
# then moves time past it); a short jitter and probe-wait once it has passed.
COOLDOWN = 600
BREAKER = {
    "failures": 5,
    "cooldown_seconds": COOLDOWN,
    "probe_wait_seconds": 0.5,
    "jitter_seconds": 1,
}
# How long a process keeps its copy of the breakers (JOBOPS_CONNECTOR_CACHE_SECONDS).
CACHE_SECONDS = 0.2


def erp_jobs(owner, n: int) -> list[Job]:
    return [make_job(owner=owner, job_type="erp", params={"event": f"e{i}"}) for i in range(n)]


def breaker_state() -> str | None:
    return ConnectorBreaker.objects.filter(name="erp").values_list("state", flat=True).first()


def cooldown_passes() -> None:
    """As if the cool-down had passed: the breaker's probe time and the `next_run_at` of
    each job waiting for it (its probe time plus jitter) moved back by the same span,
    to the database's now() (the clock the services compare against), behind the
    services' back as tests.factories.backdate does."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT probe_at - now() FROM connector_breakers"
            " WHERE name = 'erp' AND state = 'open' FOR UPDATE"
        )
        (span,) = cursor.fetchone()
        assert span > timedelta(seconds=COOLDOWN / 2), span  # nothing ended the hold yet
        cursor.execute(
            "UPDATE jobs SET next_run_at = next_run_at - %s WHERE type = 'erp'"
            " AND status = 'retrying'",
            [span],
        )
        cursor.execute(
            "UPDATE connector_breakers SET probe_at = probe_at - %s WHERE name = 'erp'", [span]
        )


def test_an_erp_outage_opens_the_breaker_holds_later_jobs_and_each_runs_once_after_it(settings):
    settings.JOBOPS_CONNECTORS = {"erp": BREAKER}
    owner = UserFactory()
    with Receiver() as erp:
        erp.status = 503
        env = {
            "JOBOPS_ERP_WEBHOOK_URL": erp.url,
            "JOBOPS_CONNECTORS": json.dumps({"erp": BREAKER}),
            "JOBOPS_CONNECTOR_CACHE_SECONDS": str(CACHE_SECONDS),
        }
        with (
            celery_worker(queues=["erp"], name="breaker-e2e", concurrency=2, env=env) as worker,
            dispatcher_process(interval=0.2, name="breaker-e2e-dispatcher", env=env),
        ):
            first = erp_jobs(owner, 5)
            wait_for(lambda: breaker_state() == "open", timeout=30, what="the breaker to open")
            opened = ConnectorBreaker.objects.get(name="erp")
            assert opened.failures >= 5 and opened.last_error_code == "ERP_503"
            # Each worker process sees a breaker opened elsewhere within
            # JOBOPS_CONNECTOR_CACHE_SECONDS (its copy's age, by its own monotonic clock);
            # a job it started before then meets the outage and is deferred by its
            # failure, its attempt spent (it did run).
            time.sleep(CACHE_SECONDS + 0.1)
            later = erp_jobs(owner, 5)
            # Claimed, found the breaker open, deferred: no attempt spent, no ERP call.
            for job in later:
                wait_for(lambda j=job: "deferred" in job_events(j.id), timeout=30, what="deferral")
            held = Job.objects.filter(id__in=[j.id for j in later])
            assert breaker_state() == "open"  # no probe yet: the statuses below are the hold's
            assert {(j.status, j.attempts) for j in held} == {("retrying", 0)}, worker.log_text()[
                -3000:
            ]
            # Each waits for the probe time (plus jitter), not for a backoff of its own.
            probe_at = ConnectorBreaker.objects.get(name="erp").probe_at
            assert probe_at is not None and all(j.next_run_at >= probe_at for j in held)
            called = {r["body"]["job_id"] for r in erp.requests}
            assert called.isdisjoint({str(j.id) for j in later})
            assert not DeadLetter.objects.exists()
            erp.status = 200
            cooldown_passes()
            done = [job_finished(j.id, timeout=60) for j in first + later]
    assert [j.status for j in done] == ["succeeded"] * 10, worker.log_text()[-3000:]
    # Each job succeeded exactly once at the ERP (one 200 per job, however many 503s).
    successes = Counter(r["body"]["job_id"] for r in erp.requests if r["status"] == 200)
    assert successes == Counter({str(j.id): 1 for j in done})
    assert {j.attempts for j in done if j.id in {x.id for x in later}} == {1}
    assert not DeadLetter.objects.exists()
    assert breaker_state() == "closed"
    events = list(
        AuditLog.objects.filter(chain=OPS_CHAIN, event_type__startswith="connector_")
        .order_by("seq")
        .values_list("event_type", flat=True)
    )
    assert events[0] == "connector_opened" and events[-1] == "connector_closed", events
    assert "connector_half_open" in events
    assert audit_verify(job_ids=[j.id for j in done]).ok
