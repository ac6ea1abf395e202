"""Retention and purge (docs/operations/retention.md): ended jobs go with their files,
rows and events; unfinished jobs, open dead letters and live keys stay; the audit chains
stay whole, each closed by `purged`, and verify_audit_chain passes before and after."""

from __future__ import annotations

import io
import json
import os
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone
from prometheus_client import REGISTRY

from audit.models import AuditLog
from audit.services import Actor, job_chain
from config.dashboard import dashboard_overview
from dlq.models import BulkOperation, BulkState
from dlq.services.fix_forward import fix_forward_reject, fix_forward_request
from dlq.services.replay import dead_letters_discard, dead_letters_replay
from jobs.artefact_storage import artefact_storage
from jobs.models import Artefact, DeadLetter, EventOutbox, Job, ParamsEdit
from jobs.processes.dispatcher import dispatch_once
from jobs.services import (
    artefact_save,
    job_cancel,
    job_claim,
    job_rerun,
    job_retry_failed,
    job_succeed,
)
from jobs.services.purge import (
    artefact_orphans_sweep,
    purge_forget_clock,
    purge_preview,
    purge_run,
)
from tests.audit.test_command import verify
from tests.factories import (
    OperatorFactory,
    backdate,
    fence_of,
    job_failed,
    job_in_state,
)

pytestmark = pytest.mark.django_db
MINUTE = timedelta(minutes=1)


@pytest.fixture
def files(settings, tmp_path):
    """Artefacts on the file system under a folder of this test's own."""
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


def ended_long_ago(job: Job, seconds: float = 120) -> Job:
    """As if `job` had been created and had ended `seconds` ago."""
    backdate(job, created_at=seconds, updated_at=seconds)
    return job


def finished_with_file(name: str = "out.csv") -> tuple[Job, Artefact]:
    """A job that wrote an artefact, then succeeded."""
    from jobs.services import job_succeed

    running = job_in_state("running")
    artefact = artefact_save(
        job_id=running.id, kind="report", name=name, data="a,b\n", fence=fence_of(running)
    )
    return job_succeed(job_id=running.id, fence=fence_of(running), result={}), artefact


def closed(job: Job) -> Job:
    """The job's dead letter discarded, as an operator does (the row as the discard
    leaves it; the broker side is not part of this test)."""
    DeadLetter.objects.filter(job=job).update(
        state="discarded", resolved_at=timezone.now(), justification="handled"
    )
    return job


def purged_count(category: str) -> float:
    return REGISTRY.get_sample_value("jobs_purged_total", {"category": category}) or 0.0


def test_every_ended_kind_goes_with_its_file_and_the_rest_stays(
    files, django_capture_on_commit_callbacks
):
    succeeded, artefact = finished_with_file()
    path = artefact_storage.path(artefact.file.name)
    cancelled = job_in_state("cancelled")
    failed_closed = closed(job_in_state("failed"))
    gone = [ended_long_ago(j) for j in (succeeded, cancelled, failed_closed)]
    failed_open = ended_long_ago(job_in_state("failed"))
    live_key = ended_long_ago(job_in_state("succeeded", key="order-1"))
    backdate(live_key, idempotency_expires_at=-3600)
    recent = job_in_state("succeeded")  # ended now: within the minute
    unfinished = [
        ended_long_ago(job_in_state(s)) for s in ("pending", "queued", "running", "retrying")
    ]
    assert os.path.exists(path) and verify()[0] == 0
    before = purged_count("planning")

    with django_capture_on_commit_callbacks(execute=True):
        removed, more = purge_run(older_than=MINUTE)

    assert not more
    assert removed == {
        "jobs": {"planning": 3},
        "artefacts": 1,
        "dead_letters": 1,
        "outbox": 0,
        "params_edits": 0,
    }
    assert purged_count("planning") == before + 3
    assert not Job.objects.filter(id__in=[j.id for j in gone]).exists()
    assert not Artefact.objects.filter(id=artefact.id).exists() and not os.path.exists(path)
    # Neither the job's folder: the disk does not fill with empty ones.
    assert not os.path.exists(os.path.dirname(os.path.dirname(path)))
    stays = [failed_open, live_key, recent, *unfinished]
    assert Job.objects.filter(id__in=[j.id for j in stays]).count() == len(stays)
    assert DeadLetter.objects.filter(job=failed_open, state="open").exists()
    # The chains stay, each closed by `purged`; the whole audit log verifies.
    for job in gone:
        last = AuditLog.objects.filter(chain=job_chain(job.id)).order_by("-seq").first()
        assert last.event_type == "purged"
        assert json.loads(last.payload)["data"]["category"] == "planning"
    assert verify()[0] == 0


def test_an_object_in_s3_goes_after_its_row_commits(s3, django_capture_on_commit_callbacks):
    job, artefact = finished_with_file("s3.csv")
    kept, kept_artefact = finished_with_file("kept.csv")  # ended now: within the minute
    ended_long_ago(job)
    assert artefact.file.name in s3.keys()
    with django_capture_on_commit_callbacks(execute=False) as after_commit:
        removed, _ = purge_run(older_than=MINUTE)
        # The row is gone in the transaction; the object waits for its commit.
        assert not Artefact.objects.filter(id=artefact.id).exists()
        assert artefact.file.name in s3.keys()
    assert removed["artefacts"] == 1
    for callback in after_commit:
        callback()
    assert artefact.file.name not in s3.keys()
    assert s3.object_bytes(kept_artefact.file.name) == b"a,b\n"
    assert Job.objects.filter(id=kept.id).exists()


def test_a_category_keeps_its_jobs_for_its_own_retention():
    # sim is planning (90 days), erp notification (7 days): both ended 8 days ago.
    eight_days = 8 * 86400
    planning = ended_long_ago(job_in_state("cancelled"), eight_days)
    notification = ended_long_ago(
        job_in_state("cancelled", job_type="erp", params={"event": "order.created"}), eight_days
    )
    removed, _ = purge_run()
    assert removed["jobs"] == {"notification": 1}
    assert Job.objects.filter(id=planning.id).exists()
    assert not Job.objects.filter(id=notification.id).exists()


def test_published_events_go_with_their_job_and_unpublished_ones_stay():
    job = ended_long_ago(job_in_state("succeeded"))
    EventOutbox.objects.filter(job_id=job.id, seq__lte=2).update(published_at=timezone.now())
    waiting = EventOutbox.objects.filter(job_id=job.id, seq__gt=2).count()
    removed, _ = purge_run(older_than=MINUTE)
    assert removed["outbox"] == 2
    assert EventOutbox.objects.filter(job_id=job.id).count() == waiting


def test_a_job_row_deleted_by_hand_is_reported_by_name():
    purged = ended_long_ago(job_in_state("succeeded"))
    deleted = job_in_state("succeeded")
    purge_run(older_than=MINUTE)
    assert verify()[0] == 0
    with connection.cursor() as cursor:  # as a database superuser would, outside purge
        cursor.execute("DELETE FROM jobs WHERE id = %s", [deleted.id])

    status, out = verify()
    assert status == 1, out
    assert f"job {deleted.id}, seq 4: job_missing" in out
    assert str(purged.id) not in out
    # Asked about by name, the same.
    assert verify("--job", str(deleted.id))[0] == 1
    assert verify("--job", str(purged.id))[0] == 0


def test_dry_run_counts_per_category_and_removes_nothing():
    jobs = [ended_long_ago(job_in_state(s)) for s in ("succeeded", "cancelled")]
    done = BulkOperation.objects.create(
        action="discard",
        up_to_id=0,
        justification="x",
        requested_by=OperatorFactory(),
        state=BulkState.DONE,
        finished_at=timezone.now() - timedelta(days=31),
    )
    out = io.StringIO()
    call_command("purge", "--dry-run", "--older-than", "0s", stdout=out)
    assert "would remove 2 jobs\n  planning: 2\n" in out.getvalue()
    assert "would remove 1 bulk operations" in out.getvalue()
    out = io.StringIO()
    call_command("purge", "--dry-run", "--json", stdout=out)
    document = json.loads(out.getvalue())
    assert document["dry_run"] and document["jobs"] == {} and document["bulk_operations"] == 1
    assert Job.objects.filter(id__in=[j.id for j in jobs]).count() == 2

    out = io.StringIO()
    call_command("purge", "--older-than", "1m", "--json", stdout=out)
    assert json.loads(out.getvalue())["jobs"] == {"planning": 2}
    assert not BulkOperation.objects.filter(id=done.id).exists()


def test_the_dashboard_shows_the_last_purge():
    assert dashboard_overview(use_cache=False)["purge"] is None
    ended_long_ago(job_in_state("cancelled"))
    call_command("purge", "--older-than", "1m", stdout=io.StringIO())
    last = dashboard_overview(use_cache=False)["purge"]
    assert last["jobs"] == 1 and last["removed"]["jobs"] == {"planning": 1}
    assert last["started_at"] is not None and last["finished_at"] is not None


def test_the_dispatcher_step_purges(settings, files):
    settings.JOB_TYPES = {
        name: {**spec, "retention": MINUTE} for name, spec in settings.JOB_TYPES.items()
    }
    job = ended_long_ago(job_in_state("succeeded"))
    purge_forget_clock()
    report = dispatch_once(steps=[("purge", "jobs.services.purge.purge_once")])
    assert report["purge"]["jobs"] == {"planning": 1}, report
    assert not Job.objects.filter(id=job.id).exists()
    # Nothing due now: it looks again only after JOBOPS_PURGE_INTERVAL_SECONDS.
    assert dispatch_once(steps=[("purge", "jobs.services.purge.purge_once")])["purge"] == {}


def test_the_sweep_removes_old_files_no_row_names(files):
    job, artefact = finished_with_file()
    orphan = artefact_storage.save(f"artefacts/{job.id}/report/left.csv", io.BytesIO(b"x"))
    assert artefact_orphans_sweep() == 0  # within the grace period: maybe a write in flight
    assert artefact_orphans_sweep(grace=timedelta(0)) == 1
    assert not artefact_storage.exists(orphan)
    assert artefact_storage.exists(artefact.file.name)


# --- what names a purged row (issue 37, H1) ---------------------------------------------
# These commit for real (transaction=True): the foreign keys are DEFERRABLE INITIALLY
# DEFERRED, so a row purge forgot to handle fails the batch only at its commit.


def running(job: Job) -> Job:
    """`job` (pending or queued) claimed by a worker."""
    claimed = job_claim(job_id=job.id, locked_by="w-purge")
    assert claimed is not None
    return claimed


def run_to_success(job: Job) -> Job:
    claimed = running(job)
    return job_succeed(job_id=job.id, fence=fence_of(claimed), result={})


def created_data(job: Job) -> dict:
    entry = AuditLog.objects.get(chain=job_chain(job.id), seq=1)
    return json.loads(entry.payload)["data"]


@pytest.mark.django_db(transaction=True)
def test_a_rerun_original_goes_and_the_running_rerun_stays_without_the_link():
    original = job_in_state("cancelled")
    rerun = running(job_rerun(job_id=original.id, actor_user=OperatorFactory(), justification="x"))
    # Both ended: the original and its re-run go in the same batch.
    both = job_in_state("cancelled")
    both_rerun = job_rerun(job_id=both.id, actor_user=OperatorFactory(), justification="y")
    job_cancel(job_id=both_rerun.id, actor=Actor.system("test"))
    for job in (original, both, both_rerun):
        ended_long_ago(job)

    removed, more = purge_run(older_than=MINUTE)

    assert not more and removed["jobs"] == {"planning": 3}, removed
    assert not Job.objects.filter(id__in=[original.id, both.id, both_rerun.id]).exists()
    kept = Job.objects.get(id=rerun.id)
    assert kept.status == "running" and kept.rerun_of_id is None
    # Its body changed: a new ETag; not a new end (updated_at), which its retention counts from.
    assert kept.version == rerun.version + 1 and kept.updated_at == rerun.updated_at
    # The link stays where it is hashed: the re-run's `created` entry names the original.
    assert created_data(kept)["rerun_of"] == str(original.id)
    assert verify()[0] == 0


@pytest.mark.django_db(transaction=True)
def test_a_fixed_forward_job_goes_with_its_edit_and_dead_letter(settings):
    job = job_failed(code="BAD_INPUT")
    row = DeadLetter.objects.get(job=job)
    edit = fix_forward_request(
        dead_letter_id=row.id,
        actor_user=OperatorFactory(),
        params={"steps": 3, "step_seconds": 0},
        reason="typo",
    )
    assert edit.state == "applied"
    run_to_success(job)
    # A rejected edit's decision is in its chain too: that job goes as well.
    settings.JOBOPS_REPLAY_APPROVAL = True
    rejected_job = job_failed(code="BAD_INPUT")
    rejected_row = DeadLetter.objects.get(job=rejected_job)
    asked = fix_forward_request(
        dead_letter_id=rejected_row.id,
        actor_user=OperatorFactory(),
        params={"steps": 4, "step_seconds": 0},
        reason="maybe",
    )
    fix_forward_reject(edit_id=asked.id, actor_user=OperatorFactory())
    closed(rejected_job)
    for gone in (job, rejected_job):
        ended_long_ago(gone)
    assert purge_preview(older_than=MINUTE)["jobs"] == {"planning": 2}

    removed, _ = purge_run(older_than=MINUTE)

    assert removed["jobs"] == {"planning": 2} and removed["dead_letters"] == 2, removed
    assert not Job.objects.filter(id__in=[job.id, rejected_job.id]).exists()
    assert not ParamsEdit.objects.filter(id__in=[edit.id, asked.id]).exists()
    assert not DeadLetter.objects.filter(id__in=[row.id, rejected_row.id]).exists()
    assert verify()[0] == 0


@pytest.mark.django_db(transaction=True)
def test_an_undecided_edit_keeps_its_job_and_the_purge_says_why(settings):
    settings.JOBOPS_REPLAY_APPROVAL = True
    job = job_failed(code="BAD_INPUT")
    row = DeadLetter.objects.get(job=job)
    edit = fix_forward_request(
        dead_letter_id=row.id,
        actor_user=OperatorFactory(),
        params={"steps": 3, "step_seconds": 0},
        reason="waits",
    )
    # Its dead letter closed while the edit waited, as a discard before this release
    # left it: the edit is still `requested`, its decision in no chain.
    closed(job)
    other = ended_long_ago(job_in_state("succeeded"))
    ended_long_ago(job)

    out = io.StringIO()
    call_command("purge", "--dry-run", "--older-than", "1m", stdout=out)
    assert "would remove 1 jobs" in out.getvalue()
    assert "kept 1 jobs: a fix-forward edit waits for a decision" in out.getvalue()
    assert f"dead letter {row.id}" in out.getvalue()
    document = io.StringIO()
    call_command("purge", "--older-than", "1m", "--json", stdout=document)
    result = json.loads(document.getvalue())
    assert result["jobs"] == {"planning": 1}
    assert result["kept"]["edit_waiting"]["jobs"] == 1
    assert Job.objects.filter(id=job.id).exists() and not Job.objects.filter(id=other.id).exists()
    assert ParamsEdit.objects.get(id=edit.id).state == "requested"
    # The dashboard says so too: on the Last purge tile and in Needs attention.
    overview = dashboard_overview(use_cache=False)
    assert overview["purge"]["kept"]["edit_waiting"]["jobs"] == 1
    assert [p for p in overview["problems"] if p.startswith("Purge kept 1 jobs")], overview

    # Once an operator decides it, the job goes.
    fix_forward_reject(edit_id=edit.id, actor_user=OperatorFactory())
    removed, _ = purge_run(older_than=MINUTE)
    assert removed["jobs"] == {"planning": 1}
    assert not Job.objects.filter(id=job.id).exists()
    assert verify()[0] == 0


@pytest.mark.parametrize("resolve", ["discard", "replay", "retry"])
def test_closing_a_dead_letter_settles_the_edit_that_waited_on_it(settings, resolve):
    settings.JOBOPS_REPLAY_APPROVAL = True
    job = job_failed(code="BAD_INPUT")
    row = DeadLetter.objects.get(job=job)
    operator = OperatorFactory()
    edit = fix_forward_request(
        dead_letter_id=row.id,
        actor_user=OperatorFactory(),
        params={"steps": 3, "step_seconds": 0},
        reason="waits",
    )
    if resolve == "retry":  # the job page's retry closes the row too
        job_retry_failed(
            job_id=job.id, actor=Actor.operator(operator), user=operator, justification="x"
        )
    else:
        service = dead_letters_discard if resolve == "discard" else dead_letters_replay
        result = service(actor_user=operator, justification="handled", job_ids=[job.id])
        assert result.resolved == [row.id]

    edit.refresh_from_db()
    assert edit.state == "rejected" and edit.rejected_by_id == operator.pk
    last = AuditLog.objects.filter(chain=job_chain(job.id)).order_by("-seq").first()
    assert last.event_type == "fix_forward_rejected"
    assert json.loads(last.payload)["data"]["params_edit_id"] == edit.id
    assert verify()[0] == 0


# Every foreign key into a table purge deletes from, as the database has them (this
# app's tables and every other app's).
FOREIGN_KEYS_INTO_PURGED = """
SELECT c.conrelid::regclass::text, a.attname, c.confrelid::regclass::text
FROM pg_constraint c
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
WHERE c.contype = 'f' AND c.confrelid::regclass::text = ANY(%s)
ORDER BY 1, 2
"""


def foreign_keys_into_purged_tables() -> dict[tuple[str, str], str]:
    from jobs.services.purge import PURGED_TABLES

    with connection.cursor() as cursor:
        cursor.execute(FOREIGN_KEYS_INTO_PURGED, [list(PURGED_TABLES)])
        return {(table, column): target for table, column, target in cursor.fetchall()}


def unhandled(found: dict[tuple[str, str], str]) -> list[str]:
    from jobs.services.purge import PURGE_FOREIGN_KEYS

    declared = {(fk.table, fk.column) for fk in PURGE_FOREIGN_KEYS}
    return [
        f"{table}.{column} references {target}, which purge deletes from, and "
        "jobs.services.purge.PURGE_FOREIGN_KEYS does not name it: handle it in purge_delete "
        "(and the rule, jobs_purge_due) and declare it there"
        for (table, column), target in sorted(found.items())
        if (table, column) not in declared
    ]


def test_purge_names_every_foreign_key_into_the_tables_it_deletes_from():
    from jobs.services.purge import PURGE_FOREIGN_KEYS, PURGED_TABLES

    assert set(PURGED_TABLES) == {"jobs", "dead_letters", "artefacts", "event_outbox"}
    found = foreign_keys_into_purged_tables()
    assert not unhandled(found), "\n".join(unhandled(found))
    # Nor does it declare one that is gone (its SQL would handle nothing).
    stale = {(fk.table, fk.column) for fk in PURGE_FOREIGN_KEYS} - set(found)
    assert not stale, f"PURGE_FOREIGN_KEYS names foreign keys the database lacks: {stale}"
    assert all(fk.how.strip() for fk in PURGE_FOREIGN_KEYS)


def test_webhook_deliveries_copy_their_event_and_keep_no_key_into_what_purge_deletes():
    """A delivery holds its event's body and the job's id as values: purging the job or
    its outbox rows leaves it whole; it has a retention of its own (a purge extra)."""
    from django.conf import settings

    found = foreign_keys_into_purged_tables()
    assert not [key for key in found if key[0].startswith("webhook_")], found
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'webhook_deliveries' AND column_name IN ('job_id', 'body')"
        )
        assert cursor.fetchone()[0] == 2
    assert ("webhook_deliveries", "jobs.services.webhooks.webhook_deliveries_purge") in (
        settings.JOBOPS_PURGE_EXTRAS
    )


def test_the_guard_names_a_new_table_that_references_a_job():
    # As the next app's migration would add it (rolled back with the test).
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE probe_invoices (id serial PRIMARY KEY, "
            "job_id uuid REFERENCES jobs(id) DEFERRABLE INITIALLY DEFERRED)"
        )
    problems = unhandled(foreign_keys_into_purged_tables())
    assert len(problems) == 1 and problems[0].startswith(
        "probe_invoices.job_id references jobs, which purge deletes from"
    ), problems


def test_a_database_error_is_one_line_not_a_traceback():
    job = ended_long_ago(job_in_state("succeeded"))
    with connection.cursor() as cursor:  # a row purge does not know (rolled back with the test)
        cursor.execute(
            "CREATE TABLE probe_invoices (id serial PRIMARY KEY, job_id uuid REFERENCES jobs(id))"
        )
        cursor.execute("INSERT INTO probe_invoices (job_id) VALUES (%s)", [job.id])
    with pytest.raises(CommandError) as stopped:
        call_command("purge", "--older-than", "1m", stdout=io.StringIO())
    message = str(stopped.value)
    assert message.startswith("purge stopped: IntegrityError: ") and "\n" not in message
    assert "probe_invoices" in message and "removed nothing" in message
    assert Job.objects.filter(id=job.id).exists()
