"""Concurrent appends queue on the chain's advisory lock and never fork it."""

from __future__ import annotations

import itertools
import uuid

import pytest
from django.db import transaction

from audit.checkpoints import checkpoint_write
from audit.models import AuditCheckpoint, AuditLog
from audit.services import Actor, audit_append, job_chain
from audit.verification import audit_verify
from tests.factories import job_in_state
from tests.threads import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)
THREADS = 20


def append(chain: str, job_id, index: int) -> None:
    with transaction.atomic():
        audit_append(
            chain=chain,
            event_type="progress",
            actor=Actor.system(f"thread-{index}"),
            job_id=job_id,
            data={"thread": index},
        )


def test_twenty_concurrent_first_entries_make_one_unforked_chain():
    # A chain of its own, not a job's: audit_append serves every chain but a job's
    # (a job chain without its job row is a deleted job: verification reports it).
    chain = f"test:{uuid.uuid4()}"
    assert run_in_threads(lambda i: append(chain, None, i), THREADS) == []
    rows = list(AuditLog.objects.filter(chain=chain).order_by("seq"))
    assert [r.seq for r in rows] == list(range(1, THREADS + 1))
    assert rows[0].prev_hash == "0" * 64
    assert all(b.prev_hash == a.chain_hash for a, b in itertools.pairwise(rows))
    assert len({r.actor_id for r in rows}) == THREADS  # every thread's entry is there
    report = audit_verify(chains=[chain])
    assert report.ok, report.problems
    assert report.rows_checked == THREADS


def test_concurrent_appends_to_a_job_with_history_continue_its_chain():
    job = job_in_state("succeeded")
    assert run_in_threads(lambda i: append(job_chain(job.id), job.id, i), THREADS) == []
    seqs = list(
        AuditLog.objects.filter(job_id=job.id).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, 4 + THREADS + 1))
    assert audit_verify().ok


def test_concurrent_checkpoint_writers_write_one_checkpoint():
    job_in_state("succeeded")
    written = []
    assert run_in_threads(lambda i: written.append(checkpoint_write()), 4) == []
    assert sum(c is not None for c in written) == 1
    assert AuditCheckpoint.objects.count() == 1
    assert audit_verify().ok
