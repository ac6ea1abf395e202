"""The operator portal (docs/operations/portal.md): Django's admin behind password + OTP, with a
dashboard as its index.

The site composes the apps' pages (config is the top layer): the dashboard reads
`dlq.dashboard`; each app registers its own admin. Third-party tables that must not be
edited from the portal (Celery's task results, OTP devices) are made read-only here,
after every app has registered its admin.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django_otp.admin import OTPAdminSite

from core.admin_base import ReadOnlyAdmin
from dlq.dashboard import dashboard_overview


class JobopsAdminSite(OTPAdminSite):
    site_header = "jobops operations"
    site_title = "jobops"
    index_title = "Dashboard"
    index_template = "admin/jobops/dashboard.html"
    # On a 1366 px laptop the sidebar of every table squeezes the lists to unreadable;
    # the dashboard and the breadcrumbs lead everywhere instead.
    enable_nav_sidebar = False
    site_url = None  # there is no public site to "view"

    def get_urls(self) -> list[URLPattern]:
        panel = path(
            "dashboard/panel/",
            self.admin_view(self.dashboard_panel),
            name="dashboard_panel",
        )
        return [panel, *super().get_urls()]

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {**self._dashboard_context(request), **(extra_context or {})}
        return super().index(request, extra_context=context)

    def dashboard_panel(self, request: HttpRequest) -> HttpResponse:
        """The dashboard's figures alone: what the index page fetches every few seconds."""
        context = {**self.each_context(request), **self._dashboard_context(request)}
        return TemplateResponse(request, "admin/jobops/dashboard_panel.html", context)

    def _dashboard_context(self, request: HttpRequest) -> dict[str, Any]:
        return {
            "overview": dashboard_overview(),
            "refresh_seconds": settings.JOBOPS_PORTAL_REFRESH_SECONDS,
        }


class ReadOnlyThirdPartyAdmin(ReadOnlyAdmin):
    """View only: nobody adds, changes or deletes these from the portal."""


def read_only_admin(model_admin: type[admin.ModelAdmin]) -> type[admin.ModelAdmin]:
    """`model_admin` (its columns, filters, search) made view-only."""
    return type(f"ReadOnly{model_admin.__name__}", (ReadOnlyThirdPartyAdmin, model_admin), {})


class DeviceAdminMixin(ReadOnlyThirdPartyAdmin):
    """OTP devices: superusers may look (who has which device, when it was last used);
    nobody sees or edits a secret here. Devices are enrolled and replaced with
    `manage.py otp_enroll` and `manage.py otp_backup_tokens` on the host."""

    exclude = ("key", "bin_key")
    inlines = ()  # a static device's inline would list its unused backup tokens

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = [f.name for f in self.model._meta.fields if f.name not in ("key", "id")]
        return [(None, {"fields": fields})]

    def get_list_display(self, request: HttpRequest) -> Any:
        return [c for c in super().get_list_display(request) if c != "qrcode_link"]


def lock_down_third_party_admins(site: admin.AdminSite) -> None:
    """Celery results view-only; OTP devices view-only for superusers, hidden otherwise."""
    from django_celery_results.models import GroupResult, TaskResult
    from django_otp.plugins.otp_static.models import StaticDevice
    from django_otp.plugins.otp_totp.models import TOTPDevice

    for model in (TaskResult, GroupResult):
        if site.is_registered(model):
            original = type(site._registry[model])
            site.unregister(model)
            site.register(model, read_only_admin(original))
    for model in (TOTPDevice, StaticDevice):
        if site.is_registered(model):
            original = type(site._registry[model])
            site.unregister(model)
            device_admin = type(f"ReadOnly{original.__name__}", (DeviceAdminMixin, original), {})
            site.register(model, device_admin)
