"""The job list's filters: type, category, queue, organisation, project, owner, error
code, created (a UTC date range) and whether the job has a dead letter."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest

from core.admin_filters import ChoicesFilter, DateRangeFilter, InputFilter
from jobs.domain.types import primary_queue_names
from jobs.models import DeadLetter, Job
from tenants.models import Project
from tenants.selectors import operator_organisations


class TypeFilter(ChoicesFilter):
    title, parameter_name, field = "type", "type__exact", "type"

    def values(self) -> list[str]:
        return sorted(settings.JOB_TYPES)


class CategoryFilter(ChoicesFilter):
    title, parameter_name, field = "category", "category__exact", "category"

    def values(self) -> list[str]:
        return list(settings.JOB_CATEGORIES)


class QueueFilter(ChoicesFilter):
    title, parameter_name, field = "queue", "queue__exact", "queue"

    def values(self) -> list[str]:
        return primary_queue_names()


class OrganisationFilter(admin.SimpleListFilter):
    """Only the viewer's organisations are offered (their slugs are no one else's
    business); the queryset is limited to them anyway (JobAdmin.get_queryset)."""

    title = "organisation"
    parameter_name = "org"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(o.pk), o.slug) for o in operator_organisations(request.user)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return queryset.filter(org_id=int(value)) if value and value.isdigit() else queryset


class ProjectFilter(admin.SimpleListFilter):
    title = "project"
    parameter_name = "project"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        org_ids = [o.pk for o in operator_organisations(request.user)]
        projects = Project.objects.filter(organisation_id__in=org_ids).select_related(
            "organisation"
        )
        return [(str(p.pk), str(p)) for p in projects]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return queryset.filter(project_id=int(value)) if value and value.isdigit() else queryset


class OwnerFilter(InputFilter):
    title = "owner (username)"
    parameter_name = "owner"
    placeholder = "username"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = (self.value() or "").strip()
        return queryset.filter(owner__username=value) if value else queryset


class ErrorCodeFilter(InputFilter):
    title = "error code"
    parameter_name = "error_code"
    placeholder = "e.g. TIMEOUT"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        # Bounded like the column: a longer value matches nothing (jobs_last_error_code_idx).
        value = (self.value() or "").strip()[:65]
        return queryset.filter(last_error_code=value) if value else queryset


class CreatedFilter(DateRangeFilter):
    title = "created"
    field_name = "created_at"


class HasDeadLetterFilter(admin.SimpleListFilter):
    title = "dead letter"
    parameter_name = "dead_letter"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("open", "open"), ("any", "any, ever"), ("none", "none")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        letters = DeadLetter.objects.filter(job_id=OuterRef("pk"))
        if self.value() == "open":
            return queryset.filter(Exists(letters.filter(state="open")))
        if self.value() == "any":
            return queryset.filter(Exists(letters))
        if self.value() == "none":
            return queryset.filter(~Exists(letters))
        return queryset
