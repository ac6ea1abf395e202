"""A moment as the portal writes it: to the second, in UTC, saying so."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_text(moment: datetime | None, *, time_only: bool = False, zone: bool = True) -> str:
    """`moment` as "2026-11-29 08:09:16 UTC": "08:09:16 UTC" with `time_only`; without
    " UTC" when `zone` is False, for a column whose header says "(UTC)"; "" for None."""
    if moment is None:
        return ""
    text = moment.astimezone(UTC).strftime("%H:%M:%S" if time_only else "%Y-%m-%d %H:%M:%S")
    return f"{text} UTC" if zone else text
