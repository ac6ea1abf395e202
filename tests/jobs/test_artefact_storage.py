"""Artefacts in object storage (docs/operations/deploying.md#storage): the S3 backend
against an S3-compatible server over HTTP (tests.s3), the job body's s3_key, size and
sha256, streamed and presigned downloads, a storage that is down."""

from __future__ import annotations

import hashlib
import io
import os

import pytest
import requests
from django.core.files import File
from django.core.files.storage import storages

from jobs.artefact_storage import DigestingReader
from jobs.domain.errors import RetryableError
from jobs.models import Artefact, Job
from jobs.services import artefact_save
from jobs.services.artefacts import StorageUnavailableError
from tests.factories import make_job
from tests.processes import free_port

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs"
DATA = b"id,type\n" + b"row,sim\n" * 5000  # 40 KB: several chunks of a file storage


class CountingSource(io.BytesIO):
    """A source that counts the bytes read from it."""

    bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data


def test_an_artefact_is_written_to_the_bucket_with_its_key_size_and_sha256(s3):
    job = make_job()
    artefact = artefact_save(job_id=job.id, kind="report", name="jobs.csv", data=DATA)
    assert artefact.file.name.startswith(f"artefacts/{job.id}/report/")
    assert s3.object_bytes(artefact.file.name) == DATA
    stored = Artefact.objects.get(id=artefact.id)
    assert (stored.size, stored.sha256) == (len(DATA), hashlib.sha256(DATA).hexdigest())
    assert stored.file.read() == DATA  # read back through the S3 storage


@pytest.mark.parametrize("storage", ["filesystem", "s3"])
def test_the_digest_is_taken_while_writing_it_adds_no_read(storage, request):
    if storage == "s3":
        request.getfixturevalue("s3")
    # What the storage reads of a file it saves by itself (botocore may read a body
    # more than once: for a checksum, a payload signature, the send).
    baseline = CountingSource(DATA)
    storages["artefacts"].save(f"baseline/{storage}.csv", File(baseline, name="b.csv"))
    assert baseline.bytes_read >= len(DATA)
    source = CountingSource(DATA)
    artefact = artefact_save(job_id=make_job().id, kind="report", name="once.csv", data=source)
    assert source.bytes_read == baseline.bytes_read
    assert artefact.sha256 == hashlib.sha256(DATA).hexdigest() and artefact.size == len(DATA)
    assert artefact.file.read() == DATA


def test_the_digest_covers_bytes_a_storage_skipped_or_read_twice():
    reader = DigestingReader(io.BytesIO(DATA))
    reader.read(100)
    reader.seek(50)
    reader.read(100)  # 50 bytes again, 50 new
    reader.seek(0, os.SEEK_END)
    assert reader.finish() == (hashlib.sha256(DATA).hexdigest(), len(DATA))


def test_a_rerun_replaces_the_object_and_deletes_the_old_one_on_commit(
    s3, django_capture_on_commit_callbacks
):
    job = make_job()
    with django_capture_on_commit_callbacks(execute=True):
        first = artefact_save(job_id=job.id, kind="report", name="r.csv", data=b"one\n")
    with django_capture_on_commit_callbacks(execute=True):
        second = artefact_save(job_id=job.id, kind="report", name="r.csv", data=b"two\n")
    assert second.id == first.id and second.file.name != first.file.name
    assert s3.keys(f"artefacts/{job.id}/") == [second.file.name]
    assert s3.object_bytes(second.file.name) == b"two\n"


def test_the_job_body_lists_s3_key_size_and_sha256(s3, api):
    job = make_job(owner=api.user)
    artefact = artefact_save(job_id=job.id, kind="report", name="jobs.csv", data=DATA)
    body = api.get(f"{JOBS}/{job.id}").json()
    (listed,) = body["artefacts"]
    assert listed["s3_key"] == artefact.file.name
    assert listed["size"] == len(DATA)
    assert listed["sha256"] == hashlib.sha256(DATA).hexdigest()
    # The list and the create answers' bodies (the ORM path) say the same.
    (in_list,) = api.get(JOBS).json()["results"][0]["artefacts"]
    assert in_list == listed


def test_a_stream_download_serves_the_objects_bytes(s3, api):
    job = make_job(owner=api.user)
    artefact = artefact_save(job_id=job.id, kind="report", name="jobs.csv", data=DATA)
    response = api.get(f"{JOBS}/{job.id}/artefacts/{artefact.id}")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == DATA
    assert response["ETag"] == f'"{hashlib.sha256(DATA).hexdigest()}"'


def test_a_presigned_download_redirects_to_a_url_that_serves_the_bytes(s3, api, settings):
    settings.ARTEFACT_DOWNLOAD = "presigned"
    job = make_job(owner=api.user)
    artefact = artefact_save(
        job_id=job.id, kind="report", name="jobs.csv", data=DATA, content_type="text/csv"
    )
    response = api.get(f"{JOBS}/{job.id}/artefacts/{artefact.id}")
    assert response.status_code == 302
    location = response["Location"]
    assert location.startswith(s3.endpoint_url) and "X-Amz-Expires=300" in location
    fetched = requests.get(location, timeout=10)
    assert fetched.status_code == 200
    assert hashlib.sha256(fetched.content).hexdigest() == artefact.sha256
    assert fetched.headers["Content-Type"] == "text/csv"
    assert 'filename="jobs.csv"' in fetched.headers["Content-Disposition"]


def test_a_presigned_download_checks_ownership_first(s3, api, other_api, settings):
    settings.ARTEFACT_DOWNLOAD = "presigned"
    job = make_job(owner=api.user)
    artefact = artefact_save(job_id=job.id, kind="report", name="jobs.csv", data=DATA)
    response = other_api.get(f"{JOBS}/{job.id}/artefacts/{artefact.id}")
    assert response.status_code == 404
    assert "Location" not in response


def test_the_file_system_always_streams_even_when_presigned_is_asked_for(api, settings):
    settings.ARTEFACT_DOWNLOAD = "presigned"
    job = make_job(owner=api.user)
    artefact = artefact_save(job_id=job.id, kind="report", name="jobs.csv", data=b"a\n")
    response = api.get(f"{JOBS}/{job.id}/artefacts/{artefact.id}")
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"a\n"


def test_a_storage_that_is_down_fails_the_write_retryably_and_loses_nothing(s3, settings):
    from config.settings import artefact_storage_config

    job = make_job()
    kept = artefact_save(job_id=job.id, kind="report", name="r.csv", data=b"kept\n")
    version = Job.objects.get(id=job.id).version
    settings.STORAGES = {  # nothing listens there
        **settings.STORAGES,
        "artefacts": artefact_storage_config(
            "s3", bucket=s3.bucket, endpoint_url=f"http://127.0.0.1:{free_port()}", timeout=1
        ),
    }
    with pytest.raises(StorageUnavailableError) as raised:
        artefact_save(job_id=job.id, kind="report", name="r.csv", data=b"lost?\n")
    assert isinstance(raised.value, RetryableError) and raised.value.retryable
    assert raised.value.code == "STORAGE_UNAVAILABLE"
    # The row and the object it names are as they were; the job did not move.
    row = Artefact.objects.get(id=kept.id)
    assert (row.file.name, row.sha256) == (kept.file.name, kept.sha256)
    assert s3.object_bytes(kept.file.name) == b"kept\n"
    assert Job.objects.get(id=job.id).version == version


def test_a_download_while_the_store_is_down_is_a_503_in_the_envelope(s3, api, settings):
    from config.settings import artefact_storage_config

    job = make_job(owner=api.user)
    artefact = artefact_save(job_id=job.id, kind="report", name="jobs.csv", data=DATA)
    settings.STORAGES = {  # the object's store, now unreachable
        **settings.STORAGES,
        "artefacts": artefact_storage_config(
            "s3", bucket=s3.bucket, endpoint_url=f"http://127.0.0.1:{free_port()}", timeout=1
        ),
    }
    response = api.get(f"{JOBS}/{job.id}/artefacts/{artefact.id}")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "ERR-JOB-503"
    assert response["Retry-After"] == "5"
