"""Organisations → Webhooks in the operator portal (docs/webhooks.md#the-portal).

Staff with the jobs app's webhook permissions (superusers) register endpoints (the
secret shown once, in a message), disable, enable and rotate them (actions), and look at
an endpoint's deliveries with their attempts, where each can be sent again ("redeliver").
Every change goes through jobs.services.webhooks, audited on the ops chain as the
operator who made it.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from audit.models import ActorType
from audit.services import Actor
from core.errors import ApplicationError
from jobs.services.webhooks import (
    EVENT_TYPES,
    webhook_create,
    webhook_redeliver,
    webhook_rotate,
    webhook_set_enabled,
)
from jobs.tables.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tenants.models import Organisation, Project
from tenants.selectors import operator_org_ids

DELIVERIES_SHOWN = 100


def _set_enabled(
    request: HttpRequest, queryset: QuerySet[WebhookEndpoint], *, enabled: bool
) -> int:
    """Enable or disable each selected endpoint (each audited); how many changed."""
    actor = _operator(request)
    return sum(webhook_set_enabled(endpoint=e, enabled=enabled, actor=actor) for e in queryset)


def _operator(request: HttpRequest) -> Actor:
    return Actor(ActorType.OPERATOR, str(request.user.pk))


class WebhookEndpointCreateForm(forms.ModelForm):
    events = forms.MultipleChoiceField(
        choices=[(e, e) for e in EVENT_TYPES], widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["organisation", "project", "url", "events", "description"]


SHOWN = [
    "organisation",
    "project",
    "url",
    "events",
    "description",
    "state",
    "failing_since",
    "last_success_at",
    "last_failure_at",
    "last_error",
    "previous_secret_until",
    "created_by",
    "created_at",
    "deliveries_link",
]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    # Listed with the organisations (config.admin_site.JobopsAdminSite.get_app_list).
    portal_section = "tenants"
    list_display = ["id", "organisation", "url", "event_list", "state", "last_error"]
    list_filter = [("disabled_at", admin.EmptyFieldListFilter), "organisation"]
    list_select_related = ["organisation"]
    search_fields = ["url", "organisation__slug"]
    actions = ["disable", "enable", "rotate"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookEndpoint]:
        # Staff limited to some organisations (an operator scope) see only theirs.
        endpoints = super().get_queryset(request)
        org_ids = operator_org_ids(request.user)
        return endpoints if org_ids is None else endpoints.filter(organisation_id__in=org_ids)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        org_ids = operator_org_ids(request.user)
        if org_ids is not None and db_field.name == "organisation":
            kwargs["queryset"] = Organisation.objects.filter(id__in=org_ids)
        if org_ids is not None and db_field.name == "project":
            kwargs["queryset"] = Project.objects.filter(organisation_id__in=org_ids)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = WebhookEndpointCreateForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return WebhookEndpointCreateForm.Meta.fields if obj is None else SHOWN

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else SHOWN

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # `manage.py webhook remove` or DELETE /api/v1/webhooks/{id}

    @admin.display(description="events")
    def event_list(self, endpoint: WebhookEndpoint) -> str:
        return " ".join(endpoint.events)

    @admin.display(description="state")
    def state(self, endpoint: WebhookEndpoint) -> str:
        if endpoint.enabled:
            return "failing" if endpoint.failing_since else "enabled"
        return f"disabled: {endpoint.disabled_reason}"

    @admin.display(description="deliveries")
    def deliveries_link(self, endpoint: WebhookEndpoint) -> str:
        url = reverse("admin:jobs_webhookendpoint_deliveries", args=[endpoint.pk])
        return format_html('<a href="{}">Deliveries and their attempts</a>', url)

    def save_model(
        self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool
    ) -> None:
        if change:
            return
        issued = webhook_create(
            org=obj.organisation,
            url=obj.url,
            events=form.cleaned_data["events"],
            project=obj.project.slug if obj.project else None,
            description=obj.description,
            actor=_operator(request),
            created_by=request.user.get_username(),
        )
        obj.pk = issued.endpoint.pk
        messages.warning(
            request,
            f"The secret of endpoint {obj.pk} is {issued.secret} — copy it now: it is shown "
            "only once.",
        )

    def save_form(self, request: HttpRequest, form: Any, change: bool) -> Any:
        return form.save(commit=False)

    def add_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().add_view(request, *args, **kwargs)
        except ApplicationError as exc:
            messages.error(request, exc.one_line())
            return HttpResponseRedirect(request.path)

    @admin.action(description="Disable the selected endpoints", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        done = _set_enabled(request, queryset, enabled=False)
        messages.info(request, f"{done} endpoint(s) disabled; their deliveries wait.")

    @admin.action(description="Enable the selected endpoints", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        done = _set_enabled(request, queryset, enabled=True)
        messages.info(request, f"{done} endpoint(s) enabled; their waiting deliveries go now.")

    @admin.action(description="Rotate the selected endpoints' secrets", permissions=["change"])
    def rotate(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            issued = webhook_rotate(endpoint=endpoint, actor=_operator(request))
            messages.warning(
                request,
                f"The new secret of endpoint {endpoint.pk} is {issued.secret} — copy it now.",
            )

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:endpoint_id>/deliveries/",
                wrap(self.deliveries_view),
                name="jobs_webhookendpoint_deliveries",
            ),
            *super().get_urls(),
        ]

    def deliveries_view(self, request: HttpRequest, endpoint_id: int) -> HttpResponse:
        """An endpoint's latest deliveries with their attempts; POST `redeliver` (a
        delivery id) sends one again, audited with the operator's name."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        endpoint = get_object_or_404(self.get_queryset(request), pk=endpoint_id)
        if request.method == "POST":
            if not self.has_change_permission(request, endpoint):
                raise PermissionDenied
            try:
                delivery_id = int(request.POST.get("redeliver", ""))
            except ValueError:
                messages.error(request, "Name a delivery to send again.")
            else:
                done = webhook_redeliver(
                    endpoint=endpoint, delivery_ids=[delivery_id], actor=_operator(request)
                )
                messages.info(request, f"{done} delivery queued again.")
            return HttpResponseRedirect(request.path)
        deliveries = list(
            WebhookDelivery.objects.filter(endpoint=endpoint).order_by("-id")[:DELIVERIES_SHOWN]
        )
        attempts: dict[int, list[WebhookAttempt]] = {}
        for attempt in WebhookAttempt.objects.filter(delivery__in=deliveries).order_by("at"):
            attempts.setdefault(attempt.delivery_id, []).append(attempt)
        return TemplateResponse(
            request,
            "admin/jobs/webhookendpoint/deliveries.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.model._meta,
                "title": f"Deliveries of webhook {endpoint.pk}",
                "endpoint": endpoint,
                "rows": [(d, attempts.get(d.id, [])) for d in deliveries],
                "can_redeliver": self.has_change_permission(request, endpoint),
            },
        )
