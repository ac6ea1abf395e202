"""Typed readers for configuration from environment variables.

Each raises ImproperlyConfigured with the variable's name on a bad value, so a
misconfigured deployment fails at start with a message that says what to fix.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from core.durations import parse_duration

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    # NAME_FILE lets secrets come from a mounted file instead of the environment.
    path = os.environ.get(f"{name}_FILE")
    if path:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    # An empty variable counts as unset, so `SECRET_KEY=` falls back to the default
    # (and production refuses that default) instead of running with an empty key.
    return os.environ.get(name) or default


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from exc


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from exc


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_json(name: str, default: Any) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{name} is not valid JSON: {exc}") from exc


def env_durations(name: str, default: dict[str, timedelta]) -> dict[str, timedelta]:
    """`default` with the `key=duration` pairs of a comma-separated variable applied
    (`planning=90d,notification=7d`); a key that `default` lacks is refused."""
    values = dict(default)
    for item in env_list(name, []):
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in values:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not one of {', '.join(values)} = a duration"
            )
        try:
            values[key] = parse_duration(text)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {exc}") from exc
    return values


def env_duration(name: str, default: str) -> timedelta:
    """One duration (`24h`; units s, m, h, d), read as JOBOPS_RETENTION's are."""
    text = env_str(name, default)
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from exc
