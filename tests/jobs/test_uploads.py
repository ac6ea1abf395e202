"""Uploads and the `import` job (docs/api.md#uploading-an-input): an input stored with
its sha256, named by an import job of the same organisation, checked again before it
is read, and swept once no job names it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from datetime import timedelta

import pytest
from celery.exceptions import Reject
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditLog
from jobs.artefact_storage import artefact_storage
from jobs.models import Job
from jobs.processes.runtime import job_execute
from jobs.services.purge import purge_extras
from jobs.services.uploads import UPLOAD_CREATED, UPLOAD_SWEPT, upload_orphans_sweep
from jobs.tables.uploads import Upload
from tenants.models import Membership, Scope
from tenants.services import token_create
from tests.factories import OrganisationFactory, UserFactory, client_for

UPLOADS = "/api/v1/uploads"
JOBS = "/api/v1/jobs"
CSV = b"sku,qty\nA-1,3\nB-2,5\nC-3,1\n"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def own_media_root(settings, tmp_path):
    """A storage folder of the test's own: what it finds stored (or swept) is its own,
    whatever the suite's other processes store meanwhile."""
    settings.MEDIA_ROOT = str(tmp_path / "media")


def upload(
    client: APIClient,
    data: bytes = CSV,
    content_type: str = "text/csv",
    name: str = "stock.csv",
    **fields,
):
    part = SimpleUploadedFile(name, data, content_type=content_type)
    return client.post(UPLOADS, {"file": part, **fields}, format="multipart")


def stored_uploads() -> list[str]:
    try:
        orgs = artefact_storage.listdir("uploads")[0]
    except FileNotFoundError:
        return []
    return [
        f"{org}/{name}" for org in orgs for name in artefact_storage.listdir(f"uploads/{org}")[1]
    ]


def ops_events(event_type: str) -> list[dict]:
    return [
        json.loads(entry.payload)["data"]
        for entry in AuditLog.objects.filter(chain="ops", event_type=event_type).order_by("seq")
    ]


def import_job(client: APIClient, upload_id: str):
    return client.post(JOBS, {"type": "import", "params": {"upload_id": upload_id}}, format="json")


def run(job_id) -> Job:
    """Run the job as a worker does, in this process."""
    try:
        job_execute(payload={"job_id": str(job_id)}, hostname="test-host")
    except Reject:
        pass  # dead-lettered: the broker copy would go to the DLQ
    return Job.objects.get(id=job_id)


# --- the upload -------------------------------------------------------------------------


def test_an_upload_answers_201_with_its_sha256_and_is_stored_and_audited(api, settings):
    response = upload(api)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["sha256"] == hashlib.sha256(CSV).hexdigest() and body["size"] == len(CSV)
    assert body["content_type"] == "text/csv" and body["name"] == "stock.csv"
    assert response["Location"].endswith(f"{UPLOADS}/{body['id']}")
    row = Upload.objects.get(id=body["id"])
    assert artefact_storage.open(row.file.name).read() == CSV
    assert row.file.name == f"uploads/{row.org_id}/{row.id}"
    assert artefact_storage.path(row.file.name).startswith(settings.MEDIA_ROOT)
    assert row.expires_at - row.created_at == timedelta(hours=24)  # JOBOPS_UPLOAD_TTL
    (entry,) = [e for e in ops_events(UPLOAD_CREATED) if e["upload_id"] == body["id"]]
    assert entry["sha256"] == body["sha256"] and entry["org_id"] == row.org_id
    assert api.get(f"{UPLOADS}/{body['id']}").json() == body


def test_an_oversize_upload_is_413_in_the_envelope_and_nothing_is_stored(api, settings):
    settings.JOBOPS_UPLOAD_MAX_BYTES = 10
    before = stored_uploads()
    response = upload(api)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "ERR-JOB-413"
    assert response.json()["error"]["details"] == {"limit": 10, "size": len(CSV)}
    assert Upload.objects.count() == 0 and stored_uploads() == before


def test_a_body_far_past_the_limit_is_refused_from_its_content_length(api, settings):
    settings.JOBOPS_UPLOAD_MAX_BYTES = 10
    response = upload(api, data=b"x" * (64 * 1024))
    assert response.status_code == 413 and response.json()["error"]["code"] == "ERR-JOB-413"
    assert Upload.objects.count() == 0


def test_a_body_that_is_not_multipart_is_415(api):
    response = api.post(UPLOADS, {"file": "sku,qty"}, format="json")
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "ERR-HTTP-415"
    assert Upload.objects.count() == 0


def test_a_file_of_a_type_not_accepted_is_415_and_nothing_is_stored(api):
    before = stored_uploads()
    response = upload(api, data=b"\x89PNG...", content_type="image/png")
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["code"] == "ERR-HTTP-415" and "content_type" in error["details"]
    assert Upload.objects.count() == 0 and stored_uploads() == before


def test_a_charset_parameter_is_allowed(api):
    response = upload(api, content_type="text/csv; charset=utf-8")
    assert response.status_code == 201 and response.json()["content_type"] == "text/csv"


def test_an_unlabelled_file_is_read_as_its_format_field_or_extension_says(api):
    # The test client labels a part it cannot guess application/octet-stream, as curl does.
    by_name = upload(api, content_type="", name="stock.csv")
    assert by_name.status_code == 201 and by_name.json()["content_type"] == "text/csv"
    by_field = upload(api, content_type="", name="export", format="jsonl")
    assert by_field.status_code == 201
    assert by_field.json()["content_type"] == "application/jsonl"
    unknown = upload(api, content_type="", name="export")
    assert unknown.status_code == 422
    assert unknown.json()["error"]["code"] == "ERR-JOB-422"
    assert "format" in unknown.json()["error"]["details"]
    contradicted = upload(api, content_type="text/csv", format="jsonl")
    assert contradicted.status_code == 422
    assert Upload.objects.count() == 2


def test_an_upload_without_a_file_or_with_an_unknown_field_is_400(api):
    assert api.post(UPLOADS, {}, format="multipart").status_code == 400
    response = upload(api, owner="someone-else")
    assert response.status_code == 400 and "owner" in response.json()["error"]["details"]


def test_an_upload_needs_credentials_and_the_jobs_write_scope():
    assert upload(APIClient()).status_code == 401
    user = UserFactory()
    reader = token_create(user=user, name="ro", scopes=[Scope.JOBS_READ]).key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {reader}")
    refused = upload(client)
    assert refused.status_code == 403
    assert refused.json()["error"]["details"]["required_scope"] == Scope.JOBS_WRITE
    writer = token_create(user=user, name="rw", scopes=[Scope.JOBS_WRITE]).key
    client.credentials(HTTP_AUTHORIZATION=f"Token {writer}")
    assert upload(client).status_code == 201


def test_an_upload_is_readable_only_in_its_organisation(api):
    upload_id = upload(api).json()["id"]
    other = client_for(UserFactory(org=OrganisationFactory()))
    response = other.get(f"{UPLOADS}/{upload_id}")
    assert response.status_code == 404 and response.json()["error"]["code"] == "ERR-JOB-404"
    # Another member of the same organisation sees it: uploads are the organisation's.
    assert client_for(UserFactory()).get(f"{UPLOADS}/{upload_id}").status_code == 200


def test_a_caller_in_several_organisations_names_one():
    user = UserFactory()
    second = OrganisationFactory()
    Membership.objects.create(user=user, organisation=second, role="member")
    client = client_for(user)
    assert upload(client).status_code == 422
    response = upload(client, org=second.slug)
    assert response.status_code == 201
    assert Upload.objects.get(id=response.json()["id"]).org_id == second.id


# --- the import job ---------------------------------------------------------------------


def test_an_import_job_reads_the_upload_and_reports_its_counts(api):
    upload_id = upload(api).json()["id"]
    created = import_job(api, upload_id)
    assert created.status_code == 201, created.json()
    job = run(created.json()["id"])
    assert job.status == "succeeded", (job.last_error_code, job.last_error_message)
    assert job.category == "import_export" and job.queue == "report"
    assert job.result == {
        "upload_id": upload_id,
        "sha256": hashlib.sha256(CSV).hexdigest(),
        "size": len(CSV),
        "format": "csv",
        "records": 3,
        "columns": 2,
        "header": ["sku", "qty"],
    }


def test_an_import_of_json_lines_counts_records_and_names_the_bad_lines(api):
    data = b'{"sku": "A-1"}\n\n{"sku": "B-2"}\nnot json\n[1, 2]\n'
    upload_id = upload(api, data=data, content_type="application/x-ndjson").json()["id"]
    job = run(import_job(api, upload_id).json()["id"])
    assert job.status == "succeeded"
    assert (job.result["format"], job.result["records"]) == ("jsonl", 2)
    assert (job.result["invalid"], job.result["invalid_lines"]) == (2, [4, 5])


def test_an_upload_changed_in_storage_fails_the_import_with_the_checksum_error(api, monkeypatch):
    upload_id = upload(api).json()["id"]
    row = Upload.objects.get(id=upload_id)
    with open(artefact_storage.path(row.file.name), "wb") as stored:
        stored.write(b"sku,qty\nA-1,300\nB-2,5\nC-3,1\n")  # same length, other bytes
    created = import_job(api, upload_id)
    assert created.status_code == 201
    parsed = []
    monkeypatch.setattr("jobs.handlers.imports._count_csv", lambda *a: parsed.append(a))
    job = run(created.json()["id"])
    assert (job.status, job.last_error_code) == ("failed", "UPLOAD_CHECKSUM")
    assert "nothing was read" in job.last_error_message
    assert job.attempts == 1  # non-retryable: failed at once, dead-lettered
    assert parsed == []  # the parser never ran


def test_an_import_naming_another_organisations_upload_is_refused_like_an_unknown_one(api):
    theirs = upload(client_for(UserFactory(org=OrganisationFactory()))).json()["id"]
    unknown = "00000000-0000-4000-8000-000000000000"
    answers = [import_job(api, upload_id) for upload_id in (theirs, unknown)]
    for response in answers:
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "ERR-JOB-422"
    details = [r.json()["error"]["details"] for r in answers]
    assert details[0] == details[1] and "upload_id" in details[0]
    assert not Job.objects.filter(type="import").exists()


def test_an_import_naming_an_expired_upload_is_refused(api):
    upload_id = upload(api).json()["id"]
    Upload.objects.filter(id=upload_id).update(expires_at=timezone.now())
    assert import_job(api, upload_id).status_code == 422


# --- the sweep --------------------------------------------------------------------------


def _expire(upload_id: str, ago: timedelta = timedelta(hours=1)) -> None:
    Upload.objects.filter(id=upload_id).update(expires_at=timezone.now() - ago)


def test_the_purge_sweeps_an_expired_upload_no_job_names_with_its_bytes(
    api, django_capture_on_commit_callbacks
):
    unused, used, fresh = (upload(api).json()["id"] for _ in range(3))
    assert import_job(api, used).status_code == 201
    for upload_id in (unused, used):
        _expire(upload_id)
    name = Upload.objects.get(id=unused).file.name
    assert purge_extras(dry_run=True)["uploads"] == 1
    with django_capture_on_commit_callbacks(execute=True):
        assert purge_extras()["uploads"] == 1
    assert set(Upload.objects.values_list("id", flat=True)) == {
        Upload.objects.get(id=used).id,
        Upload.objects.get(id=fresh).id,
    }
    assert not artefact_storage.exists(name)
    (entry,) = ops_events(UPLOAD_SWEPT)
    assert entry["upload_id"] == unused


def test_an_upload_whose_jobs_were_purged_is_swept_by_the_same_purge(api):
    upload_id = upload(api).json()["id"]
    job = run(import_job(api, upload_id).json()["id"])
    assert job.status == "succeeded"
    _expire(upload_id)
    Job.objects.filter(id=job.id).update(updated_at=timezone.now() - timedelta(days=60))
    out = io.StringIO()
    call_command("purge", "--json", stdout=out)
    assert not Upload.objects.filter(id=upload_id).exists()
    assert not Job.objects.filter(id=job.id).exists()


def test_the_sweep_leaves_an_upload_within_the_grace_after_its_expiry(api):
    upload_id = upload(api).json()["id"]
    _expire(upload_id, ago=timedelta(seconds=10))
    assert purge_extras()["uploads"] == 0
    assert Upload.objects.filter(id=upload_id).exists()


def test_a_batch_checks_each_items_upload_against_that_items_organisation():
    user = UserFactory()  # of the default organisation
    second = OrganisationFactory()
    Membership.objects.create(user=user, organisation=second, role="member")
    client = client_for(user)
    ours = upload(client, org="default").json()["id"]
    theirs = upload(client, org=second.slug).json()["id"]
    items = [(ours, "default"), (ours, second.slug), (theirs, second.slug)]
    body = {
        "jobs": [
            {"type": "import", "params": {"upload_id": upload_id}, "org": org}
            for upload_id, org in items
        ]
    }
    listed = client.post("/api/v1/jobs/batch", body, format="json").json()["results"]
    assert [r["status"] for r in listed] == ["created", "error", "created"], listed
    assert listed[1]["error"]["code"] == "ERR-JOB-422"
    assert "upload_id" in listed[1]["error"]["details"]


def test_an_import_reads_an_upload_stored_in_s3_and_refuses_a_changed_object(s3, api):
    upload_id = upload(api).json()["id"]
    key = Upload.objects.get(id=upload_id).file.name
    assert s3.object_bytes(key) == CSV
    job = run(import_job(api, upload_id).json()["id"])
    assert (job.status, job.result["records"]) == ("succeeded", 3)
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=CSV + b"D-4,9\n")
    job = run(import_job(api, upload_id).json()["id"])
    assert (job.status, job.last_error_code) == ("failed", "UPLOAD_CHECKSUM")


def test_upload_bytes_that_no_row_names_are_swept_once_past_the_grace(api):
    kept = Upload.objects.get(id=upload(api).json()["id"]).file.name
    org_id = Upload.objects.get(file=kept).org_id
    # Bytes of a request that died before its row committed: one old, one in flight.
    old, young = (
        artefact_storage.save(f"uploads/{org_id}/{uuid.uuid4()}", io.BytesIO(b"x"))
        for _ in range(2)
    )
    an_hour_ago = (timezone.now() - timedelta(hours=2)).timestamp()
    for name in (old, kept):
        os.utime(artefact_storage.path(name), (an_hour_ago, an_hour_ago))
    assert upload_orphans_sweep(grace=timedelta(hours=1)) == 1
    assert [artefact_storage.exists(n) for n in (old, young, kept)] == [False, True, True]
