from __future__ import annotations

import uuid

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from audit.models import AuditCheckpoint, AuditLog, AuditPartitionArchive
from audit.services import OPS_CHAIN, job_chain
from audit.verification import VerificationReport, audit_verify
from core.admin_base import ReadOnlyAdmin


class ChainFilter(admin.SimpleListFilter):
    """The operations chain (pauses, bulk operations, schedules...) or the jobs' chains:
    an operator looking for who paused a queue should not have to type `?chain=ops`.
    Not a plain field filter: that would list every job's chain."""

    title = "chain"
    parameter_name = "chain"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(OPS_CHAIN, "operations (ops)"), ("jobs", "jobs")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditLog]) -> QuerySet[AuditLog]:
        if self.value() == OPS_CHAIN:
            return queryset.filter(chain=OPS_CHAIN)  # audit_chain_seq_uniq serves it
        if self.value() == "jobs":
            return queryset.filter(chain__startswith=job_chain(""))
        return queryset


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ["ts", "chain", "seq", "event_type", "actor_type", "actor_id"]
    list_filter = [ChainFilter, "event_type", "actor_type"]
    search_fields = ["chain", "job_id"]
    ordering = ["-id"]
    show_full_result_count = False  # counting millions of rows on every page is slow
    change_list_template = "admin/audit/auditlog/change_list.html"
    actions = ["verify_selected_chains"]

    def get_urls(self) -> list[URLPattern]:
        # admin_view: staff only, behind the OTP admin site's login.
        verify = path(
            "verify/",
            self.admin_site.admin_view(self.verify_view),
            name="audit_auditlog_verify",
        )
        return [verify, *super().get_urls()]

    def verify_view(self, request: HttpRequest) -> HttpResponse:
        """Run the chain verification (all chains, or one job's) and show the report.

        A GET with ?run=1 runs it; it only reads, so GET is the honest method.
        """
        if not self.has_view_permission(request):
            raise PermissionDenied
        job = (request.GET.get("job") or "").strip()
        report, error = None, None
        if request.GET.get("run"):
            try:
                job_ids = [uuid.UUID(job)] if job else None
            except ValueError:
                error = f"{job!r} is not a job id (UUID)."
            else:
                report = audit_verify(job_ids=job_ids)
        return self._render_report(request, report=report, job=job, error=error)

    @admin.action(description="Verify the chains of the selected rows", permissions=["view"])
    def verify_selected_chains(
        self, request: HttpRequest, queryset: QuerySet[AuditLog]
    ) -> HttpResponse:
        chains = sorted(set(queryset.values_list("chain", flat=True).distinct()))
        report = audit_verify(chains=chains)
        return self._render_report(request, report=report, chains=chains)

    def _render_report(
        self,
        request: HttpRequest,
        *,
        report: VerificationReport | None,
        job: str = "",
        chains: list[str] | None = None,
        error: str | None = None,
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Verify audit chains",
            "report": report,
            "job": job,
            "chains": chains,
            "error": error,
        }
        return TemplateResponse(request, "admin/audit/verify.html", context)


@admin.register(AuditCheckpoint)
class AuditCheckpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "created_at", "last_audit_id", "key_id"]
    ordering = ["-id"]
    exclude = ["payload"]  # may name thousands of heads; the hash and signature cover it


@admin.register(AuditPartitionArchive)
class AuditPartitionArchiveAdmin(ReadOnlyAdmin):
    """The verified archives of audit_logs partitions (docs/operations/audit-archives.md),
    which audit_detach requires: read-only, as every audit table."""

    list_display = ["partition", "file_name", "rows", "verified_at", "key_id", "sha256"]
    ordering = ["-id"]
