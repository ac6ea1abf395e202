"""The statements that run beside a drain keep their indexes on a table whose statistics
say that almost no job is pending or running: a deployment's table after a year of
finished jobs, analysed (docs/benchmarks.md#beside-a-million-finished-jobs). The
transition functions' lock probe takes the primary key, the claims and the publisher
keep their ordered probe, and the purge reads only jobs past their retention. The plans
of the statements nested in the transition functions come from auto_explain, loaded
into this session alone and reporting as notices."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from jobs.domain.states import Status
from jobs.models import Job
from jobs.queries import QUERIES
from jobs.services import Finish, job_claim, job_succeed, jobs_claim, jobs_finish
from jobs.services.purge import _retention_params
from tests.factories import UserFactory, fence_of, job_in_state, make_job

HOST = "plans-host:1:test"
FINISHED = 3000
# The partial indexes of `jobs` over unfinished jobs (jobs/models.py): a probe by id
# that takes one of them reads every job it holds, for each id.
STATUS_INDEXES = (
    "jobs_unfinished_idx",
    "jobs_pending_idx",
    "jobs_pending_priority_idx",
    "jobs_retry_due_idx",
    "jobs_running_lock_idx",
)
# Columns of the clones that must differ from the job they are cloned from.
OVERRIDES = {
    "id": "gen_random_uuid()",
    "status": "'succeeded'",
    "created_at": "now() - s.n * interval '1 minute'",
    "updated_at": "now() - s.n * interval '1 minute'",
    "idempotency_key": "NULL",
    "idempotency_expires_at": "NULL",
    "idempotency_last_seen_at": "NULL",
    "request_id": "NULL",
    "rerun_of_id": "NULL",
}


def finished_table(count: int) -> None:
    """`count` finished jobs cloned from one new job in one INSERT ... SELECT (as
    bench/executors.py seeds them), then ANALYZE: statistics in which pending and
    running jobs are too few to show."""
    template = make_job()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'jobs' AND table_schema = current_schema() "
            "ORDER BY ordinal_position"
        )
        columns = [row[0] for row in cursor.fetchall()]
        select = ", ".join(OVERRIDES.get(c, f"t.{c}") for c in columns)
        cursor.execute(
            f"INSERT INTO jobs ({', '.join(columns)}) SELECT {select} "
            "FROM generate_series(1, %s) AS s(n), jobs t WHERE t.id = %s",
            [count, template.id],
        )
        cursor.execute("ANALYZE jobs")


# pg_class's counts of `jobs` and its indexes: ANALYZE writes them in place, so the
# test's rollback does not undo them, and another test's plans would see this table.
CLASS_STATS = """
    SELECT c.oid, c.relpages, c.reltuples, c.relallvisible FROM pg_class c
    WHERE c.oid = 'jobs'::regclass
       OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'jobs'::regclass)
"""


@pytest.fixture
def finished(request: Any, django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """An analysed table of FINISHED finished jobs for the test (in its transaction);
    afterwards, once the transaction has been rolled back, pg_class's counts as they were."""
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(CLASS_STATS)
        saved = cursor.fetchall()
    request.getfixturevalue("db")  # set up after this fixture, so torn down before it
    finished_table(FINISHED)
    yield
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        for oid, pages, tuples, visible in saved:
            cursor.execute(
                "UPDATE pg_class SET relpages = %s, reltuples = %s, relallvisible = %s "
                "WHERE oid = %s",
                [pages, tuples, visible, oid],
            )


@pytest.fixture
def plans(finished: None) -> Iterator[list[str]]:
    """Every statement's plan in this session, nested ones included, as they run."""
    with connection.cursor() as cursor:
        try:
            with transaction.atomic():
                cursor.execute("LOAD 'auto_explain'")
        except DatabaseError:
            pytest.skip("auto_explain cannot be loaded by this role")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
        ):
            cursor.execute(f"SET LOCAL {setting}")
    seen: list[str] = []

    def notice(diagnostic: Any) -> None:
        if "plan:" in (diagnostic.message_primary or ""):
            seen.append(diagnostic.message_primary)

    raw = connection.connection
    raw.add_notice_handler(notice)
    try:
        yield seen
    finally:
        raw.remove_notice_handler(notice)
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL auto_explain.log_min_duration = -1")


def probes(seen: list[str]) -> list[str]:
    """The plans of the transition functions' statements (each locks by id)."""
    return [plan for plan in seen if "WHERE jobs.id = i.id" in plan]


def test_a_claim_and_its_end_probe_the_primary_key_beside_many_finished_jobs(plans):
    for _ in range(6):
        make_job()
    claimed = jobs_claim(queues=["sim"], locked_by=HOST, limit=6)
    assert len(claimed) == 6
    finishes = [Finish(job.id, job.attempts, "succeeded", result={}) for job in claimed]
    assert jobs_finish(finishes=finishes, locked_by=HOST) == []
    found = probes(plans)
    assert len(found) >= 2, plans  # the claim's and the success's
    for plan in found:
        assert re.search(r"Index Scan using jobs_pkey on jobs \w+ .*\n\s+Index Cond: \(id = ", plan)
        for index in STATUS_INDEXES:
            assert index not in plan, plan


def explain(name: str, **params: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + QUERIES[name], _retention_params(None) | params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.parametrize("statement", ["claimable_jobs", "due_pending_jobs"])
def test_the_claims_and_the_publisher_cannot_take_the_gauges_pending_index(finished, statement):
    # With no pending job in the statistics, jobs_pending_idx looked like a one-row
    # scan: a claim read every pending job of its queue and sorted them.
    params = {"queues": ["sim"], "skip_types": [], "limit": 64, "before": timezone.now()}
    params |= {"skip": [], "window": 50, "skip_queues": []}
    plan = explain(statement, **params)
    assert "jobs_pending_idx" not in plan, plan
    assert "Index Scan using jobs_pending_priority_idx" in plan, plan


def test_the_oldest_pending_gauge_keeps_its_index(finished):
    assert "jobs_pending_idx" in explain("gauges", stale_after=60.0)


def test_a_purge_batch_reads_only_the_jobs_past_their_retention(finished):
    # Finished jobs of a type kept 90 days, none past it: the batch must not walk them
    # (it walked every job older than the shortest retention, the rule called per row).
    plan = explain("purge_claim", limit=100)
    assert "Index Scan using jobs_ended_idx" in plan, plan
    assert "Index Cond: (((type)::text = r.type) AND (updated_at <" in plan, plan
    assert "jobs_created_idx" not in plan and "Seq Scan on jobs" not in plan, plan


def test_the_look_for_kept_jobs_starts_from_the_undecided_edits(finished):
    plan = explain("purge_kept", limit=10)
    assert "on params_edits" in plan, plan
    assert "Index Scan using jobs_pkey on jobs" in plan, plan
    assert "jobs_created_idx" not in plan and "Seq Scan on jobs" not in plan, plan


def _plans_of_one_job_transitions() -> tuple[int, int]:
    """(generic, custom) plans of this connection's prepared statements that call a
    transition function (jobs.services.transitions.STATEMENTS; the statements inside
    the PL/pgSQL function are planned by its own plan cache, as prepared ones)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0) "
            "FROM pg_prepared_statements WHERE statement LIKE '%%(m.moved).*%%'"
        )
        generic, custom = cursor.fetchone()
    return int(generic), int(custom)


def test_a_workers_claim_and_finish_keep_one_plan_instead_of_being_planned_each_time(
    finished: None,
) -> None:
    # Planning the statement anew cost more than running it. After PostgreSQL's five
    # trial runs a prepared statement keeps its generic plan only if that plan is no
    # dearer than the custom ones: this fails if the statement's shape stops allowing it.
    # On an analysed table with history (`finished`): the estimates a live database's
    # planner has.
    owner = UserFactory()
    jobs = [job_in_state(Status.QUEUED, owner=owner) for _ in range(8)]
    generic_before, custom_before = _plans_of_one_job_transitions()
    for job in jobs:
        claimed = job_claim(job_id=job.id, locked_by="w1")
        assert claimed is not None
        job_succeed(job_id=job.id, fence=fence_of(claimed), result=None)
    generic, custom = _plans_of_one_job_transitions()
    assert custom - custom_before <= 10  # at most five trials for each of the two
    assert generic - generic_before >= 6
    assert {j.status for j in Job.objects.filter(id__in=[j.id for j in jobs])} == {"succeeded"}
