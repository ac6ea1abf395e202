"""Background replays and discards: chunks per dispatcher loop, progress, stop, leases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from audit.models import AuditLog
from dlq.bulk import bulk_operation_start, bulk_operation_stop, bulk_operations_run_once
from dlq.errors import DeadLetterPermissionError
from dlq.models import BulkOperation
from jobs.models import DeadLetter, Job
from tests.factories import OperatorFactory, role_user, worker_lost
from tests.polling import wait_for
from tests.processes import dispatcher_process

pytestmark = pytest.mark.django_db


def _start(operator, **selection):
    return bulk_operation_start(
        action="replay", actor_user=operator, justification="INC-9", **selection
    )


def test_a_bulk_replay_goes_chunk_by_chunk_and_records_its_progress(broker):
    jobs = [worker_lost() for _ in range(5)]
    operation = _start(OperatorFactory(), queue="sim_dlq")
    assert (operation.state, operation.total, operation.percent) == ("queued", 5, 0)
    progress = []
    for _ in range(3):
        bulk_operations_run_once(chunk=2)
        operation.refresh_from_db()
        progress.append((operation.state, operation.processed, operation.resolved))
    assert progress == [("running", 2, 2), ("running", 4, 4), ("running", 5, 5)]
    bulk_operations_run_once(chunk=2)
    operation.refresh_from_db()
    assert (operation.state, operation.percent) == ("done", 100) and operation.finished_at
    assert set(
        Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True)
    ) == {"pending"}
    replays = AuditLog.objects.filter(event_type="dlq_replayed")
    assert replays.count() == 5
    assert all(f'"bulk_operation_id":"{operation.id}"' in e.payload for e in replays)


def test_stop_ends_it_before_the_next_chunk_and_keeps_what_was_done(broker):
    for _ in range(4):
        worker_lost()
    operator = OperatorFactory()
    operation = _start(operator)
    bulk_operations_run_once(chunk=2)
    stopped = bulk_operation_stop(operation_id=operation.id, actor_user=operator)
    assert stopped.stop_requested and stopped.state == "running"
    bulk_operations_run_once(chunk=2)
    operation.refresh_from_db()
    assert (operation.state, operation.processed, operation.stopped_by) == ("stopped", 2, operator)
    assert DeadLetter.objects.filter(state="open").count() == 2
    assert bulk_operations_run_once(chunk=2) == {}  # nothing left to work on


def test_a_queued_operation_stops_at_once(broker):
    worker_lost()
    operator = OperatorFactory()
    operation = bulk_operation_stop(operation_id=_start(operator).id, actor_user=operator)
    assert operation.state == "stopped" and operation.finished_at
    assert bulk_operations_run_once() == {}


def test_a_viewer_cannot_stop_an_operation(broker):
    worker_lost()
    operation = _start(OperatorFactory())
    with pytest.raises(DeadLetterPermissionError):
        bulk_operation_stop(operation_id=operation.id, actor_user=role_user("viewer"))
    assert BulkOperation.objects.get().state == "queued"


def test_dead_letters_recorded_after_the_start_are_not_chased(broker):
    first = worker_lost()
    operation = _start(OperatorFactory(), queue="sim_dlq")
    later = worker_lost()  # e.g. a replayed job that failed again
    while bulk_operations_run_once(chunk=1):
        pass
    operation.refresh_from_db()
    assert (operation.state, operation.processed) == ("done", 1)
    assert Job.objects.get(id=first.id).status == "pending"
    assert DeadLetter.objects.get(job=later).state == "open"


def test_a_held_lease_keeps_other_dispatchers_off_and_an_expired_one_is_taken_over(broker):
    worker_lost()
    operation = _start(OperatorFactory())
    BulkOperation.objects.filter(id=operation.id).update(
        state="running",
        lease_owner="other-host:1",
        lease_until=timezone.now() + timedelta(minutes=1),
    )
    assert bulk_operations_run_once() == {}
    # Well in the past: the test's transaction fixes the database's now() at its start,
    # which a loaded machine may leave more than a few seconds behind timezone.now().
    BulkOperation.objects.filter(id=operation.id).update(
        lease_until=timezone.now() - timedelta(minutes=10)
    )
    assert bulk_operations_run_once()["resolved"] == 1


def test_an_operation_fails_when_its_requester_loses_the_permission(broker):
    worker_lost()
    operator = OperatorFactory()
    operation = _start(operator)
    operator.user_permissions.remove(Permission.objects.get(codename="replay_deadletter"))
    bulk_operations_run_once()
    operation.refresh_from_db()
    assert operation.state == "failed" and "permission" in operation.last_error
    assert DeadLetter.objects.get().state == "open"


@pytest.mark.django_db(transaction=True)
def test_the_dispatcher_works_a_bulk_discard_through(broker):
    for _ in range(7):
        worker_lost()
    operation = bulk_operation_start(
        action="discard", actor_user=OperatorFactory(), justification="duplicates"
    )
    with dispatcher_process(interval=0.1, env={"JOBOPS_DLQ_BULK_CHUNK": "3"}):
        wait_for(lambda: BulkOperation.objects.get(id=operation.id).state == "done", timeout=30)
    operation.refresh_from_db()
    assert (operation.processed, operation.resolved) == (7, 7)
    assert not DeadLetter.objects.filter(state="open").exists()
    assert AuditLog.objects.filter(event_type="dlq_discarded").count() == 7
