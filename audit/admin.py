from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditCheckpoint, AuditLog


class ReadOnlyAdmin(admin.ModelAdmin):
    """Audit rows can be looked at, never added, changed or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ["ts", "chain", "seq", "event_type", "actor_type", "actor_id"]
    list_filter = ["event_type", "actor_type"]
    search_fields = ["chain", "job_id"]
    ordering = ["-id"]
    show_full_result_count = False  # counting millions of rows on every page is slow


@admin.register(AuditCheckpoint)
class AuditCheckpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "created_at", "last_audit_id", "key_id"]
    ordering = ["-id"]
