"""OpenTelemetry tracing, the optional extra `pip install jobops[otel]`.

Off unless the extra is installed AND the standard variables ask for it
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_TRACES_EXPORTER`; `OTEL_SDK_DISABLED=true` wins). The OTLP exporter, the service
name (`OTEL_SERVICE_NAME`, default `jobops-<process>`), sampling and batching all come
from the `OTEL_*` variables, read by the SDK itself.

One trace per job submission: the API request's span (Django instrumentation) ->
`job publish` (this module, also when the dispatcher publishes later: the request's
`traceparent` is stored on the job row) -> Celery's publish span, which puts
`traceparent` into the task headers -> the worker's run span. psycopg statements are
spans of whichever of these runs them. Log lines carry the `trace_id`
(core/logging.py `add_trace_id`).

Each process calls `configure_tracing(<process>)` once: web from config/wsgi.py, each
prefork worker child from `worker_process_init` (the SDK's export thread does not
survive a fork), the dispatcher from `run_dispatcher`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

_STANDARD_SWITCHES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
)
_configured = False


def tracing_enabled() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if not any(os.environ.get(name) for name in _STANDARD_SWITCHES):
        return False
    return importlib.util.find_spec("opentelemetry.sdk") is not None


def configure_tracing(process: str, *, exporter: Any = None) -> bool:
    """Install the tracer provider and the Django, Celery and psycopg instrumentation.

    Idempotent per process; returns whether tracing is on. `exporter` replaces the
    OTLP exporter (tests pass an in-memory one).
    """
    global _configured
    if _configured:
        return True
    if exporter is None and not tracing_enabled():
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    service = os.environ.get("OTEL_SERVICE_NAME") or f"jobops-{process}"
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument(is_sql_commentor_enabled=False)
    CeleryInstrumentor().instrument()
    PsycopgInstrumentor().instrument(enable_commenter=False)
    _configured = True
    return True


def flush_tracing(timeout_millis: int = 5000) -> None:
    """Export what is buffered (a process about to exit, a test about to read)."""
    if not _configured:
        return
    from opentelemetry import trace

    provider: Any = trace.get_tracer_provider()
    provider.force_flush(timeout_millis)


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the active span, to store with a job; None when off."""
    if not _configured:
        return None
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def publish_span(*, traceparent: str | None, job_id: str, job_type: str) -> Iterator[None]:
    """The `job publish` span, a child of the request that created the job.

    Inside it, Celery's instrumentation starts its own publish span and injects it
    into the task headers, so the worker's span becomes its grandchild.
    """
    if not _configured:
        with nullcontext():
            yield
        return
    from opentelemetry import trace
    from opentelemetry.propagate import extract

    parent = extract({"traceparent": traceparent}) if traceparent else None
    tracer = trace.get_tracer("jobops")
    with tracer.start_as_current_span(
        "job publish",
        context=parent,
        kind=trace.SpanKind.PRODUCER,
        attributes={"jobops.job_id": job_id, "jobops.job_type": job_type},
    ):
        yield
