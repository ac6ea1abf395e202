"""`/metrics`: django-prometheus' exporter behind a bearer token (docs/operations/observability.md).

With `METRICS_TOKEN` set, a scrape needs `Authorization: Bearer <token>` (401
otherwise; compared in constant time). Unset (development only: production refuses
to start without it, see config/settings.py) the page is open.

Each scrape first refreshes the gauges derived from the database (the callables of
`JOBOPS_METRICS_REFRESH`: jobs' `metrics_refresh_gauges`); a database outage must not
hide the other metrics, so a failure there is logged and the page still served.
"""

from __future__ import annotations

import hmac
import os
from typing import Any

import structlog
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.module_loading import import_string
from django.views.decorators.cache import never_cache
from django_prometheus.exports import ExportToDjangoView
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess, start_http_server

log = structlog.get_logger("core.metrics")


def _authorized(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    if not token:
        return True
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    # Compare bytes of both values always, so timing says nothing about the token.
    return hmac.compare_digest(
        f"{scheme.lower()} {presented.strip()}".encode(), f"bearer {token}".encode()
    )


@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        response = JsonResponse(
            {
                "error": {
                    "code": "ERR-METRICS-401",
                    "message": "A valid bearer token is required for /metrics.",
                    "details": {},
                }
            },
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    for path in settings.JOBOPS_METRICS_REFRESH:
        try:
            import_string(path)()
        except Exception as exc:
            log.warning("metrics_gauges_refresh_failed", refresh=path, error=repr(exc))
    return ExportToDjangoView(request)


def metrics_registry() -> Any:
    """What one exporter serves: every process of its multiprocess directory, if set."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


def metrics_serve() -> int | None:
    """For processes without a web server (a worker group, a dispatcher): serve
    `/metrics` on JOBOPS_METRICS_PORT (0: off) at JOBOPS_METRICS_ADDR. No token: bind
    it to an address only the scraper reaches. Returns the port, or None when off.

    Metrics never stop the work: a port already in use (another process, a previous
    run not yet gone) or an address this host lacks is a warning, and the process goes
    on without its exporter. Raising here made a dispatcher exit, and its supervisor
    restart it every 30 s: no job was published while the port was held."""
    port = settings.JOBOPS_METRICS_PORT
    addr = settings.JOBOPS_METRICS_ADDR
    if not port:
        return None
    try:
        start_http_server(port, addr=addr, registry=metrics_registry())
    except OSError as exc:
        log.warning(
            "metrics_exporter_unavailable",
            port=port,
            addr=addr,
            error=repr(exc),
            consequence="this process runs on without serving /metrics",
        )
        return None
    log.info("metrics_exporter_started", port=port, addr=addr)
    return port
