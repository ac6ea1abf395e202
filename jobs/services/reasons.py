"""An operator control's justification (a queue's pause or resume, a connector's breaker,
a parked ERP event's re-drive or discard; docs/operator-controls.md), checked one way:
stripped, required unless the control says otherwise, at most REASON_MAX_CHARS, and
text that stores and shows as it was written (core.json.text_problem). Each control
refuses with its own error (its code and default message are its API's)."""

from __future__ import annotations

from typing import Any

from core.errors import ApplicationError
from core.json import text_problem

# A justification is a sentence or two for the audit log, not a document.
REASON_MAX_CHARS = 500


def control_reason(reason: Any, *, error: type[ApplicationError], required: bool = True) -> str:
    """The stripped justification, or `error` (422) saying what is wrong with it."""
    reason = (reason or "").strip()
    if required and not reason:
        raise error(details={"reason": "required"})
    if len(reason) > REASON_MAX_CHARS:
        raise error(
            f"The justification is longer than {REASON_MAX_CHARS} characters.",
            details={"reason": f"at most {REASON_MAX_CHARS} characters"},
        )
    problem = text_problem(reason)
    if problem:
        raise error(f"The justification {problem}.", details={"reason": problem})
    return str(reason)
