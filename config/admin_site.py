"""The operator portal (docs/operations/portal.md): Django's admin behind password + OTP, with a
dashboard as its index.

The site composes the apps' pages (config is the top layer): the dashboard's figures
come from `config.dashboard`, its templates from `templates/admin/jobops/`; each app
registers its own admin, with its pages' templates in its own `templates/admin/`.
Third-party tables that must not be edited from the portal (Celery's task results, OTP
devices) are made read-only here, after every app has registered its admin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import MaxLengthValidator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django_otp import devices_for_user
from django_otp.admin import OTPAdminAuthenticationForm, OTPAdminSite

from audit.models import AuditLog
from audit.services import Actor
from audit.verification_runs import verification_tile
from config.dashboard import dashboard_overview
from core.admin_base import ReadOnlyAdmin
from core.errors import ApplicationError
from core.otp_devices import verification_wait
from jobs.controls import CONNECTOR_CONTROL, QUEUE_CONTROL, OperatorControl
from jobs.models import Job
from jobs.selectors import ConnectorState, connectors_state, queue_pauses
from tenants.selectors import operator_org_ids, operator_organisations

# The login's bounds (the name's is the user model's: 150). Django's AuthenticationForm
# passes any name to authenticate(), and django-axes stored a failure's name in its
# varchar(255): a longer one answered 500. A value past its bound is a form error before
# any password is checked, so it is no attempt to count and no way around a lockout.
PASSWORD_MAX_CHARS = 4096
OTP_TOKEN_MAX_CHARS = 64


class LoginForm(OTPAdminAuthenticationForm):
    """Password + OTP, as django-otp asks; while every device of the user is throttled
    after wrong codes, the form says how long to wait instead of "invalid token".

    No device choice and no "challenge" button: jobops enrols TOTP devices and static
    backup codes, neither of which sends a challenge, and a code is tried against
    every device of the user (docs/operations/portal.md#signing-in)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self.fields["otp_device"], self.fields["otp_challenge"]
        bounds = {
            "username": self.username_field.max_length or 150,
            "password": PASSWORD_MAX_CHARS,
            "otp_token": OTP_TOKEN_MAX_CHARS,
        }
        for name, limit in bounds.items():
            # AuthenticationForm sets the name's max_length after the field is built,
            # which adds no validator: add one to each.
            field = self.fields[name]
            field.max_length = limit
            field.validators.append(MaxLengthValidator(limit))
            field.widget.attrs["maxlength"] = str(limit)

    def clean_otp(self, user: Any) -> None:
        if user is not None and self.cleaned_data.get("otp_token"):
            wait = verification_wait(devices_for_user(user, confirmed=True))
            if wait is not None:
                raise forms.ValidationError(
                    f"Too many wrong codes in a row: codes are not checked for now, even "
                    f"a correct one. Try again in {wait} second{'s' if wait != 1 else ''}.",
                    code="otp_throttled",
                )
        super().clean_otp(user)


class JobopsAdminSite(OTPAdminSite):
    login_form = LoginForm
    login_template = "admin/jobops/login.html"
    site_header = "jobops operations"
    site_title = "jobops"
    index_title = "Dashboard"
    index_template = "admin/jobops/dashboard.html"
    # On a 1366 px laptop the sidebar of every table squeezes the lists to unreadable;
    # the dashboard and the breadcrumbs lead everywhere instead.
    enable_nav_sidebar = False
    site_url = None  # there is no public site to "view"

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[Any]:
        """The apps' sections, with each model whose admin names a `portal_section` moved
        into that app's (the webhook endpoints of jobs sit under Organisations)."""
        apps = super().get_app_list(request)
        by_label = {app["app_label"]: app for app in apps}
        for app in apps:
            for model in list(app["models"]):
                admin_ = self._registry.get(model["model"])
                target = by_label.get(getattr(admin_, "portal_section", app["app_label"]))
                if target is not None and target is not app:
                    app["models"].remove(model)
                    target["models"].append(model)
        return [
            app
            for app in apps
            if app["models"] and (app_label is None or app["app_label"] == app_label)
        ]

    def get_urls(self) -> list[URLPattern]:
        panel = path(
            "dashboard/panel/",
            self.admin_view(self.dashboard_panel),
            name="dashboard_panel",
        )
        control = path(
            "queues/<str:queue>/<str:action>/",
            self.admin_view(self.queue_control),
            name="queue_control",
        )
        breaker = path(
            "connectors/<str:name>/<str:action>/",
            self.admin_view(self.connector_control),
            name="connector_control",
        )
        return [panel, control, breaker, *super().get_urls()]

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {**self._dashboard_context(request), **(extra_context or {})}
        return super().index(request, extra_context=context)

    def dashboard_panel(self, request: HttpRequest) -> HttpResponse:
        """The dashboard's figures alone: what the index page fetches every few seconds."""
        context = {**self.each_context(request), **self._dashboard_context(request)}
        return TemplateResponse(request, "admin/jobops/dashboard_panel.html", context)

    def queue_control(self, request: HttpRequest, queue: str, action: str) -> HttpResponse:
        """Pause or resume a queue (docs/operator-controls.md#pausing-a-queue). Only an
        operator with jobs.pause_queue who is not limited to some organisations: a pause
        holds every tenant's jobs of the queue."""
        return self._operator_control(
            request,
            QUEUE_CONTROL,
            name=queue,
            verb=action,
            refusal="pausing a queue needs an unrestricted operator",
            done="Queue {name} {done}.",
            page=lambda: {"queue": queue, "pause": queue_pauses().get(queue)},
        )

    def connector_control(self, request: HttpRequest, name: str, action: str) -> HttpResponse:
        """Open or close a connector's breaker (docs/connectors.md). Only an operator with
        jobs.control_connector who is not limited to some organisations: a breaker holds
        every tenant's jobs of its connector."""
        return self._operator_control(
            request,
            CONNECTOR_CONTROL,
            name=name,
            verb=action,
            refusal="opening a breaker needs an unrestricted operator",
            done="Connector {name}'s breaker {done}.",
            title=f"{action.capitalize()} the breaker of connector {name}",
            page=lambda: {"connector": next(s for s in connectors_state() if s.name == name)},
        )

    def _operator_control(
        self,
        request: HttpRequest,
        control: OperatorControl,
        *,
        name: str,
        verb: str,
        refusal: str,
        done: str,
        page: Callable[[], dict[str, Any]],
        title: str | None = None,
    ) -> HttpResponse:
        """One action of a control (jobs.controls): GET asks for the justification, POST
        acts (audited on the ops chain by the service) and goes back to the dashboard
        with `done` said; a refused justification shows the form again with the error.
        `page` is what the control's own template shows of the thing."""
        if verb not in control.verbs or name not in control.names():
            raise Http404(f"no such {control.thing} control")
        if not control.allows(request.user):
            raise PermissionDenied(refusal)
        error = None
        reason = ""
        if request.method == "POST":
            reason = request.POST.get("reason", "")
            action = control.action(verb)
            try:
                action.run(
                    name=name, reason=reason, actor=Actor.operator(request.user), user=request.user
                )
            except ApplicationError as exc:
                error = exc.message
            else:
                messages.success(request, done.format(name=name, done=action.done))
                return HttpResponseRedirect(reverse("admin:index"))
        context = {
            **self.each_context(request),
            "title": title or f"{verb.capitalize()} {control.thing} {name}",
            "thing": control.thing,
            "name": name,
            "action": verb,
            # The first action holds jobs (pause, open): its button says so.
            "holds": verb == control.verbs[0],
            "reason": reason,
            "error": error,
            "reason_max": control.reason_max,
            **page(),
        }
        return TemplateResponse(request, f"admin/jobops/{control.thing}_control.html", context)

    def _dashboard_context(self, request: HttpRequest) -> dict[str, Any]:
        """The figures of the organisation chosen with ?org=<slug> among those the
        staff member may see; by default all of them (for a limited operator, all of
        *theirs*: docs/tenancy.md#operators-and-the-portal)."""
        limited = operator_org_ids(request.user)
        orgs = operator_organisations(request.user)
        chosen = next((o for o in orgs if o.slug == request.GET.get("org")), None)
        if chosen is not None:
            org_ids: tuple[int, ...] | None = (chosen.pk,)
        else:
            org_ids = limited
        overview = dashboard_overview(org_ids=org_ids)
        # Read fresh, beside the cached snapshot: a pause shows at the next refresh, at
        # the top too (on a phone the queue table is below the fold).
        pauses = queue_pauses()
        paused = [
            f"Queue {name} is paused since {pause.paused_at:%H:%M} UTC: nothing of it runs "
            "until it is resumed."
            for name, pause in sorted(pauses.items())
        ]
        # Read fresh too (a row per connector): an open breaker holds jobs of every queue.
        connectors = connectors_state()
        breakers = [
            f"Connector {c.name} is {c.state.replace('_', '-')} {_breaker_cause(c)}: its jobs wait"
            + (f" for the probe at {c.next_probe_at:%H:%M:%S} UTC." if c.state == "open" else ".")
            for c in connectors
            if c.state != "closed"
        ]
        # Read fresh too (two index probes on the ops chain): a run shows when it ends.
        verification = verification_tile()
        stale = []
        if verification["full_stale"]:
            full = verification["full"]
            stale = [
                "The full audit verification has not run for more than 8 days "
                + (f"(last {full['at']:%Y-%m-%d %H:%M} UTC)." if full else "(never).")
            ]
        return {
            "overview": overview,
            "verification": verification,
            "problems": paused + breakers + overview["problems"] + stale,
            "connectors": connectors,
            "can_control_connectors": CONNECTOR_CONTROL.allows(request.user),
            "refresh_seconds": settings.JOBOPS_PORTAL_REFRESH_SECONDS,
            "organisations": orgs,
            "chosen_org": chosen,
            "limited": limited is not None,
            "pauses": pauses,
            "can_pause": QUEUE_CONTROL.allows(request.user),
        }


def _breaker_cause(c: ConnectorState) -> str:
    """Why the breaker is not closed, for the line at the top of the dashboard (on a
    phone the Connectors panel is far below): the operator and their reason, or the
    failures in a row and the last error."""
    if c.manual:
        return f"(by {c.changed_by or 'cli'}: {c.reason})"
    error = f", last {c.last_error_code}" if c.last_error_code else ""
    return f"after {c.failures} failure{'s' if c.failures != 1 else ''} in a row{error}"


def login_locked_out(
    request: HttpRequest, original_response: Any = None, credentials: Any = None
) -> HttpResponse:
    """django-axes' answer to a locked-out login (AXES_LOCKOUT_CALLABLE): the portal's
    page saying how long to wait, 429 with Retry-After."""
    minutes = int(settings.JOBOPS_LOGIN_LOCKOUT_MINUTES)
    context = {**admin.site.each_context(request), "title": "Signing in is paused"}
    context["minutes"] = minutes
    response = TemplateResponse(request, "admin/login_locked_out.html", context, status=429)
    response["Retry-After"] = str(minutes * 60)
    return response.render()


class ReadOnlyThirdPartyAdmin(ReadOnlyAdmin):
    """View only: nobody adds, changes or deletes these from the portal."""


def read_only_admin(model_admin: type[admin.ModelAdmin]) -> type[admin.ModelAdmin]:
    """`model_admin` (its columns, filters, search) made view-only."""
    return type(f"ReadOnly{model_admin.__name__}", (ReadOnlyThirdPartyAdmin, model_admin), {})


class DeviceAdminMixin(ReadOnlyThirdPartyAdmin):
    """OTP devices: superusers may look (who has which device, when it was last used);
    nobody sees or edits a secret here. Devices are enrolled and replaced with
    `manage.py otp_enroll` and `manage.py otp_backup_tokens` on the host."""

    exclude = ("key", "bin_key")
    inlines = ()  # a static device's inline would list its unused backup tokens

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = [f.name for f in self.model._meta.fields if f.name not in ("key", "id")]
        return [(None, {"fields": fields})]

    def get_list_display(self, request: HttpRequest) -> Any:
        return [c for c in super().get_list_display(request) if c != "qrcode_link"]


def lock_down_third_party_admins(site: admin.AdminSite) -> None:
    """Celery results view-only; OTP devices view-only for superusers, hidden otherwise."""
    from django_celery_results.models import GroupResult, TaskResult
    from django_otp.plugins.otp_static.models import StaticDevice
    from django_otp.plugins.otp_totp.models import TOTPDevice

    for model in (TaskResult, GroupResult):
        if site.is_registered(model):
            original = type(site._registry[model])
            site.unregister(model)
            site.register(model, read_only_admin(original))
    for model in (TOTPDevice, StaticDevice):
        if site.is_registered(model):
            original = type(site._registry[model])
            site.unregister(model)
            device_admin = type(f"ReadOnly{original.__name__}", (DeviceAdminMixin, original), {})
            site.register(model, device_admin)


def limit_audit_logs_to_operator_orgs(site: admin.AdminSite) -> None:
    """The audit log's pages for staff limited to some organisations
    (docs/tenancy.md#operators-and-the-portal): the entries of their organisations'
    jobs only (the ops chain, every tenant's, is not theirs), and *Verify chains* only
    for one of those jobs. Here rather than in audit/admin.py: audit sits below the
    tenants and jobs it would have to read."""
    if not site.is_registered(AuditLog):
        return
    original = type(site._registry[AuditLog])

    class OrgLimitedAuditLogAdmin(original):  # type: ignore[valid-type,misc]
        def get_queryset(self, request: HttpRequest) -> Any:
            entries = super().get_queryset(request)
            org_ids = operator_org_ids(request.user)
            if org_ids is None:
                return entries
            return entries.filter(job_id__in=Job.objects.filter(org_id__in=org_ids).values("id"))

        def verify_view(self, request: HttpRequest) -> HttpResponse:
            org_ids = operator_org_ids(request.user)
            if org_ids is not None and request.GET.get("run"):
                job = (request.GET.get("job") or "").strip()
                try:
                    mine = Job.objects.filter(id=job, org_id__in=org_ids).exists()
                except (ValueError, ValidationError):
                    mine = False
                if not mine:  # every chain, or another's job: not theirs to read
                    raise PermissionDenied
            return super().verify_view(request)

    site.unregister(AuditLog)
    site.register(AuditLog, OrgLimitedAuditLogAdmin)
