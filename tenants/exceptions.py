"""What tenancy refuses (docs/api.md#errors)."""

from __future__ import annotations

from core.errors import ApplicationError


class TenantSuspendedError(ApplicationError):
    code = "ERR-TENANT-SUSPENDED"
    http_status = 403
    default_message = "This organisation is suspended: it cannot start new jobs."


class NoOrganisationError(ApplicationError):
    code = "ERR-TENANT-403"
    http_status = 403
    default_message = "You are not a member of any organisation."


class TenantInvalidError(ApplicationError):
    """The organisation or project named is not one the caller may use."""

    code = "ERR-TENANT-422"
    http_status = 422


class ScopeMissingError(ApplicationError):
    code = "ERR-AUTH-403"
    http_status = 403
    default_message = "This token lacks the scope this request needs."
