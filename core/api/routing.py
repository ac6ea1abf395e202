"""URL helpers every API area shares."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, path


def with_slash_alias(route: str, view: Any, name: str) -> list[URLPattern]:
    """The route without a slash (named, documented) and its slashed alias."""
    return [path(route, view, name=name), path(route + "/", view)]
