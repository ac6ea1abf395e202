"""structlog configuration: JSON lines in production, console in dev.

Wired from settings: `LOGGING = logging_config(json=LOG_JSON, level=LOG_LEVEL)` and
`configure_structlog()`. structlog loggers and the standard library's (Django, Celery,
kombu) share one processor chain through `structlog.stdlib.ProcessorFormatter`, so
every line carries a timestamp and a level, the context bound with
`bind_request_context` (request_id, job_id, attempt, ...), and masked secrets.

This module must not import Django settings: settings imports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

MASK = "***"
# A key whose name contains one of these is masked, whatever its value (case-insensitive;
# "csrf_token", "HTTP_AUTHORIZATION", "user_email", "otp_token" all match).
SENSITIVE_KEY_PARTS = (
    "password",
    "passwd",
    "secret",
    "token",
    "authorization",
    "api_key",
    "apikey",
    "cookie",
    "session",
    "email",
    "signing_key",
    "private_key",
)
# Keys that match a part above but are not secret, and that every log line should show.
NOT_SENSITIVE_KEYS = frozenset({"idempotency_key", "session_id_hash"})
# Values masked inside any string (an exception message, a URL, a header dump).
_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}")
_BEARER = re.compile(r"(?i)\b(bearer|token|basic)\s+[A-Za-z0-9._~+/=\-]{6,}")
_URL_PASSWORD = re.compile(r"(?i)([a-z][a-z0-9+.\-]*://[^:/@\s]*:)[^@/\s]+@")


# A deployment's own personal-data fields (LOG_MASK_FIELDS, e.g. "phone,iban"), matched
# like the parts above; set by `configure_masking` from settings.
_extra_sensitive: tuple[str, ...] = ()


def configure_masking(fields: Iterable[str]) -> None:
    global _extra_sensitive
    _extra_sensitive = tuple(f.strip().lower().replace("-", "_") for f in fields if f.strip())


def _sensitive(key: Any) -> bool:
    name = str(key).lower().replace("-", "_")  # "X-Api-Key" -> "x_api_key"
    if name in NOT_SENSITIVE_KEYS:
        return False
    return any(p in name for p in SENSITIVE_KEY_PARTS) or any(p in name for p in _extra_sensitive)


def mask_text(text: str) -> str:
    """Mask e-mail addresses, bearer/basic credentials and URL passwords in a string."""
    text = _EMAIL.sub(MASK, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}@", text)


def mask_value(value: Any, depth: int = 0) -> Any:
    """Mask sensitive keys in nested dicts/lists and sensitive text in strings."""
    if depth > 8:
        return value
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, Mapping):
        return {
            k: MASK if _sensitive(k) and v not in (None, "") else mask_value(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(mask_value(v, depth + 1) for v in value)
    return value


def mask_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: secrets and PII never reach a log line."""
    return {
        key: MASK if _sensitive(key) and value not in (None, "") else mask_value(value)
        for key, value in event_dict.items()
    }


def add_trace_id(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """The active OpenTelemetry span's trace id (core/tracing.py), when tracing is on."""
    if "trace_id" not in event_dict and _otel_trace is not None:
        context = _otel_trace.get_current_span().get_span_context()
        if context.is_valid:
            event_dict["trace_id"] = _otel_trace.format_trace_id(context.trace_id)
    return event_dict


try:  # the optional extra jobops[otel]; without it there is no span to read
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _otel_trace = None  # type: ignore[assignment]


def printable(text: str) -> str:
    """`text` with every character that is not printable (NUL, newline, ESC, a bidi
    override) written as its Python escape, and a backslash doubled, so that what a
    client put in a URL can neither split a console log line, nor drive a terminal,
    nor pass for an escape."""
    if text.isprintable() and "\\" not in text:
        return text  # nearly every path: no copy
    return "".join(
        "\\\\" if c == "\\" else c if c.isprintable() else c.encode("unicode_escape").decode()
        for c in text
    )


def one_line_client_errors(
    _logger: WrappedLogger, _method: str, event_dict: EventDict
) -> EventDict:
    """A refused request (4xx) is one line: its status, path and reason, no traceback.

    Django logs its 403s (PermissionDenied in the portal) and 400s (BadRequest,
    SuspiciousOperation) with the exception attached, so every refusal printed a full
    traceback that buried the real errors. Those are expected answers; a 5xx keeps its
    traceback. The path is the client's (a NUL, a newline in the URL): it is logged
    through `printable`, in the `path` field and in Django's message ("Not Found: ...").
    """
    status = event_dict.get("status_code")
    if not isinstance(status, int):
        return event_dict
    path = getattr(event_dict.get("request"), "path", None)
    if isinstance(path, str):
        shown = printable(path)
        event = event_dict.get("event")
        if shown != path and isinstance(event, str):
            event_dict["event"] = event.replace(path, shown)
        if status < 500:
            event_dict.setdefault("path", shown)
    if status >= 500:
        return event_dict
    exc_info = event_dict.pop("exc_info", None)
    exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if isinstance(exc, BaseException):
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        event_dict["error"] = printable(error)
    return event_dict


def shared_processors() -> list[Processor]:
    """Processors for structlog and stdlib records alike, before masking and rendering."""
    return [
        structlog.contextvars.merge_contextvars,
        add_trace_id,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.UnicodeDecoder(),
    ]


def _drop_formatted_message(
    _logger: WrappedLogger, _method: str, event_dict: EventDict
) -> EventDict:
    """stdlib's formatted `message` repeats `event`; keep one."""
    if event_dict.get("message") == event_dict.get("event"):
        event_dict.pop("message", None)
    return event_dict


def render_chain(*, json: bool) -> list[Processor]:
    """Masking and rendering, last in the chain for both kinds of record.

    JSON: the traceback becomes text first, so that masking covers it too. Console
    (dev): ConsoleRenderer prints the exception itself.
    """
    if json:
        return [
            structlog.processors.format_exc_info,
            mask_secrets,
            structlog.processors.JSONRenderer(),
        ]
    return [
        mask_secrets,
        structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        ),
    ]


def formatter(*, json: bool) -> structlog.stdlib.ProcessorFormatter:
    """The stdlib formatter that renders every record through the shared chain."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            # `extra={...}` of a stdlib call becomes fields, like structlog's keywords.
            structlog.stdlib.ExtraAdder(),
            one_line_client_errors,
            _drop_formatted_message,
            *shared_processors(),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *render_chain(json=json),
        ],
    )


def logging_config(*, json: bool, level: str) -> dict[str, Any]:
    """Django's LOGGING dict: one console handler rendering through structlog."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structlog": {"()": "core.logging.formatter", "json": json},
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structlog"}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # Replace Django's default handlers for "django" (a plain console line in
            # DEBUG, mail_admins): one rendering for everything.
            "django": {"handlers": ["console"], "level": level, "propagate": False},
            # runserver's request lines, rendered like everything else.
            "django.server": {"handlers": ["console"], "level": level, "propagate": False},
            # kombu/amqp debug chatter is not useful at INFO.
            "amqp": {"level": "WARNING"},
        },
    }


def configure_structlog() -> None:
    """structlog hands its event dicts to stdlib logging, which renders them."""
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared_processors(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


# --- context ---------------------------------------------------------------------------
# The fields carried by every line of the current request / task execution.
CONTEXT_KEYS = (
    "request_id",
    "correlation_id",
    "trace_id",
    "job_id",
    "org_id",
    "project_id",
    "idempotency_key",
    "attempt",
    "queue",
    "routing_key",
    "error_code",
)


def bind_request_context(**values: Any) -> None:
    """Bind fields (request_id, job_id, attempt, ...) to every later log line of this
    request, task or thread (structlog contextvars). None values are skipped."""
    structlog.contextvars.bind_contextvars(
        **{k: str(v) if k.endswith("_id") else v for k, v in values.items() if v is not None}
    )


def clear_request_context() -> None:
    """Forget the bound context: call at the start and end of each request or task."""
    structlog.contextvars.clear_contextvars()


@contextmanager
def log_context(**values: Any) -> Iterator[None]:
    """`with log_context(job_id=..., attempt=2):` binds for the block, then restores."""
    with structlog.contextvars.bound_contextvars(
        **{k: str(v) if k.endswith("_id") else v for k, v in values.items() if v is not None}
    ):
        yield
