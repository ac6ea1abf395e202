"""The async jobs metric names (docs/operations/observability.md#metrics): each moves at its
event with the job's type and its queue from the types table, a failure by the
taxonomy's class of its error; the names they replace move with them for one release
(docs/operations/upgrading.md#metric-names). In process: the counters move when the
transition commits, hence django_capture_on_commit_callbacks(execute=True)."""

from __future__ import annotations

import pytest

from jobs.domain.errors import FAILURE_CLASSES, failure_class
from jobs.domain.types import all_types
from jobs.integrations import metrics
from jobs.services.batch_creation import BatchItem, job_batch_submit
from tests.factories import UserFactory, job_in_state, make_job
from tests.metric_samples import Moved

pytestmark = pytest.mark.django_db

# `ai` runs on the queue `default`: the queue label is the table's, not the type's name.
AI = {"job_type": "ai", "queue": "default"}
SIM = {"job_type": "sim", "queue": "sim"}
AI_PARAMS = {"text": "hello"}


def test_a_created_job_counts_as_enqueued_on_its_types_queue(django_capture_on_commit_callbacks):
    moved = Moved()
    owner = UserFactory()
    with django_capture_on_commit_callbacks(execute=True):
        make_job(owner, job_type="ai", params=AI_PARAMS, key="k1")
    assert moved("jobs_enqueued_total", **AI) == 1
    assert moved("job_create_total", type="ai", status="created") == 1  # the deprecated name
    with django_capture_on_commit_callbacks(execute=True):
        make_job(owner, job_type="ai", params=AI_PARAMS, key="k1")  # the same job again
    assert moved("jobs_enqueued_total", **AI) == 1
    assert moved.across("jobs_enqueued_total", job_type="ai", queue="ai") == 0


def test_a_batch_counts_each_created_job_as_enqueued(django_capture_on_commit_callbacks):
    moved = Moved()
    items = [BatchItem(job_type="sim", params={"steps": 1, "step_seconds": 0}) for _ in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        outcomes, _ = job_batch_submit(owner=UserFactory(), items=items, limits=False)
    assert [o.status for o in outcomes] == ["created"] * 3
    assert moved("jobs_enqueued_total", **SIM) == 3


def test_a_claim_counts_as_started_and_a_success_as_succeeded(django_capture_on_commit_callbacks):
    moved = Moved()
    with django_capture_on_commit_callbacks(execute=True):
        job_in_state("succeeded", job_type="ai", params=AI_PARAMS)
    assert moved("jobs_started_total", **AI) == 1
    assert moved("jobs_succeeded_total", type="ai", **AI) == 1
    assert moved("jobs_attempts_count", **AI) == 1
    assert moved("jobs_attempts_sum", **AI) == 1
    assert moved("job_attempts_count", type="ai") == 1  # the deprecated name
    assert moved.across("jobs_failed_total") == 0 and moved.across("deadletter_total") == 0


@pytest.mark.parametrize(
    ("reason", "code", "error_class"),
    [
        ("exhausted", "DEPENDENCY_DOWN", "retryable"),
        ("exhausted", "UNEXPECTED_KeyError", "retryable"),
        ("nonretryable", "VALIDATION", "nonretryable"),
        ("fatal", "FATAL", "fatal"),
        ("nonretryable", "TIME_LIMIT", "time_limit"),
        ("exhausted", "TIME_LIMIT", "time_limit"),
        ("worker_lost", "WORKER_LOST", "worker_lost"),
        ("delivery_limit", None, "other"),  # a broker's dead letter: no class of the taxonomy
    ],
)
def test_a_dead_lettered_job_counts_as_failed_by_the_class_of_its_error(
    reason, code, error_class, django_capture_on_commit_callbacks
):
    moved = Moved()
    with django_capture_on_commit_callbacks(execute=True):
        job_in_state("failed", reason=reason, error_code=code)
    code_label = metrics.error_code_label(code)
    failed = moved(
        "jobs_failed_total", type="sim", error_code=code_label, error_class=error_class, **SIM
    )
    assert failed == 1
    assert moved.across("jobs_failed_total") == 1  # under that class alone
    assert moved("deadletter_total", **SIM) == 1
    assert moved("jobs_dead_lettered_total", type="sim", reason=reason) == 1  # deprecated
    assert moved("jobs_started_total", **SIM) == 1 and moved("jobs_attempts_count", **SIM) == 1


def test_the_error_class_takes_only_the_taxonomys_classes():
    assert failure_class(reason="exhausted", error_code="ERP_503") == "retryable"
    for reason in ("rejected", "expired", "maxlen", "delivery_limit", "", None, "a-new-one"):
        assert failure_class(reason=reason, error_code="ANY") == "other"
    assert failure_class(reason="fatal", error_code="TIME_LIMIT") == "time_limit"
    assert "other" in FAILURE_CLASSES and len(FAILURE_CLASSES) == 6


def test_the_job_type_and_queue_labels_come_from_the_types_table(settings):
    for name, spec in all_types().items():
        assert metrics.jobs_labels(name) == {"job_type": name, "queue": spec.queue}
    # A job whose type left the table (created before) names no queue of its own.
    assert metrics.jobs_labels("removed-type") == {"job_type": "other", "queue": "other"}
