"""The base of every error a caller of jobops can be told about.

An `ApplicationError` carries a machine-readable `code` and an `http_status`; the API's
one exception handler (`core.api.exceptions`) renders it as the envelope of docs/api.md#errors,
and the management commands print its message. Apps subclass it in their own
`exceptions.py`; nothing here knows about jobs or dead letters.
"""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    code = "ERR-APP"
    http_status = 400
    default_message = "The request could not be processed."
    # Seconds for a Retry-After header (rate limits, backpressure), when set.
    retry_after: int | None = None

    def __init__(self, message: str | None = None, *, details: Any = None) -> None:
        self.message = message or self.default_message
        self.details = details if details is not None else {}
        super().__init__(self.message)

    def one_line(self) -> str:
        """The error for a terminal (a management command): its message, then each
        detail the message does not already say."""
        details = self.details if isinstance(self.details, dict) else {}
        extra = [f"{k}: {v}" for k, v in details.items() if str(v) not in self.message]
        return "; ".join([self.message, *extra])
