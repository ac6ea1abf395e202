"""No 500 from the login or any portal form (issue 37, M1-M3).

The crawl takes every admin URL from the URL resolver (the model admins, the custom
pages of dlq/admin/, jobs/admin/, tenants, the audit pages, the operator controls),
fills its path parameters with real rows, reads the forms its GET shows and POSTs each
of the API's hostile values (core/json.py, core/api/parsers.py): a value past the
payload bound, JSON nested 5,000 deep, a NUL, and bytes that are not UTF-8 (raw, in a
urlencoded and in a multipart body), first in every field at once, then in each field
alone beside the page's own values. Every answer must be below 500.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken

from audit.services import Actor
from dlq.models import BulkOperation
from dlq.services.fix_forward import fix_forward_request
from jobs.models import DeadLetter, Schedule
from jobs.selectors import connectors_state
from jobs.services.webhooks import webhook_create
from tenants.models import OperatorScope, Organisation, Project
from tenants.services import service_account_create, token_create
from tests.factories import (
    OperatorFactory,
    ProjectFactory,
    UserFactory,
    job_failed,
    make_job,
    totp_device,
)

pytestmark = pytest.mark.django_db

DEEP = "[" * 5000 + "]" * 5000
HOSTILE: dict[str, str | bytes] = {
    "oversize": "a" * 300_000,  # past JOBOPS_MAX_PAYLOAD_BYTES (256 KiB)
    "deep": DEEP,
    "nul": "ab\x00cd",
    "invalid-utf8": b"\xff\xfe\xed\xa0\x80",  # not UTF-8; the last three a lone surrogate
}
# What a page without a form of its own is sent (a POST-only view, a button elsewhere).
KNOWN_FIELDS = ["justification", "reason", "params", "confirm", "dead_letter", "post"]
# Views that read a POST whether or not their GET shows a form: its button is on another
# page, or the form is gone once an earlier POST of the crawl resolved the row.
POST_ONLY = {
    "jobs_deadletter_params_edit_decide",
    "dlq_bulkoperation_stop",
    "jobs_deadletter_fix_forward",
    "jobs_job_rerun",
    "jobs_job_cancel",
}
SKIP = {"logout"}  # it ends the session the crawl runs in: crawled last, on its own
BOUNDARY = "hostile-crawl-boundary"


# --- reading the pages ----------------------------------------------------------------------


class _Forms(HTMLParser):
    """Each <form>'s method, action and fields: (name, value, kind) where kind is the
    input type, "textarea" or "select"; a select's value is its chosen (or first) option
    and its options are kept."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []
        self._select: dict[str, Any] | None = None
        self._textarea: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.forms.append(
                {
                    "method": a.get("method", "get").lower(),
                    "action": a.get("action", ""),
                    "fields": [],
                }
            )
            return
        if not self.forms:
            return
        fields = self.forms[-1]["fields"]
        if tag == "input" and a.get("name"):
            kind = a.get("type", "text").lower()
            if kind == "radio" and "checked" not in a:
                return  # one value per group: the chosen one
            fields.append({"name": a["name"], "value": a.get("value", ""), "kind": kind})
        elif tag == "button" and a.get("name"):
            fields.append({"name": a["name"], "value": a.get("value", ""), "kind": "submit"})
        elif tag == "textarea" and a.get("name"):
            self._textarea = {"name": a["name"], "value": "", "kind": "textarea"}
            fields.append(self._textarea)
        elif tag == "select" and a.get("name"):
            self._select = {"name": a["name"], "value": None, "kind": "select", "options": []}
            fields.append(self._select)
        elif tag == "option" and self._select is not None:
            self._select["options"].append(a.get("value", ""))
            if "selected" in a or self._select["value"] is None:
                self._select["value"] = a.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._textarea["value"] += data


def post_forms(html: str, url: str) -> list[dict[str, Any]]:
    """The POST forms of a page that post to the page itself."""
    parser = _Forms()
    parser.feed(html)
    own = []
    for form in parser.forms:
        target = urlsplit(form["action"]).path
        if form["method"] == "post" and target in ("", urlsplit(url).path):
            own.append(form)
    return own


# --- sending hostile bodies -----------------------------------------------------------------


def urlencoded(pairs: list[tuple[str, str | bytes]]) -> bytes:
    return urlencode(pairs).encode("ascii")  # bytes values are quoted raw: %FF%FE...


def multipart(pairs: list[tuple[str, str | bytes]]) -> bytes:
    parts = []
    for name, value in pairs:
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
            + raw
            + b"\r\n"
        )
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def post(client: Client, url: str, pairs: list[tuple[str, str | bytes]], *, multi: bool) -> Any:
    if multi:
        body = multipart(pairs)
        content_type = f"multipart/form-data; boundary={BOUNDARY}"
    else:
        body = urlencoded(pairs)
        content_type = "application/x-www-form-urlencoded"
    return client.generic("POST", url, body, content_type=content_type)


def hostile_bodies(
    fields: list[dict[str, Any]], *, each_field: bool = True
) -> Iterator[tuple[str, list[tuple[str, Any]], bool]]:
    """(what, pairs, multipart?) per hostile value: every field hostile at once
    (urlencoded; NUL and invalid UTF-8 also as multipart), then, with `each_field`, each
    field alone beside the page's own values (one field of each name shape: an inline
    formset's rows share theirs)."""
    baseline = [(f["name"], f["value"] or "") for f in fields]
    names = list(dict.fromkeys(f["name"] for f in fields))
    shapes = {re.sub(r"-(\d+|__prefix__)-", "-N-", n): n for n in reversed(names)}
    for kind, value in HOSTILE.items():
        if kind == "oversize":  # every field past any bound, the body within Django's
            value = value[: min(len(value), 2_400_000 // max(len(names), 1))]
        every = [(n, value) for n in names]
        yield f"{kind} in every field", every, False
        if kind in ("nul", "invalid-utf8"):
            yield f"{kind} in every field", every, True
        if each_field and len(names) > 1:
            for name in shapes.values():
                alone = HOSTILE[kind]
                pairs = [(n, alone if n == name else v) for n, v in baseline]
                yield f"{kind} in {name}", pairs, False


def mixed_body() -> list[tuple[str, str | bytes]]:
    values = list(HOSTILE.values())
    return [(name, values[i % len(values)]) for i, name in enumerate(KNOWN_FIELDS)]


# --- the portal's URLs ------------------------------------------------------------------------


def admin_patterns() -> Iterator[tuple[str, URLPattern]]:
    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, URLPattern]]:
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            else:
                yield prefix + str(p.pattern), p

    for route, pattern in walk(get_resolver().url_patterns, "/"):
        if route.startswith("/admin/"):
            yield route, pattern


def model_of(name: str | None) -> Any:
    """The model whose admin page `admin:<app>_<model>_<view>` is."""
    for model in admin.site._registry:
        prefix = f"{model._meta.app_label}_{model._meta.model_name}_"
        if name and name.startswith(prefix):
            return model
    return None


def crawl_urls(rows: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(name, url) for every admin URL, its parameters filled from `rows`."""
    for route, pattern in admin_patterns():
        name = pattern.name or route
        if name in SKIP:
            continue
        if route.endswith("(?P<url>.*)$"):
            yield name, "/admin/no/such/page/"
            continue
        if "(?P<app_label>" in route:
            yield name, "/admin/jobs/"
            continue
        params = list(pattern.pattern.converters)
        choices: list[list[str]] = []
        for param in params:
            if param == "object_id":
                model = model_of(pattern.name)
                choices.append([str(rows["objects"].get(model, "1"))])
            else:
                choices.append(rows["params"][(pattern.name, param)])
        for values in itertools.product(*choices):
            url = route
            for param, value in zip(params, values, strict=True):
                converter = pattern.pattern.converters[param]
                kind = {"UUIDConverter": "uuid", "IntConverter": "int", "PathConverter": "path"}
                token = kind.get(type(converter).__name__, "str")
                url = url.replace(f"<{token}:{param}>", value).replace(f"<{param}>", value)
            yield name, url
            # A page whose form carries its selection in hidden fields: with one too.
            if name in rows["queries"]:
                yield name, f"{url}?{rows['queries'][name]}"


@pytest.fixture
def rows(settings: Any, broker: None) -> dict[str, Any]:
    """A row behind every page: a failed job with its open dead letter and a requested
    params edit, a background operation, a schedule, an organisation with a project, a
    service account and a token, an operator scope, a group, another user."""
    settings.JOBOPS_REPLAY_APPROVAL = True
    job = job_failed(code="BAD_INPUT")
    make_job()
    row = DeadLetter.objects.get(job=job)
    requester = OperatorFactory(username="requester")
    edit = fix_forward_request(
        dead_letter_id=row.id, actor_user=requester, params={"steps": 3}, reason="typo"
    )
    other = UserFactory(username="someone-else")
    project = ProjectFactory()
    org = project.organisation
    service_account_create(org=org, name="robot")
    token_create(user=other, name="crawl")
    Group.objects.get_or_create(name="crawl-group")
    scope = OperatorScope.objects.create(user=requester)
    scope.organisations.add(org)
    operation = BulkOperation.objects.create(
        action="replay",
        selection={},
        up_to_id=row.id,
        justification="crawl",
        requested_by=requester,
    )
    schedule = Schedule.objects.create(
        name="nightly", org=org, owner=other, job_type="sim", params={}, cron="0 3 * * *"
    )
    device = totp_device(other)
    backup = StaticDevice.objects.create(user=other, name="backup", confirmed=True)
    StaticToken.objects.create(device=backup, token="backup01")
    endpoint = webhook_create(
        org=org,
        url="https://example.com/hooks",
        events=["job.status.changed"],
        actor=Actor.system("test"),
    ).endpoint
    objects: dict[Any, Any] = {}
    for model in admin.site._registry:
        first = model._default_manager.order_by("pk").last()
        if first is not None:
            objects[model] = first.pk
    objects[get_user_model()] = other.pk
    objects[Schedule] = schedule.pk
    objects[Organisation] = org.pk
    objects[Project] = project.pk
    connector = [c.name for c in connectors_state()][:1] or ["erp"]
    params = {
        ("queue_control", "queue"): ["sim"],
        ("queue_control", "action"): ["pause", "resume"],
        ("connector_control", "name"): connector,
        ("connector_control", "action"): ["open", "close"],
        ("view_on_site", "content_type_id"): ["1"],
        ("view_on_site", "object_id"): ["1"],
        ("auth_user_password_change", "id"): [str(other.pk)],
        ("jobs_job_cancel", "job_id"): [str(job.id)],
        ("jobs_job_live", "job_id"): [str(job.id)],
        ("jobs_job_rerun", "job_id"): [str(job.id)],
        ("jobs_job_artefact", "job_id"): [str(job.id)],
        ("jobs_job_artefact", "artefact_id"): [str(uuid.uuid4())],
        ("jobs_deadletter_peek", "queue"): ["sim_dlq"],
        ("jobs_deadletter_action", "action"): ["replay", "discard"],
        ("jobs_deadletter_fix_forward", "dead_letter_id"): [str(row.id)],
        ("jobs_deadletter_params_edit_decide", "edit_id"): [str(edit.id)],
        ("jobs_deadletter_params_edit_decide", "decision"): ["approve", "reject"],
        ("dlq_bulkoperation_panel", "operation_id"): [str(operation.id)],
        ("dlq_bulkoperation_stop", "operation_id"): [str(operation.id)],
        ("otp_totp_totpdevice_config", "pk"): [str(device.pk)],
        ("otp_totp_totpdevice_qrcode", "pk"): [str(device.pk)],
        ("jobs_webhookendpoint_deliveries", "endpoint_id"): [str(endpoint.pk)],
    }
    selection = urlencode(
        {"queue": "sim_dlq", "reason": "exhausted", "error_code": "BAD_INPUT", "ids": row.id}
    )
    queries = {
        "jobs_deadletter_action": f"{selection}&limit=5&age=24h&retryable=1",
        "jobs_cancel_matching": "status__exact=pending&type__exact=sim",
    }
    return {"objects": objects, "params": params, "queries": queries}


# make test crawls the portal in sections, each its own test: the first segment of an
# admin URL (an app's label, or a custom page's name) -> section, and the least number
# of POSTs that shows a section's crawl reached its pages. Every segment not named here
# is crawled by the section "other": no admin URL is left out.
SECTIONS: dict[str, tuple[tuple[str, ...], int]] = {
    "jobs": (("jobs", "dlq", "queues", "connectors", "dashboard"), 100),
    "tenants": (("tenants",), 60),
    "accounts": (("auth", "authtoken", "otp_static", "otp_totp", "password_change", "axes"), 70),
}
OTHER, OTHER_LEAST = "other", 20


def section_of(url: str) -> str:
    segment = urlsplit(url).path.split("/")[2]  # /admin/<segment>/...
    return next((name for name, (apps, _) in SECTIONS.items() if segment in apps), OTHER)


def crawl(
    client: Client, rows: dict[str, Any], *, each_field: bool, section: str | None = None
) -> None:
    """Crawl every admin URL (`section`: only that section's, SECTIONS)."""
    client.raise_request_exception = False
    failures: list[str] = []
    posts = 0
    for name, url in crawl_urls(rows):
        if section is not None and section_of(url) != section:
            continue
        page = client.get(url)
        assert page.status_code < 500, f"GET {url}: {page.status_code}"
        assert not (page.status_code == 302 and "/admin/login/" in page["Location"]), (
            f"the crawl lost its session at {url}"
        )
        forms = []
        if page.status_code == 200 and "html" in page.get("Content-Type", ""):
            forms = post_forms(page.content.decode("utf-8", "replace"), url)
        fields = [f for form in forms for f in form["fields"]]
        fields = [f for f in fields if f["name"] != "csrfmiddlewaretoken"]
        own = bool(fields)
        if not own:
            fields = [{"name": n, "value": "", "kind": "text"} for n in KNOWN_FIELDS]
        if own or each_field or name in POST_ONLY:
            bodies = hostile_bodies(fields, each_field=each_field and own)
        else:  # a page that shows no form: one POST, each hostile value in some field
            bodies = iter([("a mix in the usual fields", mixed_body(), False)])
        for what, pairs, multi in bodies:
            answer = post(client, url, pairs, multi=multi)
            posts += 1
            if answer.status_code >= 500:
                encoding = "multipart" if multi else "urlencoded"
                failures.append(f"{answer.status_code} POST {url} ({name}): {what}, {encoding}")
    assert client.get("/admin/").status_code == 200, "the crawl ended logged out"
    least = 300 if section is None else SECTIONS.get(section, ((), OTHER_LEAST))[1]
    assert posts > least, posts  # it reached the pages
    assert not failures, f"{len(failures)} of {posts} POSTs answered 5xx:\n" + "\n".join(
        failures[:60]
    )


@pytest.mark.parametrize("section", [*SECTIONS, OTHER])
def test_no_admin_post_answers_500_to_hostile_values(otp_admin_client, rows, section):
    """Every admin URL (of one section) with a form: each hostile value in every field
    of its forms at once; every other admin URL: one POST of hostile values (the heavy
    test below sends them all to every URL, and each field alone)."""
    crawl(otp_admin_client, rows, each_field=False, section=section)


@pytest.mark.heavy  # about 1,700 POSTs, 50 s: `make test-heavy`
def test_no_admin_form_field_answers_500_to_hostile_values(otp_admin_client, rows):
    """Every admin URL with every hostile value, in every field at once and in each field
    of its forms alone, the others at the page's values (so that a form's other checks
    pass and the value reaches what reads it)."""
    crawl(otp_admin_client, rows, each_field=True)


LOGIN_FIELDS = ["username", "password", "otp_token", "otp_device", "otp_challenge", "next"]


def test_no_login_post_answers_500_to_hostile_values():
    """The login (and logout) with each hostile value in each field; each attempt from its
    own address and name, so that a lockout does not hide what comes after it."""
    failures = []
    attempts = itertools.count(1)
    fields = [{"name": n, "value": "", "kind": "text"} for n in LOGIN_FIELDS]
    for url in ("/admin/login/", "/admin/logout/"):
        for what, pairs, multi in hostile_bodies(fields):
            n = next(attempts)
            client = Client(REMOTE_ADDR=f"10.77.{n // 250}.{n % 250 + 1}")
            client.raise_request_exception = False
            pairs = [(k, f"crawler-{n}" if k == "username" and v == "" else v) for k, v in pairs]
            pairs = [(k, "wrong" if k == "password" and v == "" else v) for k, v in pairs]
            answer = post(client, url, pairs, multi=multi)
            if answer.status_code >= 500:
                failures.append(f"{answer.status_code} POST {url}: {what}")
    assert not failures, "\n".join(failures)
