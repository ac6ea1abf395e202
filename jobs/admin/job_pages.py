"""Job pages of the operator portal: a list with filters and search, and a
detail page laid out for a person. Nothing here edits a job: cancel goes through
`jobs.services` behind a confirmation and the operator's permission; replay is the
dead-letter pages' (dlq/admin/), linked from here."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from audit.services import Actor
from core.admin_base import ReadOnlyAdmin
from core.errors import ApplicationError
from core.ids import id_cell
from core.times import utc_text
from jobs.admin.filters import (
    CategoryFilter,
    CreatedFilter,
    ErrorCodeFilter,
    HasDeadLetterFilter,
    OrganisationFilter,
    OwnerFilter,
    ProjectFilter,
    QueueFilter,
    TypeFilter,
)
from jobs.domain.states import TERMINAL, Status
from jobs.models import Artefact, Job
from jobs.selectors import job_attempts, job_timeline, jobs_search
from jobs.services import job_cancel, job_rerun
from jobs.services.retry import RERUN_SOURCES
from tenants.selectors import operator_org_ids

CANCEL_PERMISSION = "jobs.cancel_job"


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def _actor(request: HttpRequest, job: Job) -> Actor:
    """Who a cancel from the portal is audited as: staff cancelling another's job act
    as an operator; their own job they cancel as its owner."""
    if job.owner_id == request.user.pk:
        return Actor.user(request.user)
    return Actor.operator(request.user)


def _list_time(moment: datetime) -> SafeString:
    """A time in a list column whose header says "(UTC)": the date and the time, each
    kept whole, so that a narrow column wraps between them and nowhere else."""
    day, clock = utc_text(moment, zone=False).split(" ")
    return format_html('<span class="nowrap">{}</span> <span class="nowrap">{}</span>', day, clock)


def cancel_summary(outcomes: list[tuple[str, str]]) -> tuple[str, bool]:
    """What a cancel of many jobs did, in words, and whether it changed anything.

    `outcomes` holds each job's status before the cancel and the status job_cancel
    returned. A job cancelled now moved to `cancelled`; one left running has its flag
    raised and stops at its next check; one that had ended stays as it was (whatever it
    was when the cancel reached it, so a job that finished meanwhile counts as ended).
    """
    now = [after == Status.CANCELLED and before != Status.CANCELLED for before, after in outcomes]
    cancelled = sum(now)
    stopping = sum(1 for _, after in outcomes if after not in TERMINAL)
    ended = Counter(
        after
        for (_, after), cancelled_now in zip(outcomes, now, strict=True)
        if after in TERMINAL and not cancelled_now
    )
    parts = []
    if cancelled:
        parts.append(f"Cancelled {_jobs(cancelled)}")
    if stopping:
        parts.append(
            f"cancel requested for {_jobs(stopping)} already running "
            f"({'it stops' if stopping == 1 else 'they stop'} at the next cancellation check)"
        )
    if ended:
        count = sum(ended.values())
        by_status = ", ".join(f"{n} {status}" for status, n in sorted(ended.items()))
        left = "was left as it is" if count == 1 else "were left as they are"
        parts.append(f"{count} had already ended ({by_status}) and {left}")
    if not parts:
        return "No job was selected.", False
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + ".", bool(cancelled or stopping)


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
    """Jobs are looked at here; their state changes only through services."""

    list_display = [
        "job_link",
        "status_badge",
        "type",
        "category",
        "queue",
        "priority",
        "progress_bar",
        "attempts_of_max",
        "owner",
        "org_project",
        "created",
        "run_at_utc",
    ]
    list_display_links = None
    list_filter = [
        "status",
        OrganisationFilter,
        ProjectFilter,
        TypeFilter,
        CategoryFilter,
        QueueFilter,
        OwnerFilter,
        ErrorCodeFilter,
        CreatedFilter,
        HasDeadLetterFilter,
    ]
    search_fields = ["=id", "=idempotency_key", "=request_id"]
    search_help_text = (
        "A job id: whole, or its start or end (at least 4 hex digits, e.g. what the list "
        "shows); or an idempotency key or a request id (exact); or param:key=value for "
        "jobs whose params hold that value (param:region=eu, param:steps=2, param:a.b=1)."
    )
    list_select_related = ["owner", "org", "project"]
    list_per_page = 50
    ordering = ["-created_at"]
    show_full_result_count = False  # counting a million rows on every page is slow
    show_facets = admin.ShowFacets.NEVER
    inlines = [ArtefactInline]
    actions = ["cancel_jobs"]

    # --- the list ------------------------------------------------------------------

    @admin.display(description="job")
    def job_link(self, job: Job) -> SafeString:
        return id_cell(job.pk, reverse("admin:jobs_job_change", args=[job.pk]))

    @admin.display(description="status", ordering="status")
    def status_badge(self, job: Job) -> SafeString:
        flag = " ⚑" if job.cancel_requested and job.status not in TERMINAL else ""
        return format_html('<span class="badge badge-{}">{}</span>{}', job.status, job.status, flag)

    @admin.display(description="progress")
    def progress_bar(self, job: Job) -> SafeString:
        return format_html(
            '<div class="bar" title="{}%"><span style="width: {}%"></span></div>',
            job.progress_percent,
            job.progress_percent,
        )

    @admin.display(description="organisation / project", ordering="org__slug")
    def org_project(self, job: Job) -> SafeString:
        # One column for both (a project is optional): the list fits a 1440-pixel screen
        # beside its filters, "run at" included.
        if job.project is None:
            return format_html("{}", job.org.slug)
        return format_html('{}<span class="sub">/ {}</span>', job.org.slug, job.project.slug)

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, job: Job) -> SafeString:
        return _list_time(job.created_at)

    @admin.display(description="run at (UTC)", ordering="run_at")
    def run_at_utc(self, job: Job) -> SafeString | str:
        return _list_time(job.run_at) if job.run_at else "—"

    @admin.display(description="attempts")
    def attempts_of_max(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context: dict[str, Any] = {"title": "Jobs", **(extra_context or {})}
        if self.has_cancel_permission(request):
            # "Cancel all matching": the same filters, on the cancel-by-filter page
            # (dlq/admin/operations.py), which counts first and asks for a justification.
            query = request.GET.urlencode()
            context["cancel_matching_url"] = reverse("admin:jobs_cancel_matching") + (
                f"?{query}" if query else ""
            )
        return super().changelist_view(request, context)

    def get_ordering(self, request: HttpRequest) -> list[str]:
        # Filtered to `scheduled`, the list is what runs next: soonest first
        # (jobs_scheduled_due_idx). Any other list: newest first.
        if request.GET.get("status__exact") == Status.SCHEDULED:
            return ["run_at"]
        return list(super().get_ordering(request))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        """Every page of jobs (list, search, actions, detail, artefacts) starts here: a
        staff member limited to some organisations gets only their jobs; another's is
        "not found"."""
        jobs = super().get_queryset(request)
        org_ids = operator_org_ids(request.user)
        return jobs if org_ids is None else jobs.filter(org_id__in=org_ids)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        # Django's own search would put every field in one OR of casts and LIKEs (a
        # 500 on "=id" with a term that is no UUID); jobs_search keeps to the indexes.
        if not search_term.strip():
            return queryset, False
        found = jobs_search(jobs=queryset, term=search_term)
        if found.note:
            messages.warning(request, found.note)
        return found.rows, False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CANCEL_PERMISSION)

    # Offered, and run, only for users with has_cancel_permission(); it asks first.
    @admin.action(description="Cancel the selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        jobs = list(queryset.select_related("owner")[:500])
        if request.POST.get("confirm") != "yes":
            return self.render_page(
                request, "admin/jobs/job/cancel_confirm.html", "Cancel jobs", {"jobs": jobs}
            )
        outcomes = [
            (job.status, job_cancel(job_id=job.id, actor=_actor(request, job)).status)
            for job in jobs
        ]
        summary, changed = cancel_summary(outcomes)
        (messages.success if changed else messages.info)(request, summary)
        return None

    # --- the detail page and its actions ------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<uuid:job_id>/cancel/", wrap(self.cancel_view), name="jobs_job_cancel"),
            path("<uuid:job_id>/live/", wrap(self.live_view), name="jobs_job_live"),
            path("<uuid:job_id>/rerun/", wrap(self.rerun_view), name="jobs_job_rerun"),
            path(
                "<uuid:job_id>/artefacts/<uuid:artefact_id>/",
                wrap(self.artefact_view),
                name="jobs_job_artefact",
            ),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The job for a person: status, progress, attempts (a table of its runs), error,
        result, artefacts, its audit trail as a timeline, its dead letters; and what the
        user may do."""
        if request.method != "GET":
            raise PermissionDenied  # nothing on this page is a form: a job is not edited
        job = self._job_or_404(request, object_id)
        context = {
            **self._live_context(request, job),
            "artefacts": list(job.artefacts.order_by("kind", "name")),
            # With the annotations of its entries by jobs this user may see.
            "timeline": job_timeline(job=job, visible=self.get_queryset(request)),
            "refresh_seconds": settings.JOBOPS_PORTAL_REFRESH_SECONDS,
        }
        return self.render_page(request, "admin/jobs/job/detail.html", f"Job {job.id}", context)

    def live_view(self, request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
        """The changing part of the job's page (status, progress, error, actions)."""
        job = self._job_or_404(request, str(job_id))
        context = self._live_context(request, job)
        return self.render_page(request, "admin/jobs/job/live.html", "", context)

    def _live_context(self, request: HttpRequest, job: Job) -> dict[str, Any]:
        letters = list(job.dead_letters.select_related("resolved_by").order_by("-id"))
        return {
            "job": job,
            "finished": job.status in TERMINAL,
            "dead_letters": letters,
            "open_dead_letter": next((d for d in letters if d.state == "open"), None),
            # As this row knows them: the attempts agree with the status shown above them.
            "attempts": job_attempts(job=job),
            "can_cancel": job.status not in TERMINAL and self.has_cancel_permission(request),
            "can_replay": request.user.has_perm("jobs.replay_deadletter"),
            "can_verify": request.user.has_perm("audit.view_auditlog"),
            "can_rerun": job.status in RERUN_SOURCES
            and request.user.has_perm("jobs.replay_deadletter"),
            # Re-runs of this job (the new jobs that name it), within what the user sees.
            "reruns": list(
                self.get_queryset(request)
                .filter(rerun_of_id=job.id)
                .only("id", "status")
                .order_by("created_at")[:20]
            ),
        }

    def cancel_view(self, request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
        """GET: are you sure? POST: cancel through the service (operator only)."""
        job = self._job_or_404(request, str(job_id))
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            before = job.status
            job = job_cancel(job_id=job.id, actor=_actor(request, job))
            if job.status in TERMINAL and not (
                job.status == Status.CANCELLED and before != Status.CANCELLED
            ):
                messages.info(
                    request, f"The job had already ended ({job.status}) and was left as it is."
                )
            else:
                messages.success(
                    request,
                    f"Cancellation requested: the job is {job.status}"
                    + (" and stops at its next check." if job.status == "running" else "."),
                )
            return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[job.pk]))
        return self.render_page(
            request, "admin/jobs/job/cancel_confirm.html", "Cancel this job?", {"jobs": [job]}
        )

    def rerun_view(self, request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
        """GET: the job and a justification to give; POST: a new job through the
        service (an operator only; the service checks again), then its page."""
        job = self._job_or_404(request, str(job_id))
        if not request.user.has_perm("jobs.replay_deadletter"):
            raise PermissionDenied
        context: dict[str, Any] = {"job": job, "justification": ""}
        if request.method == "POST":
            context["justification"] = request.POST.get("justification", "")
            try:
                new = job_rerun(
                    job_id=job.id,
                    actor_user=request.user,
                    justification=context["justification"],
                )
            except ApplicationError as exc:
                context["error"] = exc.message
            else:
                messages.success(request, f"Re-run as the new job {new.pk}.")
                return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[new.pk]))
        return self.render_page(
            request, "admin/jobs/job/rerun_confirm.html", "Re-run this job?", context
        )

    def artefact_view(
        self, request: HttpRequest, job_id: uuid.UUID, artefact_id: uuid.UUID
    ) -> FileResponse:
        self._job_or_404(request, str(job_id))
        artefact = Artefact.objects.filter(id=artefact_id, job_id=job_id).first()
        if artefact is None:
            raise Http404("No such artefact.")
        try:
            handle = artefact.file.open("rb")
        except FileNotFoundError as exc:
            raise Http404("The artefact's file is missing from storage.") from exc
        return FileResponse(
            handle,
            as_attachment=True,
            filename=artefact.name,
            content_type=artefact.content_type or "application/octet-stream",
        )

    def _job_or_404(self, request: HttpRequest, object_id: str) -> Job:
        self.require_view(request)
        try:
            job = (
                self.get_queryset(request)
                .select_related("owner", "org", "project")
                .filter(pk=uuid.UUID(str(object_id)))
                .first()
            )
        except ValueError:
            job = None
        if job is None:
            raise Http404("No such job.")
        return job
