"""Issue 9, end to end: a job fails fatally -> it is in its DLQ, on the dashboard and in the
grouped list -> its cause is fixed (configuration) -> an operator replays it from the
portal with a justification -> it succeeds, and its chain verifies with `dlq_replayed`.

Real worker and dispatcher processes, RabbitMQ, PostgreSQL and Redis; the portal through
Django's test client as an OTP-verified operator.
"""

from __future__ import annotations

import pytest
from django.test import Client

from audit.verification import audit_verify
from jobs.models import DeadLetter, Job
from tests.erp_receiver import Receiver
from tests.factories import make_job, otp_login, role_user
from tests.polling import wait_for
from tests.processes import celery_worker, dispatcher_process, job_events, together

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("broker")]


def test_a_fatal_failure_fixed_and_replayed_from_the_portal_succeeds_and_verifies():
    portal = otp_login(Client(), role_user("operator"))
    with together(
        dispatcher_process(interval=0.2, name="portal-e2e-dispatcher"),
        celery_worker(queues=["erp"], env={"JOBOPS_ERP_WEBHOOK_URL": ""}, name="no-erp"),
    ) as (dispatcher, no_erp):
        # 1. No ERP webhook is configured: the erp handler fails fatally, at once.
        job = make_job(job_type="erp", params={"event": "order.created", "data": {"n": 1}})
        row = wait_for(
            lambda: DeadLetter.objects.filter(job_id=job.id, broker_copy=True).first(),
            timeout=30,
        )
        no_erp.terminate()  # it shuts down while the operator looks
        assert (row.reason, row.error_code) == ("fatal", "ERP_NOT_CONFIGURED")
        assert Job.objects.get(id=job.id).status == "failed"

        # 2. The operator sees it: DLQ peek, dashboard, the list grouped by cause.
        peek = portal.get("/admin/jobs/deadletter/peek/erp_dlq/")
        assert [item["m"].job_id for item in peek.context["messages_found"]] == [str(job.id)]
        overview = portal.get("/admin/").context["overview"]
        erp = next(q for q in overview["queues"] if q["queue"] == "erp")
        assert erp["open_dead_letters"] == 1 and erp["dlq_depth"] == 1
        assert [(f["count"], f["error_code"]) for f in overview["failures"]] == [
            (1, "ERP_NOT_CONFIGURED")
        ]
        listed = portal.get("/admin/jobs/deadletter/", {"state": "open"}).context["groups"]
        assert [(g["count"], g["error_code"], g["queue"]) for g in listed] == [
            (1, "ERP_NOT_CONFIGURED", "erp_dlq")
        ]

        # 3. The cause is fixed: the ERP webhook is configured; workers restart with it.
        with (
            Receiver() as erp_server,
            celery_worker(
                queues=["erp"], env={"JOBOPS_ERP_WEBHOOK_URL": erp_server.url}, name="with-erp"
            ) as worker,
        ):
            no_erp.stop()  # gone before the replay: only the fixed worker can take the job
            # 4. Dry run, then the replay with a justification.
            url = "/admin/jobs/deadletter/replay/run/"
            dry = portal.get(url, {"queue": "erp_dlq", "error_code": "ERP_NOT_CONFIGURED"})
            assert dry.context["dry_run"].matched == 1
            done = portal.post(
                url,
                {
                    **dict(dry.context["hidden"]),
                    "justification": "INC-77: JOBOPS_ERP_WEBHOOK_URL set on the workers",
                },
            )
            assert done.context["result"].job_ids == [str(job.id)]

            # 5. It runs again and succeeds.
            final = wait_for(
                lambda: (j := Job.objects.get(id=job.id)).status in ("succeeded", "failed") and j,
                timeout=40,
            )
            assert final.status == "succeeded", worker.log_text()[-3000:]
            worker.terminate()  # both shut down side by side
            dispatcher.terminate()
        assert erp_server.requests[0]["headers"]["Idempotency-Key"] == str(job.id)

    # 6. Its chain verifies, with the replay in it; the portal's verify page agrees.
    trail = job_events(job.id)
    assert "dlq_replayed" in trail and trail[-1] == "succeeded"
    assert trail.index("failed") < trail.index("dlq_replayed") < trail.index("succeeded")
    assert audit_verify(job_ids=[job.id]).ok
    verified = portal.get("/admin/audit/auditlog/verify/", {"job": str(job.id), "run": "1"})
    assert verified.context["report"].ok and b"Intact." in verified.content
    page = portal.get(f"/admin/jobs/job/{job.id}/change/").content.decode()
    assert "INC-77: JOBOPS_ERP_WEBHOOK_URL set on the workers" in page  # in the timeline
    assert DeadLetter.objects.get(id=row.id).state == "replayed"
