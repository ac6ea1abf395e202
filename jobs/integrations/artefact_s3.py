"""The artefact storage on S3 (ARTEFACT_STORAGE=s3): django-storages' S3 backend, with
each of its calls to S3 timed and its failures counted (docs/operations/observability.md#metrics).

The calls are measured where boto3 makes them, by handlers on the events of the
backend's boto3 session: every request the backend sends (a put is a HEAD for a free
name then a PUT, or the parts of a multipart upload; a read a HEAD then a GET) is one
observation of s3_operation_duration_seconds{operation}, from before it is sent until
its answer, boto3's own retries included. A call that failed also counts in
s3_operation_errors_total{operation,kind}. A presigned URL asks S3 nothing: its
signing is timed as `presign`. The file system's storage is another backend, so it
emits none of these.
"""

from __future__ import annotations

import time
from typing import Any

from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import ConnectTimeoutError, HTTPClientError, ReadTimeoutError
from storages.backends.s3 import S3Storage

from jobs.integrations.metrics import S3_OPERATION_DURATION, S3_OPERATION_ERRORS

# S3's operations (botocore's names) -> the `operation` label: a handful of verbs, so
# that an operation the backend starts using adds no series beyond `other`.
OPERATIONS = {
    "PutObject": "put",
    "GetObject": "get",
    "HeadObject": "head",
    "DeleteObject": "delete",
    "DeleteObjects": "delete",
    "ListObjects": "list",
    "ListObjectsV2": "list",
    "CreateMultipartUpload": "multipart",
    "UploadPart": "multipart",
    "CompleteMultipartUpload": "multipart",
    "AbortMultipartUpload": "multipart",
}
OTHER = "other"
_STARTED = "jobops_s3_started"  # the key of a call's start in botocore's request context


def operation_label(event_name: str) -> str:
    """The `operation` label of a botocore event `<event>.s3.<Operation>`."""
    return OPERATIONS.get(event_name.rsplit(".", 1)[-1], OTHER)


def answer_error_kind(operation: str, status: int) -> str | None:
    """The `kind` of a call S3 answered with `status`; None when it did not fail. A
    HEAD answered 404 is S3 saying the name is free (the backend asks before each put)
    or the object absent (which the caller turns into its own error): an answer, not a
    failing call."""
    if status < 300 or (status == 404 and operation == "head"):
        return None
    if status == 404:
        return "not_found"
    if status == 403:
        return "access_denied"
    return "server_error" if status >= 500 else "client_error"


def exception_error_kind(exc: BaseException) -> str:
    """The `kind` of a call that got no answer from S3: a timeout, the connection
    (refused, closed, TLS), or anything else."""
    if isinstance(exc, ReadTimeoutError | ConnectTimeoutError):
        return "timeout"
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return "connection_error"
    return "error"


def _started(context: dict[str, Any], **_: Any) -> None:
    context[_STARTED] = time.monotonic()


def _observe(event_name: str, context: dict[str, Any], kind: str | None) -> None:
    started = context.pop(_STARTED, None)
    if started is None:  # a call whose start this session did not see
        return
    operation = operation_label(event_name)
    S3_OPERATION_DURATION.labels(operation=operation).observe(time.monotonic() - started)
    if kind is not None:
        S3_OPERATION_ERRORS.labels(operation=operation, kind=kind).inc()


def _answered(event_name: str, http_response: Any, context: dict[str, Any], **_: Any) -> None:
    kind = answer_error_kind(operation_label(event_name), http_response.status_code)
    _observe(event_name, context, kind)


def _failed(event_name: str, exception: BaseException, context: dict[str, Any], **_: Any) -> None:
    _observe(event_name, context, exception_error_kind(exception))


class MeteredS3Storage(S3Storage):  # type: ignore[misc]
    """S3Storage whose boto3 sessions time every call to S3 (the module's docstring)."""

    def _create_session(self) -> Any:
        # The clients the backend makes from this session copy its handlers.
        session = super()._create_session()
        session.events.register("before-call.s3", _started)
        session.events.register("after-call.s3", _answered)
        session.events.register("after-call-error.s3", _failed)
        return session

    def url(self, name: str, *args: Any, **kwargs: Any) -> str:
        started = time.monotonic()
        try:
            url: str = super().url(name, *args, **kwargs)
        except Exception:
            S3_OPERATION_ERRORS.labels(operation="presign", kind="error").inc()
            raise
        finally:
            S3_OPERATION_DURATION.labels(operation="presign").observe(time.monotonic() - started)
        return url
