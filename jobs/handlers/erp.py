"""`erp`: POST the job's event to the ERP webhook (JOBOPS_ERP_WEBHOOK_URL, or the `url` of
the provider the `erp` connector's gate chose: docs/connectors.md#providers-and-a-fallback).

`ctx.idempotency_key`, which is the job's id (not the idempotency key a client gave
the job when creating it), travels as `Idempotency-Key` and as the body's `job_id`: it
is the same on every attempt of the job, so a retry after a crash is recognised by the
ERP (docs/architecture.md, the handler context). A re-run is a new job with a new id.

4xx is non-retryable (429 is rate limiting: retryable), 5xx and timeouts are
retryable and count toward the `erp` connector's breaker (docs/connectors.md); a
429's or 503's Retry-After delays the next attempt.
"""

from __future__ import annotations

from typing import Any

import requests  # type: ignore[import-untyped]
from django.conf import settings

from core.redact import redact_urls_in
from jobs.errors import FatalError, NetworkError
from jobs.handlers.http import raise_for_answer
from jobs.integrations.metrics import external_call


def run(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    # A connector with providers: the address of the one its gate chose, if it has one.
    provider = getattr(ctx, "provider", None)
    url = (provider.url if provider is not None else None) or settings.JOBOPS_ERP_WEBHOOK_URL
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
    # 4xx non-retryable (429 retryable), 5xx and timeouts retryable and counted by the
    # `erp` connector's breaker; a 429's or 503's Retry-After sets the next attempt.
    raise_for_answer(response, label="ERP")
    return {"status": response.status_code, "response": response.text[:1000]}
