from __future__ import annotations

from core.errors import ApplicationError


class AuditImmutableError(Exception):
    """Raised on any attempt to change or remove an audit row from the application."""


class AuditProofPendingError(ApplicationError):
    """No signed checkpoint names the job's newest audit entry yet: the next one will
    (every AUDIT_CHECKPOINT_SECONDS while something changed)."""

    code = "ERR-AUDIT-PROOF-PENDING"
    http_status = 409
    default_message = (
        "No signed checkpoint covers this job's newest audit entry yet; retry after the "
        "next checkpoint (Retry-After seconds)."
    )

    def __init__(self, *, retry_after: int) -> None:
        super().__init__(details={"retry_after": retry_after})
        self.retry_after = retry_after
