from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html_join

from audit.admin import ReadOnlyAdmin
from audit.models import AuditLog
from audit.services import Actor
from jobs.models import Artefact, Job
from jobs.services import job_cancel


class ArtefactInline(admin.TabularInline):
    model = Artefact
    fields = ("kind", "name", "size", "sha256", "updated_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Jobs are looked at here; their state changes only through services (actions)."""

    list_display = [
        "id",
        "type",
        "queue",
        "status",
        "progress_percent",
        "attempts",
        "owner",
        "created_at",
    ]
    list_filter = ["status", "type", "queue", "created_at"]
    search_fields = ["=id", "=idempotency_key"]
    list_select_related = ["owner"]
    ordering = ["-created_at"]
    show_full_result_count = False
    inlines = [ArtefactInline]
    actions = ["cancel_jobs"]
    readonly_fields = ["audit_trail"]

    @admin.display(description="Audit trail")
    def audit_trail(self, job: Job) -> str:
        rows = AuditLog.objects.filter(chain=f"job:{job.id}").order_by("seq")
        return format_html_join(
            "\n",
            "<div>#{} {} {} by {}:{}</div>",
            ((e.seq, e.ts.isoformat(), e.event_type, e.actor_type, e.actor_id) for e in rows),
        )

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobs.cancel_job")

    # Django offers, and runs, the action only for users with has_cancel_permission().
    @admin.action(description="Cancel the selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        actor = Actor.user(request.user)
        for job_id in queryset.values_list("id", flat=True):
            job_cancel(job_id=job_id, actor=actor)
        messages.success(request, f"Cancellation requested for {queryset.count()} job(s).")
