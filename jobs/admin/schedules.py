"""The schedules page: add, edit, enable, disable and remove a schedule, each through
jobs.services.schedules (its checks, its audit entry)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from audit.services import Actor
from core.errors import ApplicationError
from core.forms import BoundedJSONField
from core.times import utc_text
from jobs.admin.filters import OrganisationFilter
from jobs.domain.exceptions import JobParamsInvalidError, JobParamsSecretError
from jobs.models import Schedule
from jobs.services.schedules import (
    schedule_remove,
    schedule_save,
    schedule_set_enabled,
    schedule_validate,
)
from tenants.models import Organisation, Project
from tenants.selectors import operator_org_ids


class ScheduleForm(forms.ModelForm):
    """The schedule's fields, checked by the service's rules (cron, time zone, the
    type's params schema, the owner a member of the organisation) field by field."""

    class Meta:
        model = Schedule
        fields = [
            "name",
            "org",
            "project",
            "owner",
            "job_type",
            "params",
            "cron",
            "timezone",
            "enabled",
        ]
        # Read within the API's bounds: Django's own recursed on 5,000-deep JSON (a 500).
        field_classes = {"params": BoundedJSONField}

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned: dict[str, Any] = self.cleaned_data
        if self.errors:
            return cleaned
        candidate = Schedule(**{name: cleaned.get(name) for name in self.Meta.fields})
        try:
            schedule_validate(candidate)
        except ApplicationError as exc:
            # The params' own refusals (the schema's, a secret's) name paths inside the
            # params: shown on the params field, each with its path.
            on_params = isinstance(exc, JobParamsInvalidError | JobParamsSecretError)
            details = exc.details if isinstance(exc.details, dict) else {}
            if on_params and details:
                self.add_error("params", exc.message)
            for name, problems in details.items():
                field = name if name in self.fields else ("params" if on_params else None)
                for problem in problems if isinstance(problems, list) else [problems]:
                    text = f"{name}: {problem}" if on_params and field != name else str(problem)
                    self.add_error(field, text)
            if not details:
                self.add_error("params" if on_params else None, exc.message)
        else:  # what is saved: the normalised cron, the schema's params
            cleaned.update(cron=candidate.cron, params=candidate.params)
        return cleaned


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Recurring schedules (docs/operator-controls.md#recurring-schedules): created,
    edited, enabled, disabled and removed through jobs.services.schedules, each audited
    on the ops chain. A staff member limited to some organisations sees and makes only
    theirs."""

    form = ScheduleForm
    list_display = [
        "name",
        "org",
        "job_type",
        "cron",
        "timezone",
        "enabled",
        "next_fire",
        "last_fired_at",
        "owner",
    ]
    list_filter = ["enabled", OrganisationFilter]
    search_fields = ["name"]
    list_select_related = ["org", "owner"]
    ordering = ["org__slug", "name"]
    readonly_fields = ["next_fire_at", "last_fired_at"]
    actions = ["enable_schedules", "disable_schedules"]

    @admin.display(description="next fire (UTC)", ordering="next_fire_at")
    def next_fire(self, schedule: Schedule) -> str:
        if schedule.next_fire_at is None:
            return "—"
        return utc_text(schedule.next_fire_at, zone=False)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        schedules = super().get_queryset(request)
        org_ids = operator_org_ids(request.user)
        return schedules if org_ids is None else schedules.filter(org_id__in=org_ids)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        org_ids = operator_org_ids(request.user)
        if org_ids is not None and db_field.name == "org":
            kwargs["queryset"] = Organisation.objects.filter(id__in=org_ids)
        if org_ids is not None and db_field.name == "project":
            kwargs["queryset"] = Project.objects.filter(organisation_id__in=org_ids)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        schedule_save(obj, actor=Actor.operator(request.user), created=not change)

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        schedule_remove(schedule=obj, actor=Actor.operator(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for schedule in queryset:
            schedule_remove(schedule=schedule, actor=Actor.operator(request.user))

    def _set_enabled(self, request: HttpRequest, queryset: QuerySet[Schedule], on: bool) -> None:
        for schedule in queryset:
            schedule_set_enabled(schedule=schedule, enabled=on, actor=Actor.operator(request.user))
        messages.success(
            request, f"{'Enabled' if on else 'Disabled'} {queryset.count()} schedule(s)."
        )

    @admin.action(description="Enable the selected schedules", permissions=["change"])
    def enable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable the selected schedules", permissions=["change"])
    def disable_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._set_enabled(request, queryset, False)
