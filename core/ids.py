"""Ids as people read, copy and search them in the operator portal.

Job ids are UUIDv7: the first twelve hex digits are the creation time in milliseconds,
so every job of the same minute begins with the same eight characters. What tells jobs
apart is the random tail; the portal shows its last SHORT_ID_DIGITS hex digits
(`…9f3c7a1b2e4d`, 48 random bits) wherever it shortens an id, and its searches accept
that text, any other suffix or prefix of an id (with or without dashes), or the whole id.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

SHORT_ID_DIGITS = 12
# Fewer hex digits than this are no search for an id: they would match at random.
MIN_FRAGMENT_DIGITS = 4
ELLIPSES = "…."
# The canonical text form's groups (8-4-4-4-12 hex digits), to put a fragment's dashes
# where the stored text has them.
_GROUPS = (8, 4, 4, 4, 12)
_FRAGMENT = re.compile(r"[0-9a-f-]+")


def short_id(value: Any) -> str:
    """What the portal shows of an id: `…` and its last SHORT_ID_DIGITS hex digits."""
    return "…" + str(value)[-SHORT_ID_DIGITS:]


def id_cell(value: Any, url: str | None = None) -> SafeString:
    """The short id in a monospace cell: the whole id in its tooltip, a link to `url`
    when given, and a button that copies the whole id (static/jobops/portal.js)."""
    full = str(value)
    code = format_html('<code class="short-id" title="{}">{}</code>', full, short_id(full))
    if url:
        code = format_html('<a href="{}">{}</a>', url, code)
    return format_html(
        '<span class="id-cell">{}<button type="button" class="copy-id" data-copy="{}" '
        'title="Copy the whole id" aria-label="Copy the whole id {}">copy</button></span>',
        code,
        full,
        full,
    )


@dataclass(frozen=True)
class IdFragment:
    """A part of an id an operator typed: `digits` (lowercase hex, no dashes) that
    begin the id (`start`, a prefix) or end it (`end`, a suffix), or either."""

    digits: str
    start: bool = True
    end: bool = True

    def prefix_range(self) -> tuple[uuid.UUID, uuid.UUID]:
        """The ids that begin with the digits, as a range the primary key can scan
        (uuid order is the order of the hex text)."""
        missing = 32 - len(self.digits)
        return uuid.UUID(self.digits + "0" * missing), uuid.UUID(self.digits + "f" * missing)

    def suffix_text(self) -> str:
        """The digits as the end of the canonical text form, dashes in place."""
        parts, rest = [], self.digits
        for size in reversed(_GROUPS):
            if not rest:
                break
            parts.append(rest[-size:])
            rest = rest[:-size]
        return "-".join(reversed(parts))


def id_fragment(term: str) -> IdFragment | None:
    """The id fragment in a search term, or None when the term is no such thing.

    Accepts dashes anywhere, capitals, surrounding blanks and what the portal shows: a
    leading ellipsis means the end of an id (`…9f3c7a1b2e4d`), a trailing one its
    start; without either the digits may be both. Wants MIN_FRAGMENT_DIGITS to 31 hex
    digits (32 are a whole id, which callers match exactly). Anything else, including
    `%` and `_`, is None, so that no pattern a person typed ever reaches a LIKE.
    """
    text = term.strip().lower()
    core = text.lstrip(ELLIPSES).rstrip(ELLIPSES)
    if len(core) > 36 or not _FRAGMENT.fullmatch(core):
        return None
    digits = core.replace("-", "")
    if not MIN_FRAGMENT_DIGITS <= len(digits) < 32:
        return None
    ends_known = text[0] in ELLIPSES, text[-1] in ELLIPSES
    if all(ends_known):
        return IdFragment(digits)  # `…abcd…`: somewhere; take either end
    return IdFragment(digits, start=not ends_known[0], end=not ends_known[1])


def uuid_or_none(value: Any) -> uuid.UUID | None:
    """`value` as a UUID, or None when it is empty or no UUID (a job id as a broker
    message or an operator gives it: either may be anything)."""
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None
