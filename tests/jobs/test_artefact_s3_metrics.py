"""The artefact storage's calls to S3, timed and counted where boto3 makes them
(jobs/integrations/artefact_s3.py), against the S3-compatible server of tests.s3; the
file system's storage emits none."""

from __future__ import annotations

import pytest
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
    SSLError,
)
from django.core.files.base import ContentFile
from django.core.files.storage import storages

from config.settings import artefact_storage_config
from jobs.integrations.artefact_s3 import (
    MeteredS3Storage,
    answer_error_kind,
    exception_error_kind,
    operation_label,
)
from jobs.models import Artefact
from jobs.services import artefact_save
from jobs.services.artefacts import StorageUnavailableError
from tests.factories import make_job
from tests.metric_samples import Moved
from tests.processes import free_port

pytestmark = pytest.mark.django_db

DURATION = "s3_operation_duration_seconds_count"
ERRORS = "s3_operation_errors_total"


def _point_at(settings, s3, **options) -> None:
    settings.STORAGES = {
        **settings.STORAGES,
        "artefacts": artefact_storage_config(
            "s3",
            **{"bucket": s3.bucket, "endpoint_url": s3.endpoint_url, "timeout": 1, **options},
        ),
    }


def test_a_put_and_a_get_are_timed_by_operation(s3):
    assert isinstance(storages["artefacts"], MeteredS3Storage)
    moved = Moved()
    artefact = artefact_save(job_id=make_job().id, kind="report", name="r.csv", data=b"a,b\n")
    assert moved(DURATION, operation="put") == 1
    # The HEAD that found the name free before the PUT: S3's 404 is an answer there.
    assert moved(DURATION, operation="head") == 1
    assert Artefact.objects.get(id=artefact.id).file.read() == b"a,b\n"
    assert moved(DURATION, operation="get") == 1
    assert moved("s3_operation_duration_seconds_sum", operation="get") > 0
    assert moved.across(ERRORS) == 0


def test_a_delete_and_a_presigned_url_are_timed(s3):
    storage = storages["artefacts"]
    name = storage.save("metrics/d.txt", ContentFile(b"x"))
    moved = Moved()
    assert storage.url(name).startswith(s3.endpoint_url)
    storage.delete(name)
    assert moved(DURATION, operation="presign") == 1
    assert moved(DURATION, operation="delete") == 1
    assert s3.keys("metrics/") == []


def test_a_store_that_is_down_counts_a_connection_error(s3, settings):
    _point_at(settings, s3, endpoint_url=f"http://127.0.0.1:{free_port()}")  # nobody there
    moved = Moved()
    with pytest.raises(StorageUnavailableError):
        artefact_save(job_id=make_job().id, kind="report", name="r.csv", data=b"lost?\n")
    # The first call (the HEAD for a free name) failed after boto3's own retries: once.
    assert moved(ERRORS, operation="head", kind="connection_error") == 1
    assert moved(DURATION, operation="head") == 1
    assert moved(DURATION, operation="put") == 0


def test_a_refused_call_counts_by_what_s3_answered(s3, settings):
    _point_at(settings, s3, bucket="no-such-bucket")
    moved = Moved()
    with pytest.raises(StorageUnavailableError):
        artefact_save(job_id=make_job().id, kind="report", name="r.csv", data=b"x\n")
    assert moved(ERRORS, operation="put", kind="not_found") == 1  # NoSuchBucket
    assert moved(ERRORS, operation="head") == 0  # a HEAD's 404 is no failure


def test_the_file_system_storage_emits_no_s3_metrics():
    moved = Moved()
    artefact = artefact_save(job_id=make_job().id, kind="report", name="r.csv", data=b"a\n")
    assert Artefact.objects.get(id=artefact.id).file.read() == b"a\n"
    assert moved.across(DURATION) == 0 and moved.across(ERRORS) == 0


def test_the_labels_are_bounded():
    assert operation_label("after-call.s3.PutObject") == "put"
    assert operation_label("after-call.s3.UploadPart") == "multipart"
    assert operation_label("after-call.s3.PutBucketPolicy") == "other"
    assert [answer_error_kind("get", s) for s in (200, 204, 403, 404, 409, 503)] == [
        None,
        None,
        "access_denied",
        "not_found",
        "client_error",
        "server_error",
    ]
    assert answer_error_kind("head", 404) is None and answer_error_kind("head", 403)
    assert exception_error_kind(ReadTimeoutError(endpoint_url="u")) == "timeout"
    assert exception_error_kind(ConnectTimeoutError(endpoint_url="u")) == "timeout"
    assert exception_error_kind(EndpointConnectionError(endpoint_url="u")) == "connection_error"
    assert exception_error_kind(SSLError(endpoint_url="u", error="e")) == "connection_error"
    assert exception_error_kind(ConnectionClosedError(endpoint_url="u")) == "connection_error"
    assert exception_error_kind(ValueError()) == "error"
