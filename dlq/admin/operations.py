"""Background operations (a bulk replay, discard or cancel): their progress, which
refreshes itself, and Stop; and the job list's "cancel all matching", which may start
one."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from core.admin_base import ReadOnlyAdmin
from core.errors import ApplicationError
from core.ids import id_cell
from dlq.bulk import bulk_operation_stop
from dlq.models import BulkOperation, BulkState
from dlq.selectors import bulk_operation_get
from dlq.services.cancel import CANCEL_PERMISSION, jobs_cancel_by_filter
from dlq.services.selection import PERMISSIONS
from jobs.selectors import JobFilterError, job_filter_from_list
from tenants.selectors import operator_org_ids


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnlyAdmin):
    list_display = [
        "operation_link",
        "state_badge",
        "action",
        "queue",
        "progress",
        "requested_by",
        "created_at",
    ]
    list_display_links = None
    list_filter = ["state", "action"]
    list_select_related = ["requested_by"]
    ordering = ["-created_at"]
    show_facets = admin.ShowFacets.NEVER

    def get_queryset(self, request: HttpRequest) -> QuerySet[BulkOperation]:
        # A limited operator sees their own operations only (dlq.selectors.bulk_operation_visible).
        operations = super().get_queryset(request)
        if operator_org_ids(request.user) is None:
            return operations
        return operations.filter(requested_by=request.user)

    @admin.display(description="operation")
    def operation_link(self, op: BulkOperation) -> SafeString:
        return id_cell(op.pk, reverse("admin:dlq_bulkoperation_change", args=[op.pk]))

    @admin.display(description="state")
    def state_badge(self, op: BulkOperation) -> SafeString:
        return format_html('<span class="badge badge-{}">{}</span>', op.state, op.state)

    @admin.display(description="progress")
    def progress(self, op: BulkOperation) -> str:
        return f"{op.processed}/{op.total} ({op.percent}%)"

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path(
                "<uuid:operation_id>/panel/", wrap(self.panel_view), name="dlq_bulkoperation_panel"
            ),
            path("<uuid:operation_id>/stop/", wrap(self.stop_view), name="dlq_bulkoperation_stop"),
            path("cancel-jobs/", wrap(self.cancel_matching_view), name="jobs_cancel_matching"),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return self._page(request, object_id, "admin/dlq/bulkoperation/detail.html")

    def panel_view(self, request: HttpRequest, operation_id: uuid.UUID) -> HttpResponse:
        return self._page(request, str(operation_id), "admin/dlq/bulkoperation/panel.html")

    def stop_view(self, request: HttpRequest, operation_id: uuid.UUID) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseRedirect(
                reverse("admin:dlq_bulkoperation_change", args=[operation_id])
            )
        try:
            operation = bulk_operation_get(operation_id=operation_id, user=request.user)
        except ApplicationError as exc:
            raise Http404(exc.message) from exc
        if not request.user.has_perm(PERMISSIONS[operation.action]):
            raise PermissionDenied
        was_active = operation.active
        operation = bulk_operation_stop(operation_id=operation.id, actor_user=request.user)
        done = f"{operation.processed} of {operation.total} {operation.subject}s handled"
        if operation.state == BulkState.RUNNING:
            messages.warning(
                request, f"Stop requested; the {operation.action} ends before its next chunk."
            )
        elif was_active and operation.state == BulkState.STOPPED:
            messages.warning(request, f"The {operation.action} is stopped ({done}).")
        else:  # it had ended before the stop arrived: the stop changed nothing
            messages.info(
                request,
                f"The {operation.action} had already finished ({operation.state}, {done}); "
                "nothing was changed.",
            )
        return HttpResponseRedirect(reverse("admin:dlq_bulkoperation_change", args=[operation.pk]))

    def cancel_matching_view(self, request: HttpRequest) -> HttpResponse:
        """The job list's "cancel all matching": GET counts (a dry run) and asks for a
        justification; POST cancels (now, or as a background operation when large)."""
        if not request.user.has_perm(CANCEL_PERMISSION):
            raise PermissionDenied
        list_url = reverse("admin:jobs_job_changelist")
        query = request.GET.urlencode()
        try:
            filters = job_filter_from_list(request.GET)
        except JobFilterError as bad:
            messages.error(request, f"Cannot cancel by this filter: {bad}")
            return HttpResponseRedirect(f"{list_url}?{query}")
        limited = operator_org_ids(request.user)
        if filters.org_id is not None and limited is not None and filters.org_id not in limited:
            raise Http404("No such organisation.")
        error = None
        if request.method == "POST":
            try:
                outcome = jobs_cancel_by_filter(
                    actor_user=request.user,
                    filters=filters,
                    justification=request.POST.get("justification", ""),
                )
            except ApplicationError as exc:
                error = exc.message
            else:
                if isinstance(outcome, BulkOperation):
                    messages.success(request, f"Cancelling {outcome.total} jobs in the background.")
                    return HttpResponseRedirect(
                        reverse("admin:dlq_bulkoperation_change", args=[outcome.pk])
                    )
                messages.success(
                    request,
                    f"Cancelled {outcome.cancelled} jobs; cancel requested for "
                    f"{outcome.cancel_requested} running; {outcome.already_ended} had ended.",
                )
                return HttpResponseRedirect(f"{list_url}?{query}")
        dry = jobs_cancel_by_filter(actor_user=request.user, filters=filters, dry_run=True)
        context = {
            "filters": filters.describe(),
            "limited": limited is not None,
            "dry": dry,
            "error": error,
            "back_url": f"{list_url}?{query}",
            "threshold": settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD,
        }
        return self.render_page(
            request,
            "admin/dlq/bulkoperation/cancel_matching.html",
            "Cancel all matching jobs",
            context,
        )

    def _page(self, request: HttpRequest, object_id: str, template: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            operation = bulk_operation_get(operation_id=object_id, user=request.user)
        except ApplicationError as exc:
            raise Http404(exc.message) from exc
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Background {operation.action}",
            "op": operation,
            "can_stop": operation.active and request.user.has_perm(PERMISSIONS[operation.action]),
            "refresh_seconds": settings.JOBOPS_PORTAL_REFRESH_SECONDS,
        }
        return TemplateResponse(request, template, context)
