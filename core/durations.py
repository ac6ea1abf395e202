"""Durations written as configuration writes them: `90d`, `12h`, `30m`, `45s`."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION = re.compile(r"^(?P<count>\d{1,9})(?P<unit>[smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta:
    """`text` as a timedelta: a whole number and one unit (s, m, h, d); ValueError else."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration (a whole number and s, m, h or d: 90d)")
    return timedelta(**{_UNITS[match["unit"]]: int(match["count"])})


def format_duration(value: timedelta) -> str:
    """The shortest `parse_duration` text for `value` (whole seconds)."""
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
