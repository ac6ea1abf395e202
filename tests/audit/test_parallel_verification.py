"""A large table is verified in chain ranges side by side, on one snapshot, and finds
exactly what one stream finds."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.test import override_settings

from audit.models import AuditLog
from audit.services import Actor, audit_append, job_chain
from audit.verification import audit_verify
from tests.audit.tampering import tamper
from tests.factories import job_in_state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def jobs():
    made = sorted((job_in_state("succeeded") for _ in range(12)), key=lambda j: job_chain(j.id))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE audit_logs")  # the ranges come from the chain histogram
    return made


def parallel(streams: int = 3):
    return override_settings(AUDIT_VERIFY_STREAMS=streams, AUDIT_VERIFY_PARALLEL_MIN_ROWS=0)


@pytest.mark.parametrize("streams", [2, 3, 5])
def test_parallel_streams_check_every_row_and_chain_once(jobs, streams):
    with parallel(streams):
        report = audit_verify()
    assert report.ok, report.problems
    assert report.streams == streams
    assert (report.rows_checked, report.chains_checked) == (48, 12)
    single = audit_verify()
    assert single.streams == 1
    assert (single.rows_checked, single.chains_checked) == (48, 12)


def test_tampering_is_found_in_every_range(jobs):
    first, last = jobs[0], jobs[-1]
    for job in (first, last):
        tamper(
            "UPDATE audit_logs SET payload = replace(payload, 'succeeded', 'SUCCEEDED') "
            "WHERE chain = %s AND seq = 4",
            [job_chain(job.id)],
        )
    with parallel():
        report = audit_verify()
    assert report.streams == 3
    found = {(p.job_id, p.seq) for p in report.problems if p.kind == "row_broken"}
    assert found == {(str(first.id), 4), (str(last.id), 4)}
    assert [str(p) for p in report.problems] == [str(p) for p in audit_verify().problems]


def test_the_streams_share_one_snapshot(jobs):
    """History committed once the verification's snapshot is taken is seen by none of
    its streams, however late a stream starts reading."""
    rows_before = AuditLog.objects.count()

    def append_to_first_and_last_chain() -> None:
        for job in (jobs[0], jobs[-1]):
            with transaction.atomic():
                audit_append(
                    chain=job_chain(job.id),
                    event_type="progress",
                    actor=Actor.system("test"),
                    job_id=job.id,
                    data={"late": True},
                )
        connection.close()  # this thread's own connection

    def commit_more_after_the_export(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "pg_export_snapshot" in sql:
            thread = threading.Thread(target=append_to_first_and_last_chain)
            thread.start()
            thread.join()
        return result

    with parallel(), connection.execute_wrapper(commit_more_after_the_export):
        report = audit_verify()
    assert report.streams == 3
    assert report.ok, report.problems
    assert report.rows_checked == rows_before
    assert AuditLog.objects.count() == rows_before + 2
    assert audit_verify().rows_checked == rows_before + 2
