"""Gunicorn's access log without the health probes (they arrive every few seconds)."""

from __future__ import annotations

from typing import Any

from gunicorn.glogging import Logger

PROBE_PATHS = frozenset({"/healthz", "/readyz"})


class ProbeQuietLogger(Logger):
    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        if environ.get("PATH_INFO") in PROBE_PATHS:
            return
        super().access(resp, req, environ, request_time)
