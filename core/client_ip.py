"""The client's address, for counting failed logins per address."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str | None:
    """REMOTE_ADDR, or the header JOBOPS_CLIENT_IP_HEADER names when a reverse proxy
    sets it. Of a list (X-Forwarded-For) the last entry counts: the one the proxy in
    front of us appended; anything before it the client may have written itself."""
    header = settings.JOBOPS_CLIENT_IP_HEADER
    if header:
        forwarded = request.META.get(header, "")
        last = forwarded.rsplit(",", 1)[-1].strip()
        if last:
            return last[:64]
    return request.META.get("REMOTE_ADDR")
