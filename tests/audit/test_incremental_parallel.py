"""Incremental verification reads the new entries in id ranges side by side, on one
snapshot, across checkpoint ranges, and finds what one stream finds."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

from audit.checkpoints import checkpoint_write
from audit.incremental import Trusted, audit_verify_incremental
from audit.models import AuditLog
from audit.services import OPS_CHAIN, Actor, audit_append
from jobs.services import job_claim
from tests.audit.tampering import tamper
from tests.factories import job_in_state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def day():
    queued = [job_in_state("queued") for _ in range(3)]
    trusted = checkpoint_write()
    for job in queued[:2]:
        job_claim(job_id=job.id, locked_by="w1")
    job_in_state("succeeded")
    checkpoint_write()
    with transaction.atomic():
        audit_append(chain=OPS_CHAIN, event_type="test_event", actor=Actor.system())
    job_claim(job_id=queued[2].id, locked_by="w1")
    job_in_state("succeeded")
    checkpoint_write()
    job_in_state("running")  # not yet covered
    return trusted, queued


@pytest.mark.parametrize("streams", [2, 3])
def test_streams_across_checkpoint_ranges_check_every_new_row_once(day, streams):
    trusted, _ = day
    new_rows = AuditLog.objects.filter(id__gt=trusted.last_audit_id).count()
    with override_settings(AUDIT_VERIFY_STREAMS=streams, AUDIT_VERIFY_PARALLEL_MIN_ROWS=0):
        report = audit_verify_incremental(Trusted(trusted.checkpoint_hash))
    assert report.ok, report.problems
    assert report.streams == streams
    assert report.rows_checked == new_rows
    single = audit_verify_incremental(Trusted(trusted.checkpoint_hash))
    assert single.streams == 1 and single.ok
    assert (single.chains_checked, single.heads_checked) == (
        report.chains_checked,
        report.heads_checked,
    )


def test_a_changed_row_is_found_with_streams(day):
    trusted, queued = day
    row = AuditLog.objects.get(job_id=queued[2].id, event_type="started")
    tamper(
        "UPDATE audit_logs SET payload = replace(payload, 'running', 'RUNNING') WHERE id = %s",
        [row.id],
    )
    with override_settings(AUDIT_VERIFY_STREAMS=3, AUDIT_VERIFY_PARALLEL_MIN_ROWS=0):
        report = audit_verify_incremental(Trusted(trusted.checkpoint_hash))
    single = audit_verify_incremental(Trusted(trusted.checkpoint_hash))
    assert report.streams == 3
    assert (str(queued[2].id), row.seq) in {(p.job_id, p.seq) for p in report.problems}
    assert [str(p) for p in report.problems] == [str(p) for p in single.problems]
