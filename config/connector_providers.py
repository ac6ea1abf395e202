"""A connector's providers in JOBOPS_CONNECTORS (docs/connectors.md#providers-and-a-fallback).

Read once at start-up by config/settings.py: a bad list refuses to start
(ImproperlyConfigured) with the connector and what is wrong, rather than a worker
discovering it on the first job.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ImproperlyConfigured

# As a connector's name; "connector:provider" is the provider's breaker (at most 64,
# the breaker table's key).
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
BREAKER_NAME_MAX = 64
MAX_PROVIDERS = 16
MAX_WEIGHT = 1000
_FIELDS = {"name", "weight", "url"}


def providers_parse(connector: str, providers: Any, fallback: Any) -> list[dict[str, Any]]:
    """`connector`'s `providers` (a list of {"name", "weight", "url"}) and its `fallback`
    (one provider's name, or None), checked: at least one primary provider, names unique,
    weights whole numbers 1-MAX_WEIGHT (default 1), the fallback one of the providers,
    with no weight (it takes every call while the primaries are open). Returns the
    providers in order, each {"name", "weight", "url", "fallback"}."""
    where = f"JOBOPS_CONNECTORS: {connector}"
    if not isinstance(providers, list) or not 1 <= len(providers) <= MAX_PROVIDERS:
        raise ImproperlyConfigured(
            f"{where}.providers: a list of 1-{MAX_PROVIDERS} providers, each "
            '{"name": ..., "weight": 1, "url": ...}'
        )
    if isinstance(fallback, list):
        raise ImproperlyConfigured(
            f"{where}.fallback={fallback!r}: at most one fallback, a provider's name"
        )
    if fallback is not None and not isinstance(fallback, str):
        raise ImproperlyConfigured(f"{where}.fallback={fallback!r}: a provider's name")
    parsed: list[dict[str, Any]] = []
    for entry in providers:
        if not isinstance(entry, dict) or not set(entry) <= _FIELDS or "name" not in entry:
            raise ImproperlyConfigured(
                f"{where}.providers: {entry!r}: each provider is "
                '{"name": ..., "weight": 1, "url": ...} (name required)'
            )
        name = entry["name"]
        if not isinstance(name, str) or not _NAME.match(name):
            raise ImproperlyConfigured(
                f"{where}.providers: name {name!r}: lower-case letters, digits, '_', '.' or '-'"
            )
        if len(connector) + 1 + len(name) > BREAKER_NAME_MAX:
            raise ImproperlyConfigured(
                f"{where}.providers: name {name!r}: '{connector}:{name}' (its breaker) is "
                f"longer than {BREAKER_NAME_MAX} characters"
            )
        if any(p["name"] == name for p in parsed):
            raise ImproperlyConfigured(f"{where}.providers: name {name!r} appears twice")
        is_fallback = name == fallback
        weight = entry.get("weight")
        if is_fallback and weight is not None:
            raise ImproperlyConfigured(
                f"{where}.providers: {name!r} is the fallback: it takes no weight (it "
                "takes the calls while every primary provider's breaker is open)"
            )
        if weight is None:
            weight = 1
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            raise ImproperlyConfigured(
                f"{where}.providers: {name}.weight={weight!r}: a whole number, 1-{MAX_WEIGHT}"
            )
        url = entry.get("url")
        if url is not None and not (
            isinstance(url, str) and url.startswith(("http://", "https://")) and len(url) <= 2000
        ):
            raise ImproperlyConfigured(
                f"{where}.providers: {name}.url: an http(s) URL of at most 2000 characters"
            )
        parsed.append(
            {
                "name": name,
                "weight": 0 if is_fallback else weight,
                "url": url,
                "fallback": is_fallback,
            }
        )
    if fallback is not None and not any(p["fallback"] for p in parsed):
        raise ImproperlyConfigured(
            f"{where}.fallback={fallback!r} is none of its providers "
            f"({', '.join(p['name'] for p in parsed)})"
        )
    if all(p["fallback"] for p in parsed):
        raise ImproperlyConfigured(
            f"{where}.providers: a primary provider besides the fallback {fallback!r}"
        )
    return parsed
