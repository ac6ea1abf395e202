"""Tenancy in the operator portal: organisations (with their projects and members),
service accounts, API tokens and operators' organisations (docs/tenancy.md).

Django's model permissions decide who sees these pages: superusers, or staff given the
tenants permissions; the viewer and operator roles have none. Every change goes
through `tenants.services`, audited on the ops chain as the operator who made it:
suspend, resume and revoke are actions that ask for a confirmation; a token made here
shows its key once, in a message; the digest is never shown nor editable.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.widgets import AdminSplitDateTime
from django.db.models import Count, QuerySet
from django.forms import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from audit.models import ActorType
from audit.services import Actor
from tenants.models import (
    ApiToken,
    Membership,
    OperatorScope,
    Organisation,
    Project,
    Scope,
    ServiceAccount,
)
from tenants.services import (
    TenancyInputError,
    member_add,
    member_remove,
    organisation_create,
    organisation_resume,
    organisation_suspend,
    project_save,
    service_account_create,
    token_create,
    token_revoke,
    token_scopes_check,
)


def operator(request: HttpRequest) -> Actor:
    return Actor(ActorType.OPERATOR, str(request.user.pk))


def confirm_page(
    model_admin: Any,
    request: HttpRequest,
    *,
    action: str,
    items: list[Any],
    question: str,
    consequence: str,
    verb: str,
) -> TemplateResponse:
    opts = model_admin.model._meta
    return TemplateResponse(
        request,
        "admin/tenants/confirm.html",
        {
            **model_admin.admin_site.each_context(request),
            "opts": opts,
            "title": question,
            "question": question,
            "consequence": consequence,
            "verb": verb,
            "action": action,
            "items": items,
            "changelist_url": f"admin:{opts.app_label}_{opts.model_name}_changelist",
        },
    )


# --- organisations --------------------------------------------------------------------


class ProjectInline(admin.TabularInline):
    model = Project
    extra = 0
    fields = ["slug", "name", "created_at"]
    readonly_fields = ["created_at"]
    can_delete = False  # jobs refer to projects (PROTECT)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ["user", "role", "created_at"]
    readonly_fields = ["created_at"]
    raw_id_fields = ["user"]


@admin.register(Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "members", "shared_visibility", "suspended_at", "created_at"]
    list_filter = ["shared_visibility", ("suspended_at", admin.EmptyFieldListFilter)]
    search_fields = ["slug", "name"]
    readonly_fields = ["suspended_at", "created_at"]
    inlines = [ProjectInline, MembershipInline]
    actions = ["suspend", "resume"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Organisation]:
        return super().get_queryset(request).annotate(member_count=Count("memberships"))

    @admin.display(description="members", ordering="member_count")
    def members(self, org: Organisation) -> int:
        return getattr(org, "member_count", 0)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # The slug names the organisation in API bodies and commands: fixed once made.
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "slug"] if obj is not None else fields

    def save_model(self, request: HttpRequest, obj: Organisation, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        made = organisation_create(slug=obj.slug, name=obj.name, actor=operator(request))
        Organisation.objects.filter(pk=made.pk).update(shared_visibility=obj.shared_visibility)
        obj.pk, obj.created_at = made.pk, made.created_at

    def save_formset(
        self, request: HttpRequest, form: Any, formset: BaseInlineFormSet, change: bool
    ) -> None:
        """Members and projects through the services, so that each change is audited."""
        actor = operator(request)
        org = form.instance
        instances = formset.save(commit=False)
        for obj in formset.deleted_objects:
            if isinstance(obj, Membership):
                member_remove(membership=obj, actor=actor)
        for obj in instances:
            if isinstance(obj, Membership):
                member_add(org=org, user=obj.user, role=obj.role, actor=actor)
            elif isinstance(obj, Project):
                obj.organisation = org
                project_save(project=obj, actor=actor)

    def _confirmed(
        self,
        request: HttpRequest,
        queryset: QuerySet[Organisation],
        action: str,
        verb: str,
        consequence: str,
    ) -> list[Organisation] | HttpResponse:
        orgs = list(queryset)
        if request.POST.get("confirm") != "yes":
            return confirm_page(
                self,
                request,
                action=action,
                items=orgs,
                question=f"{verb.capitalize()} {len(orgs)} organisation(s)?",
                consequence=consequence,
                verb=verb,
            )
        return orgs

    @admin.action(description="Suspend the selected organisations", permissions=["change"])
    def suspend(
        self, request: HttpRequest, queryset: QuerySet[Organisation]
    ) -> HttpResponse | None:
        orgs = self._confirmed(
            request,
            queryset,
            "suspend",
            "suspend",
            "Their new jobs are refused (403 ERR-TENANT-SUSPENDED) and their waiting jobs "
            "held until they are resumed.",
        )
        if isinstance(orgs, HttpResponse):
            return orgs
        done = [o.slug for o in orgs if organisation_suspend(org=o, actor=operator(request))]
        messages.success(request, f"Suspended: {', '.join(done) or 'none (all were already)'}.")
        return None

    @admin.action(description="Resume the selected organisations", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Organisation]) -> HttpResponse | None:
        orgs = self._confirmed(
            request,
            queryset,
            "resume",
            "resume",
            "Their held jobs run again and new jobs are accepted.",
        )
        if isinstance(orgs, HttpResponse):
            return orgs
        done = [o.slug for o in orgs if organisation_resume(org=o, actor=operator(request))]
        messages.success(request, f"Resumed: {', '.join(done) or 'none (none was suspended)'}.")
        return None


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "organisation", "created_at"]
    list_filter = ["organisation"]
    search_fields = ["slug", "name", "organisation__slug"]
    list_select_related = ["organisation"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["organisation", "slug", "created_at"] if obj is not None else ["created_at"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # jobs refer to projects (PROTECT)

    def save_model(self, request: HttpRequest, obj: Project, form: Any, change: bool) -> None:
        project_save(project=obj, actor=operator(request))


# --- service accounts and tokens ------------------------------------------------------


class ServiceAccountForm(forms.ModelForm):
    class Meta:
        model = ServiceAccount
        fields = ["organisation", "name"]


@admin.register(ServiceAccount)
class ServiceAccountAdmin(admin.ModelAdmin):
    form = ServiceAccountForm
    list_display = ["name", "organisation", "user", "created_at"]
    list_filter = ["organisation"]
    list_select_related = ["organisation", "user"]
    search_fields = ["name", "organisation__slug"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["organisation", "name", "user", "created_at"] if obj is not None else []

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # its jobs name it; revoke its tokens instead

    def save_model(
        self, request: HttpRequest, obj: ServiceAccount, form: Any, change: bool
    ) -> None:
        if change:
            return  # nothing of it is editable
        made = service_account_create(org=obj.organisation, name=obj.name, actor=operator(request))
        obj.pk, obj.user, obj.created_at = made.pk, made.user, made.created_at


def default_expiry() -> datetime:
    return timezone.now() + settings.JOBOPS_TOKEN_DEFAULT_TTL


class ApiTokenCreateForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices,
        widget=forms.CheckboxSelectMultiple,
        initial=[Scope.JOBS_READ, Scope.JOBS_WRITE, Scope.JOBS_CANCEL],
    )
    expires_at = forms.SplitDateTimeField(
        required=False,
        widget=AdminSplitDateTime,
        initial=default_expiry,
        help_text="Empty: never (prefer an expiry). Default: JOBOPS_TOKEN_DEFAULT_TTL from now.",
    )

    class Meta:
        model = ApiToken
        fields = ["name", "user", "scopes", "expires_at"]

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        user, scopes = cleaned.get("user"), cleaned.get("scopes")
        if user is not None and scopes:
            # The service's rule (admin:dlq for staff only), shown on the form, not a 500.
            try:
                token_scopes_check(user=user, scopes=scopes)
            except TenancyInputError as exc:
                self.add_error("scopes", exc.message)
        return cleaned


CREATE_FIELDS = ["name", "user", "scopes", "expires_at"]
SHOWN_FIELDS = [
    "name",
    "user",
    "prefix",
    "scopes",
    "expires_at",
    "revoked_at",
    "last_used_at",
    "created_at",
]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "user",
        "prefix",
        "scope_list",
        "expires_at",
        "revoked_at",
        "last_used_at",
    ]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), "created_at"]
    list_select_related = ["user"]
    search_fields = ["name", "prefix", "user__username"]
    raw_id_fields = ["user"]
    actions = ["revoke"]
    # The digest never appears: it is no secret, but nothing may be done with it here.
    exclude = ["digest"]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = ApiTokenCreateForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return CREATE_FIELDS
        return SHOWN_FIELDS

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # A token is made, used and revoked: never edited (a new scope is a new token).
        return [] if obj is None else SHOWN_FIELDS

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: the row tells who had what

    @admin.display(description="scopes")
    def scope_list(self, token: ApiToken) -> str:
        return " ".join(token.scopes)

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            return
        issued = token_create(
            user=obj.user,
            name=obj.name,
            scopes=form.cleaned_data["scopes"],
            expires_at=form.cleaned_data["expires_at"],
            actor=operator(request),
        )
        obj.pk = issued.token.pk
        messages.warning(
            request,
            f"The key of {issued.token.prefix}… is {issued.key} — copy it now: it is shown "
            "only once and cannot be read again.",
        )

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> HttpResponse | None:
        tokens = list(queryset.select_related("user"))
        if request.POST.get("confirm") != "yes":
            return confirm_page(
                self,
                request,
                action="revoke",
                items=tokens,
                question=f"Revoke {len(tokens)} token(s)?",
                consequence="Their next request is refused (401); this cannot be undone.",
                verb="revoke",
            )
        done = [t.prefix for t in tokens if token_revoke(token=t, actor=operator(request))]
        messages.success(request, f"Revoked {len(done)} token(s).")
        return None


@admin.register(OperatorScope)
class OperatorScopeAdmin(admin.ModelAdmin):
    list_display = ["user", "organisation_list"]
    list_select_related = ["user"]
    raw_id_fields = ["user"]
    filter_horizontal = ["organisations"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[OperatorScope]:
        return super().get_queryset(request).prefetch_related("organisations")

    @admin.display(description="organisations")
    def organisation_list(self, scope: OperatorScope) -> str:
        return ", ".join(o.slug for o in scope.organisations.all())
