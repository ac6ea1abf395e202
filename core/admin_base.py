"""What every jobops admin page shares (the operator portal, docs/operations/portal.md).

`ReadOnlyAdmin`: nothing is added, changed or deleted through the admin's own forms;
state changes go through services, behind actions and pages that ask for their
permission. `render_page` renders a portal page inside the admin's frame.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows can be looked at, never added, changed or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def render_page(
        self, request: HttpRequest, template: str, title: str, context: dict[str, Any]
    ) -> TemplateResponse:
        return TemplateResponse(
            request,
            template,
            {
                **self.admin_site.each_context(request),
                "opts": self.model._meta,
                "title": title,
                "app_label": self.model._meta.app_label,
                **context,
            },
        )
