"""An S3-compatible server for the tests: moto in server mode, a real process over HTTP.

The S3 artefact storage (ARTEFACT_STORAGE=s3, django-storages over boto3) talks to it
exactly as it would to S3, MinIO, Ceph or R2: nothing is mocked in-process.

    with s3_server() as s3:          # the suite shares one: the `s3` fixture
        s3.env()                     # a worker's environment for it (ARTEFACT_*, AWS_*)
        s3.object_bytes(key)         # what the bucket holds, read around jobops
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.polling import wait_for
from tests.processes import Process, free_port

BUCKET = "jobops-test-artefacts"
REGION = "us-east-1"
# moto takes any credentials; boto3 only needs some to sign with.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@dataclass
class S3Server:
    endpoint_url: str
    process: Process
    bucket: str = BUCKET

    def env(self, **overrides: str) -> dict[str, str]:
        """The variables that point a jobops process's artefacts at this server."""
        return {
            "ARTEFACT_STORAGE": "s3",
            "ARTEFACT_S3_BUCKET": self.bucket,
            "ARTEFACT_S3_ENDPOINT_URL": self.endpoint_url,
            "ARTEFACT_S3_REGION": REGION,
            **CREDENTIALS,
            **overrides,
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def object_bytes(self, key: str) -> bytes:
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def keys(self, prefix: str = "") -> list[str]:
        listing = self.client().list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return [item["Key"] for item in listing.get("Contents", [])]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def s3_server(*, port: int | None = None, bucket: str = BUCKET) -> Iterator[S3Server]:
    """moto's server on 127.0.0.1 (`port`, or a free one) with `bucket` created; stopped
    when the block ends."""
    port = port or free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = Process(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        {"PATH": "/usr/bin:/bin", **CREDENTIALS},
        f"moto-{port}",
    )
    try:
        try:
            wait_for(
                lambda: _answers(endpoint + "/moto-api/") or not process.alive(),
                timeout=30,
                what="moto_server to answer",
            )
            assert process.alive(), "moto_server exited at start"
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{process.log_text()[-3000:]}") from None
        server = S3Server(endpoint_url=endpoint, process=process, bucket=bucket)
        server.client().create_bucket(Bucket=bucket)
        yield server
    finally:
        process.stop()
