"""Template helpers of the operator portal: badges, ids, durations, JSON for people."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from core import ids
from core.times import utc_text

register = template.Library()


@register.simple_tag
def badge(state: Any, big: bool = False) -> SafeString:
    """A coloured status pill: `{% badge job.status %}`."""
    text = str(state or "unknown")
    size = " big" if big else ""
    return format_html('<span class="badge badge-{}{}">{}</span>', text, size, text)


@register.simple_tag
def id_cell(value: Any, url: str | None = None) -> SafeString:
    """An id as lists show it: `{% id_cell job.pk url %}` (core.ids.id_cell)."""
    return ids.id_cell(value, url)


@register.filter
def short_id(value: Any) -> str:
    """`{{ job.pk|short_id }}`: the part of an id that tells it apart (core.ids)."""
    return ids.short_id(value)


@register.filter
def duration(seconds: Any) -> str:
    """42 s, 3 min 5 s, 2 h 5 min, 3 d 4 h; an em dash when unknown."""
    if seconds is None or seconds == "":
        return "—"
    total = int(float(seconds))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60} s" if total % 60 else f"{total // 60} min"
    if total < 86400:
        return f"{total // 3600} h {total % 3600 // 60} min"
    return f"{total // 86400} d {total % 86400 // 3600} h"


@register.filter
def when(moment: datetime | None, part: str = "") -> str:
    """`{{ job.created_at|when }}`: "2026-11-29 08:09:16 UTC"; `|when:"time"`: "08:09:16
    UTC" (where the date is plain from what stands beside it); "" for None. Every time
    the portal writes goes through here or config/formats: seconds and the zone, always."""
    return utc_text(moment, time_only=part == "time")


@register.filter
def relative(moment: datetime | None) -> str:
    """How far `moment` is from now, for a time shown beside it: "3 min ago", "in 29
    min", "now"; an em dash when unknown. A bare clock time is ambiguous at 3 a.m.
    (today's? yesterday's?); the distance is not."""
    if moment is None:
        return "—"
    seconds = (moment - timezone.now()).total_seconds()
    if abs(seconds) < 1:
        return "now"
    return f"in {duration(seconds)}" if seconds > 0 else f"{duration(-seconds)} ago"


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON, keys sorted; what cannot be encoded is shown as text."""
    if value is None:
        return "null"
    try:
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


@register.filter
def get(mapping: Any, key: Any) -> Any:
    """`mapping|get:key` for keys templates cannot spell (e.g. "x-death")."""
    try:
        return mapping.get(key)
    except AttributeError:
        return None
