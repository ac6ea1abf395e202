"""URLs without their secrets, for error messages, logs and message headers.

A webhook URL often carries its credential (`https://erp.example/hook?token=...`, or
`https://user:pass@host/`), and HTTP client errors repeat the URL they failed on
(`Max retries exceeded with url: /hook?token=...`). What leaves a handler as
`last_error.message`, a log line or a header keeps the scheme, host and path only.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
# A query string after a URL or a path: `?` up to whitespace, a quote or a bracket.
_QUERY = re.compile(r"(?P<head>(?:[a-z][a-z0-9+.\-]*://|/)[^\s?#'\"()<>]*)\?[^\s#'\"()<>]*", re.I)
_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.\-]*://)[^/@\s'\"]+@", re.I)


def redact_url(url: str) -> str:
    """`https://u:p@erp.example/hook?token=x` -> `https://erp.example/hook?***`."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, MASK if parts.query else "", ""))


def redact_urls_in(text: str) -> str:
    """Mask every URL query string and userinfo found in free text."""
    text = _USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text)
    return _QUERY.sub(lambda m: m.group("head") + "?" + MASK, text)
