"""The dead-letter pages (docs/operations/portal.md#pages): the DLQ overview, the list
and its groups, peek, and replay or discard of one, selected or all matching a filter
(a dry-run count and a sample first, a required justification, then the work)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from core.admin_base import ReadOnlyAdmin
from core.errors import ApplicationError
from core.forms import FormJSONError, error_lines, json_from_form
from core.ids import id_cell
from dlq.admin.filters import (
    AgeFilter,
    DlqFilter,
    ErrorCodeFilter,
    ReasonFilter,
    RetryableFilter,
    StateFilter,
    age_bounds,
)
from dlq.broker import BROKER_ERRORS, dlq_depths, dlq_peek
from dlq.bulk import dead_letters_act
from dlq.models import BulkOperation
from dlq.selectors import (
    dead_letter_groups,
    dead_letters_for_messages,
    dead_letters_in_orgs,
    dead_letters_search,
    death_summary,
    dlq_overview,
    messages_in_orgs,
)
from dlq.services.fix_forward import (
    diff_rows,
    fix_forward_approve,
    fix_forward_preview,
    fix_forward_reject,
    fix_forward_request,
)
from dlq.services.selection import PERMISSIONS, names_rows
from jobs.integrations.topology import dlq_has_broker_copy, dlq_names
from jobs.models import DeadLetter, DeadLetterState, ParamsEditState
from tenants.selectors import operator_org_ids

ACTIONS = ("replay", "discard")
# What the peek page says of a queue the postgres executor runs.
NO_BROKER_DLQ = (
    "No broker DLQ: this queue runs on the postgres executor, and its dead letters are the "
    "database rows (the dead letters page lists them; replay and discard work the same)."
)
# The list's filters that are also a replay/discard selection (same names both places).
SELECTION_PARAMS = ("queue", "reason", "error_code", "retryable", "age", "state")


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = [
        "row_link",
        "state_badge",
        "queue",
        "reason",
        "error_code",
        "job_link",
        "recorded",
        "broker_copy",
    ]
    list_display_links = None
    list_filter = [
        StateFilter,
        DlqFilter,
        ReasonFilter,
        ErrorCodeFilter,
        AgeFilter,
        RetryableFilter,
    ]
    list_select_related = ["resolved_by"]
    search_fields = ["=job__id", "=message_id"]
    search_help_text = (
        "A job id: whole, or its start or end (at least 4 hex digits, e.g. what the list "
        "shows); or a broker message id (exact)."
    )
    ordering = ["-created_at", "-id"]
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    change_list_template = "admin/jobs/deadletter/change_list.html"
    change_form_template = "admin/jobs/deadletter/detail.html"
    actions = ["replay_selected", "discard_selected"]
    readonly_fields = [f.name for f in DeadLetter._meta.fields]

    def get_queryset(self, request: HttpRequest) -> QuerySet[DeadLetter]:
        """Every dead-letter page (list, search, groups, actions, detail) starts here: a
        staff member limited to some organisations sees only rows of their jobs."""
        rows = super().get_queryset(request)
        return dead_letters_in_orgs(rows, org_ids=operator_org_ids(request.user))

    @admin.display(description="#")
    def row_link(self, row: DeadLetter) -> SafeString:
        return format_html(
            '<a href="{}">{}</a>', reverse("admin:jobs_deadletter_change", args=[row.pk]), row.pk
        )

    @admin.display(description="recorded (UTC)", ordering="created_at")
    def recorded(self, row: DeadLetter) -> str:
        return row.created_at.strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="state", ordering="state")
    def state_badge(self, row: DeadLetter) -> SafeString:
        return format_html('<span class="badge badge-{}">{}</span>', row.state, row.state)

    @admin.display(description="job")
    def job_link(self, row: DeadLetter) -> SafeString | str:
        if row.job_id is None:
            return "—"
        return id_cell(row.job_id, reverse("admin:jobs_job_change", args=[row.job_id]))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[DeadLetter], search_term: str
    ) -> tuple[QuerySet[DeadLetter], bool]:
        if not search_term.strip():
            return queryset, False
        found = dead_letters_search(rows=queryset, term=search_term)
        if found.note:
            messages.warning(request, found.note)
        return found.rows, False

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        edits = []
        if object_id.isdigit():
            # Fix-forward edits of this row (the queryset limits the row to the user's
            # organisations; the edits belong to it).
            row = self.get_queryset(request).filter(pk=int(object_id)).first()
            if row is not None:
                edits = [
                    {"edit": e, "diff": diff_rows(e.old_params, e.new_params, e.changed_paths)}
                    for e in row.params_edits.select_related(
                        "requested_by", "approved_by", "rejected_by"
                    ).order_by("-id")
                ]
        context = {
            **(extra_context or {}),
            "can_replay": self.has_replay_permission(request),
            "can_discard": self.has_discard_permission(request),
            "params_edits": edits,
            "requested_state": ParamsEditState.REQUESTED,
        }
        return super().change_view(request, object_id, form_url, context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = {"title": "Dead letters", **(extra_context or {})}
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context and "cl" in context:
            selection = {k: str(v) for k, v in request.GET.items() if k in SELECTION_PARAMS}
            context.update(
                groups=dead_letter_groups(rows=context["cl"].queryset),
                selection_query=urlencode(selection),
                selection=selection,
                can_replay=request.user.has_perm(PERMISSIONS["replay"]),
                can_discard=request.user.has_perm(PERMISSIONS["discard"]),
                # Replay/discard of a whole group, queue or filter: unrestricted only.
                can_act_wide=operator_org_ids(request.user) is None,
            )
        return response

    # --- actions on the list: to the dry-run page with the rows chosen --------------------

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSIONS["replay"])

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSIONS["discard"])

    @admin.action(description="Replay the selected dead letters…", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> Any:
        return self._to_action("replay", queryset)

    @admin.action(description="Discard the selected dead letters…", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> Any:
        return self._to_action("discard", queryset)

    def _to_action(self, action: str, queryset: QuerySet[DeadLetter]) -> HttpResponseRedirect:
        ids = ",".join(str(i) for i in queryset.values_list("id", flat=True)[:1000])
        url = reverse("admin:jobs_deadletter_action", args=[action])
        return HttpResponseRedirect(f"{url}?{urlencode({'ids': ids})}")

    # --- pages ------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("queues/", wrap(self.queues_view), name="jobs_deadletter_queues"),
            path("queues/panel/", wrap(self.queues_panel), name="jobs_deadletter_queues_panel"),
            path("peek/<str:queue>/", wrap(self.peek_view), name="jobs_deadletter_peek"),
            path("<str:action>/run/", wrap(self.action_view), name="jobs_deadletter_action"),
            path(
                "<int:dead_letter_id>/fix-forward/",
                wrap(self.fix_forward_view),
                name="jobs_deadletter_fix_forward",
            ),
            path(
                "params-edits/<int:edit_id>/<str:decision>/",
                wrap(self.params_edit_decide_view),
                name="jobs_deadletter_params_edit_decide",
            ),
            *super().get_urls(),
        ]

    def queues_view(self, request: HttpRequest) -> HttpResponse:
        return self.render_page(
            request,
            "admin/jobs/deadletter/queues.html",
            "Dead-letter queues",
            self._queues(request),
        )

    def queues_panel(self, request: HttpRequest) -> HttpResponse:
        return self.render_page(
            request, "admin/jobs/deadletter/queues_panel.html", "", self._queues(request)
        )

    def _queues(self, request: HttpRequest) -> dict[str, Any]:
        self.require_view(request)
        org_ids = operator_org_ids(request.user)
        return {
            "queues": dlq_overview(org_ids=org_ids),
            "limited": org_ids is not None,
            "refresh_seconds": settings.JOBOPS_PORTAL_REFRESH_SECONDS,
            "can_replay": self.has_replay_permission(request),
            "can_discard": self.has_discard_permission(request),
            "generated_at": timezone.now(),
        }

    def peek_view(self, request: HttpRequest, queue: str) -> HttpResponse:
        """A DLQ's first messages with what they say and their rows; nothing consumed."""
        self.require_view(request)
        if queue not in dlq_names():
            raise Http404(f"{queue!r} is not a dead-letter queue.")
        try:
            limit = max(1, min(100, int(request.GET.get("limit") or 20)))
        except ValueError:
            limit = 20
        error, found, depth = None, [], None
        messages_ = []
        if not dlq_has_broker_copy(queue):
            error = NO_BROKER_DLQ
        else:
            try:
                depth = dlq_depths(queues=[queue]).get(queue)
                messages_ = dlq_peek(queue=queue, limit=limit)
            except BROKER_ERRORS as exc:
                error = f"RabbitMQ cannot be reached: {exc}"
        # A limited operator sees only the messages of their organisations' jobs, and
        # not the depth (it counts every tenant's messages).
        org_ids = operator_org_ids(request.user)
        if org_ids is not None:
            depth = None
        messages_ = messages_in_orgs(messages_, org_ids=org_ids)
        rows = dead_letters_for_messages(messages_, org_ids=org_ids)
        for message in messages_:
            found.append(
                {"m": message, "death": death_summary(message), "rows": rows[message.message_id]}
            )
        context = {
            "queue": queue,
            "limit": limit,
            "depth": depth,
            "messages_found": found,
            "error": error,
            "limited": org_ids is not None,
        }
        return self.render_page(
            request, "admin/jobs/deadletter/peek.html", f"Peek at {queue}", context
        )

    def action_view(self, request: HttpRequest, action: str) -> HttpResponse:
        """Replay or discard: GET shows the dry run (count, sample) and asks for a
        justification; POST does it, or hands a large selection to the background."""
        if action not in ACTIONS:
            raise Http404
        if not request.user.has_perm(PERMISSIONS[action]):
            raise PermissionDenied
        params = request.POST if request.method == "POST" else request.GET
        selection, describe = _selection_from(params)
        if operator_org_ids(request.user) is not None and not names_rows(selection):
            # A whole queue or filter acts on every tenant at once (the service refuses
            # it too: dlq.services.selection.dead_letters_checked_selection).
            raise PermissionDenied
        context: dict[str, Any] = {"action": action, "describe": describe, "selection": selection}
        context["hidden"] = _hidden_fields(selection)
        # Rows a replay cannot take (no job) can be discarded: those of the same selection
        # that name no job, all of them (the count says all; a limit was for the replay).
        context["can_discard"] = request.user.has_perm(PERMISSIONS["discard"])
        kept = [(k, v) for k, v in context["hidden"] if k not in ("limit", "without_job")]
        context["discard_query"] = urlencode([*kept, ("without_job", "1")])
        if request.method == "POST":
            justification = request.POST.get("justification", "")
            context["justification"] = justification
            try:
                outcome = dead_letters_act(
                    action=action, actor_user=request.user, justification=justification, **selection
                )
            except ApplicationError as exc:
                context["error"] = exc.message
                context["error_details"] = exc.details
            else:
                return self._after_action(request, action, outcome)
        try:
            context["dry_run"] = dead_letters_act(
                action=action, actor_user=request.user, justification="", dry_run=True, **selection
            )
        except ApplicationError as exc:
            context["error"], context["error_details"] = exc.message, exc.details
        context["background_threshold"] = settings.JOBOPS_DLQ_BACKGROUND_THRESHOLD
        title = f"{action.capitalize()} dead letters"
        return self.render_page(request, "admin/jobs/deadletter/action.html", title, context)

    def fix_forward_view(self, request: HttpRequest, dead_letter_id: int) -> HttpResponse:
        """Fix-forward: GET shows the job's params to edit; POST `preview` validates
        them and shows the changed paths; POST `confirm` replays with them (or, with
        JOBOPS_REPLAY_APPROVAL, asks a second operator). The service checks again."""
        if not request.user.has_perm(PERMISSIONS["replay"]):
            raise PermissionDenied
        row = (
            self.get_queryset(request)
            .select_related("job")
            .filter(pk=dead_letter_id, job__isnull=False)
            .first()
        )
        if row is None or row.job is None:
            raise Http404("No such dead letter.")
        job = row.job
        context: dict[str, Any] = {
            "row": row,
            "job": job,
            "params_text": json.dumps(job.params, indent=2, sort_keys=True),
            "reason": "",
            "approval": settings.JOBOPS_REPLAY_APPROVAL,
            "can_edit": row.state == DeadLetterState.OPEN and job.status == "failed",
        }
        if request.method == "POST":
            text = request.POST.get("params", "")
            # Shown again to be corrected; a text past the bound is refused, not cut.
            context["params_text"] = text[: settings.JOBOPS_MAX_PAYLOAD_BYTES]
            context["reason"] = request.POST.get("reason", "")
            try:
                params = json_from_form(text, what="The params JSON")
            except FormJSONError as exc:
                context["error"] = str(exc)
            else:
                try:
                    if "confirm" in request.POST:
                        edit = fix_forward_request(
                            dead_letter_id=row.pk,
                            actor_user=request.user,
                            params=params,
                            reason=context["reason"],
                        )
                        if edit.state == ParamsEditState.APPLIED:
                            messages.success(request, "Replayed with the edited params.")
                        else:
                            messages.info(
                                request,
                                "Edit requested: a second operator approves or rejects it "
                                "on this dead letter's page.",
                            )
                        return HttpResponseRedirect(
                            reverse("admin:jobs_deadletter_change", args=[row.pk])
                        )
                    preview = fix_forward_preview(
                        dead_letter_id=row.pk, actor_user=request.user, params=params
                    )
                except ApplicationError as exc:
                    context["error"] = exc.message
                    context["error_details"] = error_lines(exc.details)
                else:
                    context["diff"] = diff_rows(
                        job.params, preview["new_params"], preview["changed_paths"]
                    )
                    context["params_text"] = json.dumps(
                        preview["new_params"], indent=2, sort_keys=True
                    )
        return self.render_page(
            request, "admin/jobs/deadletter/fix_forward.html", "Fix forward", context
        )

    def params_edit_decide_view(
        self, request: HttpRequest, edit_id: int, decision: str
    ) -> HttpResponse:
        """POST approve or reject a requested edit (the service refuses the requester's
        own approval, and anyone outside the edit's organisation)."""
        if request.method != "POST" or decision not in ("approve", "reject"):
            raise Http404
        if not request.user.has_perm(PERMISSIONS["replay"]):
            raise PermissionDenied
        decide = fix_forward_approve if decision == "approve" else fix_forward_reject
        try:
            edit = decide(edit_id=edit_id, actor_user=request.user)
        except ApplicationError as exc:
            if exc.http_status == 404:
                raise Http404(exc.message) from exc
            if exc.http_status == 403:
                raise PermissionDenied(exc.message) from exc
            messages.error(request, exc.message)
            back = request.POST.get("dead_letter", "")
            if back.isdigit():
                return HttpResponseRedirect(
                    reverse("admin:jobs_deadletter_change", args=[int(back)])
                )
            return HttpResponseRedirect(reverse("admin:jobs_deadletter_changelist"))
        messages.success(request, f"Edit {edit.pk} {edit.state}.")
        return HttpResponseRedirect(
            reverse("admin:jobs_deadletter_change", args=[edit.dead_letter_id])
        )

    def _after_action(self, request: HttpRequest, action: str, outcome: Any) -> HttpResponse:
        if isinstance(outcome, BulkOperation):
            messages.info(
                request,
                f"{outcome.total} dead letters are too many for one request: the {action} runs "
                "in the background. Its progress is below; you can stop it.",
            )
            return HttpResponseRedirect(
                reverse("admin:dlq_bulkoperation_change", args=[outcome.pk])
            )
        title = f"{action.capitalize()} done"
        return self.render_page(
            request,
            "admin/jobs/deadletter/action_done.html",
            title,
            # Without a broker (JOBOPS_BROKER off) there are no copies to speak of.
            {"action": action, "result": outcome, "broker": settings.JOBOPS_BROKER},
        )


def _selection_from(params: Any) -> tuple[dict[str, Any], list[str]]:
    """The service's selection from a page's parameters, and its description in words.

    `age` becomes a fixed `created_after`/`created_before` on the dry-run page, carried in
    hidden fields, so that the confirmed run selects what the dry run counted.
    """
    filters: dict[str, Any] = {}
    describe: list[str] = []
    for name in ("reason", "error_code"):
        if params.get(name):
            filters[name] = params[name]
            describe.append(f"{name.replace('_', ' ')} {params[name]}")
    if params.get("retryable"):
        filters["retryable"] = True
        describe.append("only retryable causes")
    if params.get("without_job"):
        filters["without_job"] = True
        describe.append("only those that name no job")
    after, before = age_bounds(params.get("age"))
    for name, bound in (("created_after", after), ("created_before", before)):
        value = bound.isoformat() if bound else params.get(name)
        if value:
            filters[name] = value
            describe.append(f"{name.replace('_', ' ')} {str(value)[:19]}")
    selection: dict[str, Any] = {"queue": params.get("queue") or None, "filters": filters}
    if selection["queue"]:
        describe.insert(0, f"in {selection['queue']}")
    if params.get("ids"):
        ids = [int(i) for i in str(params["ids"]).split(",") if i.strip().isdigit()]
        selection["dead_letter_ids"] = ids
        describe.append(f"{len(ids)} chosen row{'s' if len(ids) != 1 else ''}")
    if params.get("job"):
        selection["job_ids"] = [params["job"]]
        describe.append(f"job {params['job']}")
    raw_limit = str(params.get("limit") or "").strip()
    if raw_limit:
        # Whatever was given goes to the service, which refuses anything but a positive
        # integer: a limit dropped here ("-5", "two") would select every matching row.
        try:
            selection["limit"] = int(raw_limit)
        except ValueError:
            selection["limit"] = raw_limit[:100]
        describe.append(f"at most {raw_limit[:100]}")
    return selection, describe or ["every open dead letter"]


def _hidden_fields(selection: dict[str, Any]) -> list[tuple[str, Any]]:
    hidden: list[tuple[str, Any]] = [(k, v) for k, v in selection["filters"].items()]
    hidden = [(k, "1" if v is True else v) for k, v in hidden]
    if selection.get("queue"):
        hidden.append(("queue", selection["queue"]))
    if selection.get("dead_letter_ids") is not None:
        hidden.append(("ids", ",".join(map(str, selection["dead_letter_ids"]))))
    if selection.get("job_ids"):
        hidden.append(("job", selection["job_ids"][0]))
    if selection.get("limit") is not None:  # 0 too: refused, never dropped
        hidden.append(("limit", selection["limit"]))
    return hidden
