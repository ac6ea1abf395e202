"""What the job services refuse, as `ApplicationError`s the API renders (docs/api.md#errors).

Each class names its code and HTTP status; `core.api.exceptions` turns them into the
error envelope and the commands print their messages. The handler-facing taxonomy of
docs/architecture.md (what a handler raises to choose its job's outcome) is `jobs.domain.errors`.
"""

from __future__ import annotations

from typing import Any

from core.errors import ApplicationError


class JobTypeUnknownError(ApplicationError):
    code = "ERR-JOB-400"
    http_status = 400


class BadRequestError(ApplicationError):
    code = "ERR-JOB-400"
    http_status = 400


class IdempotencyKeyInvalidError(ApplicationError):
    code = "ERR-JOB-400"
    http_status = 400


class JobParamsInvalidError(ApplicationError):
    code = "ERR-JOB-422"
    http_status = 422
    default_message = "The job's params do not match its type's schema."


class JobParamsSecretError(ApplicationError):
    """Params that hold a secret (docs/security.md#no-secrets-in-params): a key named in
    JOBOPS_SECRET_PARAM_NAMES, or a value shaped like a private key, a bearer token or an
    AWS access key id. `details` names each JSON path (`params.auth.password`), never
    the value: params travel in the broker message and rest on the job row."""

    code = "ERR-JOB-PARAMS-SECRET"
    http_status = 422
    default_message = (
        "The job's params hold a secret: pass a reference the worker resolves, not the value."
    )


class JobRunAtInvalidError(ApplicationError):
    """A `run_at` out of range (docs/operator-controls.md#scheduled-jobs): more than
    JOBOPS_MAX_SCHEDULE_AHEAD days ahead, or further in the past than the clock-drift
    tolerance."""

    code = "ERR-JOB-422"
    http_status = 422
    default_message = "The job's run_at is out of range."


class JobPriorityInvalidError(ApplicationError):
    """A priority outside 0-9, or above 7 from a caller without staff powers."""

    code = "ERR-JOB-422"
    http_status = 422
    default_message = "A priority above 7 needs staff powers."


class IdempotencyMismatchError(ApplicationError):
    code = "ERR-JOB-IDEMPOTENCY-MISMATCH"
    http_status = 422
    default_message = "This idempotency key was already used with a different type or params."


class JobConflictError(ApplicationError):
    code = "ERR-JOB-409"
    http_status = 409
    default_message = "The job changed concurrently; retry the request."


class PayloadTooLargeError(ApplicationError):
    code = "ERR-JOB-413"
    http_status = 413


class JobNotFoundError(ApplicationError):
    code = "ERR-JOB-404"
    http_status = 404
    default_message = "No such job."


class ArtefactStorageUnavailableError(ApplicationError):
    """The artefact store (the file system or S3) could not be read: nothing changed,
    the download may be retried."""

    code = "ERR-JOB-503"
    http_status = 503
    default_message = "The artefact store cannot be reached; retry shortly."
    retry_after = 5


class JobCancelForbiddenError(ApplicationError):
    code = "ERR-AUTH-403"
    http_status = 403
    default_message = (
        "Cancelling another user's job needs jobs.cancel_job or the admin role of its organisation."
    )


class TransitionRefusedError(JobConflictError):
    """A transition that docs/architecture.md does not allow, or that lost its race."""

    def __init__(self, *, job_id: Any, current: str | None, target: str, reason: str = "") -> None:
        self.job_id, self.current, self.target = job_id, current, target
        message = f"job {job_id}: transition {current} -> {target} refused"
        super().__init__(
            message + (f" ({reason})" if reason else ""),
            details={"job_id": str(job_id), "status": current, "attempted": target},
        )


class JobLost(Exception):
    """A fenced worker write matched no row: the job was reclaimed from under the worker."""


class ScheduleInvalidError(ApplicationError):
    """A recurring schedule that cannot be saved (docs/operator-controls.md#recurring-schedules):
    a bad cron expression, time zone, name, job type or params."""

    code = "ERR-JOB-422"
    http_status = 422
    default_message = "The schedule is not valid."


class ScheduleNotFoundError(ApplicationError):
    code = "ERR-JOB-404"
    http_status = 404
    default_message = "No such schedule."


class JobRetryForbiddenError(ApplicationError):
    code = "ERR-AUTH-403"
    http_status = 403
    default_message = (
        "Retrying another user's job needs jobs.replay_deadletter or the admin role of its "
        "organisation."
    )


class JobRerunForbiddenError(ApplicationError):
    code = "ERR-AUTH-403"
    http_status = 403
    default_message = "Re-running a job needs an operator (jobs.replay_deadletter) who may see it."


class JobInputError(ApplicationError):
    """A bounded input of a job action (a retry's reason, a re-run's justification)."""

    code = "ERR-JOB-400"
    http_status = 400


class QueueNotFoundError(ApplicationError):
    """A queue control named a queue this deployment does not have. Queue controls are
    admin calls: answered in the admin API's codes (docs/api.md#errors)."""

    code = "ERR-DLQ-404"
    http_status = 404
    default_message = "No such queue."


class QueueControlInputError(ApplicationError):
    """A pause or resume the service refuses: no justification, or one too long."""

    code = "ERR-DLQ-422"
    http_status = 422
    default_message = "A justification is required to pause or resume a queue."


class ConnectorNotFoundError(ApplicationError):
    """A breaker control named a connector no job type calls (an admin call: the admin
    API's codes, as the queue controls)."""

    code = "ERR-DLQ-404"
    http_status = 404
    default_message = "No such connector."


class ConnectorControlInputError(ApplicationError):
    """An open or close the service refuses: no justification, or one too long."""

    code = "ERR-DLQ-422"
    http_status = 422
    default_message = "A justification is required to open or close a connector's breaker."


class ErpEventNotFoundError(ApplicationError):
    """An `erp_parked` control named an event id the outbox does not hold (never an
    event, or pruned after it was delivered or discarded). An operator's call: the admin
    API's codes, as the queue controls."""

    code = "ERR-DLQ-404"
    http_status = 404
    default_message = "No such event in the outbox."


class ErpParkedInputError(ApplicationError):
    """A re-drive or discard of parked ERP events the service refuses: an id that is not
    an event id, none named, or a discard without a justification (or one too long)."""

    code = "ERR-DLQ-422"
    http_status = 422
    default_message = "A justification is required to discard a parked ERP event."


class ConnectorOpenError(ApplicationError):
    """A create of a type that opted in (`connector_open: refuse`) while its connector's
    breaker is open or probing (docs/connectors.md): retry after Retry-After."""

    code = "ERR-CONNECTOR-OPEN"
    http_status = 409
    default_message = "The external system this job type calls is failing; retry after Retry-After."

    def __init__(self, *, connector: str, state: str, retry_after: int) -> None:
        super().__init__(
            details={"connector": connector, "state": state, "retry_after": retry_after}
        )
        self.retry_after = retry_after


class UploadNotFoundError(ApplicationError):
    """No such upload, or another organisation's (docs/api.md#uploading-an-input)."""

    code = "ERR-JOB-404"
    http_status = 404
    default_message = "Upload not found."


class UploadMediaTypeError(ApplicationError):
    """The uploaded file's own content type is not one an upload accepts
    (jobs.domain.uploads.UPLOAD_FORMATS)."""

    code = "ERR-HTTP-415"
    http_status = 415


class UploadFormatUnknownError(ApplicationError):
    """An uploaded file that says nothing of its type (unlabelled, no known extension, no
    `format`), or says two different things."""

    code = "ERR-JOB-422"
    http_status = 422


class WebhookInputError(ApplicationError):
    """A webhook endpoint's URL, events or project is not acceptable."""

    code = "ERR-WEBHOOK-422"
    http_status = 422
    default_message = "The webhook endpoint is not acceptable."


class WebhookNotFoundError(ApplicationError):
    code = "ERR-WEBHOOK-404"
    http_status = 404
    default_message = "No such webhook endpoint."


class WebhookForbiddenError(ApplicationError):
    """Only an organisation's admins manage its webhook endpoints."""

    code = "ERR-AUTH-403"
    http_status = 403
    default_message = "Only an admin of the organisation manages its webhooks."
