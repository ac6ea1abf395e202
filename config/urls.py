from django.contrib import admin
from django.urls import include, path, re_path

from config.apps import discover_admin_pages
from core.api.exceptions import (
    api_handler400,
    api_handler404,
    api_handler500,
    api_not_found_view,
)
from core.api.otp import OtpGrantApi
from core.api.routing import with_slash_alias
from core.metrics import metrics_view
from tenants.authentication import TokenAuthentication

discover_admin_pages()  # before admin.site.urls lists the pages

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("jobs.api.urls")),
    # Admin calls (docs/api.md#admin-calls-and-the-otp-grant): the OTP grant, then the DLQ tools.
    # A grant binds to a token: the tenancy authenticator (ApiTokens and legacy tokens),
    # never a session (core cannot name it: it is a layer above).
    *with_slash_alias(
        "api/v1/admin/otp",
        OtpGrantApi.as_view(authentication_classes=[TokenAuthentication]),
        "admin-otp",
    ),
    path("api/v1/admin/", include("dlq.api.urls")),
    # django-prometheus' exporter behind METRICS_TOKEN (core/metrics.py).
    path("metrics", metrics_view, name="prometheus-django-metrics"),
    # Last: any other /api/ path is a JSON 404 envelope, also with DEBUG on.
    re_path(r"^api/(?P<unmatched>.*)$", api_not_found_view),
]

# Django's own 400/404/500 pages: the JSON envelope for /api/ paths, HTML elsewhere.
handler400 = api_handler400
handler404 = api_handler404
handler500 = api_handler500
