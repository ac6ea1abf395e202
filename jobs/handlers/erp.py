"""`erp`: POST the job's event to the ERP webhook (JOBOPS_ERP_WEBHOOK_URL).

The job's idempotency key travels as `Idempotency-Key`, so a rerun after a crash is
recognised by the ERP. 4xx is non-retryable (429 is rate limiting: retryable),
5xx and timeouts are retryable.
"""

from __future__ import annotations

from typing import Any

import requests  # type: ignore[import-untyped]
from django.conf import settings

from core.redact import redact_urls_in
from jobs.errors import (
    FatalError,
    JobValidationError,
    NetworkError,
    RateLimitedError,
    TransientExternalError,
    UnauthorizedError,
)
from jobs.metrics import external_call


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    url = settings.JOBOPS_ERP_WEBHOOK_URL
    if not url:
        raise FatalError("JOBOPS_ERP_WEBHOOK_URL is not configured", code="ERP_NOT_CONFIGURED")
    body = {"job_id": str(ctx.job_id), "event": params["event"], "data": params.get("data", {})}
    try:
        with external_call("erp") as call:
            response = requests.post(
                url, json=body, headers={"Idempotency-Key": ctx.idempotency_key}, timeout=(5, 30)
            )
            call.status = response.status_code
    except requests.Timeout as exc:
        raise NetworkError(
            f"ERP timed out: {redact_urls_in(str(exc))}", code="ERP_TIMEOUT"
        ) from exc
    except requests.ConnectionError as exc:
        raise NetworkError(
            f"ERP unreachable: {redact_urls_in(str(exc))}", code="ERP_UNREACHABLE"
        ) from exc
    status = response.status_code
    if status == 429:
        raise RateLimitedError("ERP rate limited the call", code="ERP_429")
    if status in (401, 403):
        raise UnauthorizedError(f"ERP refused: HTTP {status}", code=f"ERP_{status}")
    if 400 <= status < 500:
        raise JobValidationError(f"ERP rejected the event: HTTP {status}", code=f"ERP_{status}")
    if status >= 500:
        raise TransientExternalError(f"ERP failed: HTTP {status}", code=f"ERP_{status}")
    return {"status": status, "response": response.text[:1000]}
