"""No secrets in params (docs/security.md#no-secrets-in-params): a key named like a
secret or a value shaped like one is refused with 422 ERR-JOB-PARAMS-SECRET on every
path that takes params, naming the JSON path and never the value; a schema's secret
reference is allowed; `manage.py check_secret_params` finds the schedules saved before."""

from __future__ import annotations

import copy
import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework import serializers
from structlog.testing import capture_logs

from audit.services import Actor
from dlq.services.fix_forward import fix_forward_request
from jobs.domain.exceptions import JobParamsSecretError
from jobs.domain.params import (
    MAX_SECRET_PATHS,
    SecretReferenceField,
    StrictParams,
    params_secret_check,
    params_secrets,
)
from jobs.domain.states import Status
from jobs.models import DeadLetter, Job, ParamsEdit, Schedule
from jobs.services.schedules import schedule_create, schedules_fire_due
from tests.factories import OperatorFactory, OrganisationFactory, UserFactory, job_failed

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs"
VALUE = "hunter2-not-for-your-eyes"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow" + "A" * 40 + "\n-----END RSA PRIVATE KEY-----"
SIM = {"steps": 1, "step_seconds": 0}


def erp(data):
    """erp's `data` takes any object: secrets can hide at any depth in it."""
    return {"event": "order.created", "data": data}


def refused_paths(params, schema=None):
    with pytest.raises(JobParamsSecretError) as refused:
        params_secret_check(params, schema=schema)
    assert refused.value.code == "ERR-JOB-PARAMS-SECRET" and refused.value.http_status == 422
    return refused.value.details


class ErpWithReference(StrictParams):
    """A schema that needs a credential: it declares the name of one (the worker
    resolves it), under a key named like a secret."""

    event = serializers.CharField(max_length=64)
    api_key = SecretReferenceField()
    auth = serializers.DictField(required=False)


@pytest.fixture
def reference_schema(settings):
    table = copy.deepcopy(settings.JOB_TYPES)
    table["erp"]["params_serializer"] = f"{__name__}.ErpWithReference"
    settings.JOB_TYPES = table


# --- the check ------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["password", "Password", "PASSWORD", "pass_word", "pass-word", "api_key", "API-Key",
     "apiKey", "api__key", "ApiKey", "access-token", "AccessToken", "refresh_token",
     "private-key", "CLIENT_SECRET", "Authorization", "passwd", "secret", "_secret_"],
)  # fmt: skip
def test_keys_named_like_a_secret_are_refused_whatever_their_case_dashes_and_underscores(key):
    details = refused_paths({key: VALUE})
    assert list(details) == [f"params.{key}"]
    assert VALUE not in json.dumps(details)


@pytest.mark.parametrize(
    "key",
    ["max_tokens", "token_count", "password_policy", "secret_santa", "passwords",
     "api_key_ref", "token", "author", "authorization_url", "keys", "private"],
)  # fmt: skip
def test_names_that_only_contain_a_secrets_name_are_allowed(key):
    assert params_secrets({key: "x", "nested": [{key: 1}]}) == []


def test_the_path_names_the_key_at_any_depth_of_objects_and_lists():
    params = erp({"auth": {"password": VALUE}, "items": [{"ok": 1}, {"Access-Token": VALUE}]})
    details = refused_paths(params)
    assert sorted(details) == ["params.data.auth.password", "params.data.items[1].Access-Token"]
    # A key that is no identifier is quoted, so that the path stays unambiguous.
    assert list(refused_paths({"a.b": {"secret": 1}})) == ['params["a.b"].secret']
    assert VALUE not in json.dumps(details)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (PEM, "PEM private key"),
        ("-----BEGIN PRIVATE KEY-----\nMIIE", "PEM private key"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "PEM private key"),
        ("-----BEGIN ENCRYPTED PRIVATE KEY-----", "PEM private key"),
        ("-----BEGIN PGP PRIVATE KEY BLOCK-----", "PEM private key"),
        ("config:\n-----BEGIN EC PRIVATE KEY-----\nabc", "PEM private key"),
        ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", "Bearer token"),
        ("bearer 0123456789abcdef0123", "Bearer token"),
        ("AKIAIOSFODNN7EXAMPLE", "AWS access key id"),
        ("ASIAY34FZKBOKMUTVV7A", "AWS access key id"),
        ("aws_access_key_id=AKIAIOSFODNN7EXAMPLE;", "AWS access key id"),
    ],
)
def test_values_shaped_like_a_secret_are_refused_under_any_key(value, why):
    details = refused_paths(erp({"rows": [{"note": value}]}))
    assert list(details) == ["params.data.rows[0].note"]
    assert why in details["params.data.rows[0].note"][0]
    assert value not in json.dumps(details)


@pytest.mark.parametrize(
    "value",
    [
        "-----BEGIN PUBLIC KEY-----\nMIIB",
        "-----BEGIN CERTIFICATE-----\nMIIB",
        "Bearer bonds pay the holder",  # prose, not a header value
        "Bearer short",
        "AKIAIOSFODNN7EXAMPL",  # 15 characters after the prefix
        "akiaiosfodnn7example",
        "XAKIAIOSFODNN7EXAMPLE",  # part of a longer word
    ],
)
def test_values_that_only_resemble_a_secret_are_allowed(value):
    assert params_secrets(erp({"note": value})) == []


def test_a_declared_secret_reference_may_bear_a_secrets_name_but_not_a_secrets_value():
    assert params_secrets({"event": "e", "api_key": "erp/api-key"}, schema=ErpWithReference) == []
    # Only the declared field: the same name elsewhere is still a secret.
    nested = {"event": "e", "api_key": "erp/api-key", "auth": {"api_key": VALUE}}
    assert list(refused_paths(nested, schema=ErpWithReference)) == ["params.auth.api_key"]
    # The reference's value is checked for the shapes of a secret.
    bearer = {"event": "e", "api_key": "Bearer 0123456789abcdef0123"}
    details = refused_paths(bearer, schema=ErpWithReference)
    assert list(details) == ["params.api_key"] and "Bearer token" in details["params.api_key"][0]
    # Without the schema, the name alone is refused.
    assert list(refused_paths({"api_key": "erp/api-key"})) == ["params.api_key"]


def test_the_names_are_the_setting_and_the_paths_listed_are_bounded(settings):
    settings.JOBOPS_SECRET_PARAM_NAMES = ["Pin-Code"]
    assert list(refused_paths({"pincode": 1234})) == ["params.pincode"]
    assert params_secrets({"password": "x"}) == []
    many = {f"k{i:02}": {"pin_code": i} for i in range(MAX_SECRET_PATHS + 5)}
    details = refused_paths(many)
    assert len(details) == MAX_SECRET_PATHS + 1 and details["more"] == [
        "5 more path(s) not listed."
    ]


# --- every path refuses --------------------------------------------------------------


def test_the_api_refuses_a_secret_with_422_naming_its_path_and_creates_nothing(api):
    body = {"type": "erp", "params": erp({"auth": {"Pass_Word": VALUE}})}
    response = api.post(JOBS, body, format="json")
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "ERR-JOB-PARAMS-SECRET"
    assert list(error["details"]) == ["params.data.auth.Pass_Word"]
    assert VALUE not in response.content.decode()
    assert not Job.objects.exists()


def test_the_api_refuses_a_secret_before_the_schema_calls_it_an_unknown_field(api):
    response = api.post(JOBS, {"type": "sim", "params": {**SIM, "password": VALUE}}, format="json")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "ERR-JOB-PARAMS-SECRET"


def test_a_secret_reference_is_created_and_stored_as_its_name(api, reference_schema):
    body = {"type": "erp", "params": {"event": "e", "api_key": "vault:erp/api-key"}}
    response = api.post(JOBS, body, format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get().params["api_key"] == "vault:erp/api-key"


def test_a_batch_refuses_the_item_with_a_secret_and_creates_the_others(api):
    items = [
        {"type": "sim", "params": SIM},
        {"type": "erp", "params": erp({"token": "AKIAIOSFODNN7EXAMPLE"})},
        {"type": "sim", "params": SIM},
    ]
    response = api.post(f"{JOBS}/batch", {"jobs": items}, format="json")
    assert response.status_code == 200, response.content
    listed = response.json()["results"]
    assert [r["status"] for r in listed] == ["created", "error", "created"]
    assert listed[1]["error"]["code"] == "ERR-JOB-PARAMS-SECRET"
    assert list(listed[1]["error"]["details"]) == ["params.data.token"]
    assert "AKIAIOSFODNN7EXAMPLE" not in response.content.decode()
    assert Job.objects.count() == 2


def test_submit_job_refuses_a_secret_with_exit_2_and_never_prints_it():
    UserFactory(username="alice")
    params = json.dumps(erp({"client-secret": VALUE}))
    with pytest.raises(CommandError) as refused:
        call_command(
            "submit_job", "--type", "erp", "--params", params, "--owner", "alice",
            stdout=io.StringIO(),
        )  # fmt: skip
    assert refused.value.returncode == 2
    assert "ERR-JOB-PARAMS-SECRET" in str(refused.value)
    assert "params.data.client-secret" in str(refused.value) and VALUE not in str(refused.value)
    assert not Job.objects.exists()


def make_schedule(params, job_type="erp"):
    org = OrganisationFactory(slug="acme")
    return schedule_create(
        name="nightly",
        org=org,
        owner=UserFactory(org=org),
        job_type=job_type,
        params=params,
        cron="0 3 * * *",
        actor=Actor.system("test"),
    )


def test_a_schedule_with_a_secret_is_refused_and_not_saved():
    with pytest.raises(JobParamsSecretError) as refused:
        make_schedule(erp({"headers": {"Authorization": VALUE}}))
    assert list(refused.value.details) == ["params.data.headers.Authorization"]
    assert not Schedule.objects.exists()


def test_the_schedule_form_shows_a_secret_on_the_params_field(otp_admin_client):
    org = OrganisationFactory(slug="acme")
    owner = UserFactory(org=org)
    form = {
        "name": "nightly", "org": org.pk, "owner": owner.pk, "project": "",
        "job_type": "erp", "params": json.dumps(erp({"password": VALUE})),
        "cron": "0 3 * * *", "timezone": "UTC", "enabled": "on",
    }  # fmt: skip
    page = otp_admin_client.post("/admin/jobs/schedule/add/", form)
    assert page.status_code == 200
    text = page.content.decode()
    assert "params.data.password" in text and "Named like a secret" in text
    assert page.context["adminform"].form.errors["params"]
    assert not Schedule.objects.exists()


def test_the_schedule_form_shows_a_schema_refusal_on_the_params_field_too(otp_admin_client):
    """The form caught only the schedule's own refusals: a params one was a 500."""
    org = OrganisationFactory(slug="acme")
    form = {
        "name": "nightly", "org": org.pk, "owner": UserFactory(org=org).pk, "project": "",
        "job_type": "sim", "params": '{"steps": "many"}',
        "cron": "0 3 * * *", "timezone": "UTC", "enabled": "on",
    }  # fmt: skip
    page = otp_admin_client.post("/admin/jobs/schedule/add/", form)
    assert page.status_code == 200
    errors = page.context["adminform"].form.errors["params"]
    assert any(e.startswith("steps: ") for e in errors), errors
    assert not Schedule.objects.exists()


def test_the_schedule_command_refuses_a_secret_with_its_code():
    org = OrganisationFactory(slug="acme")
    UserFactory(username="ann", org=org)
    with pytest.raises(CommandError, match="ERR-JOB-PARAMS-SECRET") as refused:
        call_command(
            "schedule", "add", "x", "--org", "acme", "--owner", "ann", "--type", "erp",
            "--cron", "0 3 * * *", "--params", json.dumps(erp({"secret": VALUE})),
            stdout=io.StringIO(),
        )  # fmt: skip
    assert VALUE not in str(refused.value)
    assert not Schedule.objects.exists()


def test_a_fix_forward_with_a_secret_is_refused_and_the_job_stays_dead():
    job = job_failed(job_type="erp")
    row = DeadLetter.objects.get(job=job)
    with pytest.raises(JobParamsSecretError) as refused:
        fix_forward_request(
            dead_letter_id=row.id,
            actor_user=OperatorFactory(),
            params={**job.params, "data": {"key": PEM}},
            reason="the ERP wants its key",
        )
    assert list(refused.value.details) == ["params.data.key"]
    assert Job.objects.get(id=job.id).status == Status.FAILED
    assert not ParamsEdit.objects.exists()


# --- the schedules saved before ----------------------------------------------------------


def check_secret_params():
    out = io.StringIO()
    try:
        call_command("check_secret_params", stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


def test_check_secret_params_lists_the_schedules_saved_before_and_exits_1():
    clean = make_schedule(erp({"note": "fine"}))
    # Saved before the check existed: written straight to the table.
    Schedule.objects.create(
        name="legacy",
        org=clean.org,
        owner=clean.owner,
        job_type="erp",
        params=erp({"auth": {"PASSWORD": VALUE}, "hook": "Bearer 0123456789abcdef0123"}),
        cron="0 4 * * *",
    )
    out, failed = check_secret_params()
    assert out.splitlines() == ["acme/legacy\terp\tparams.data.auth.PASSWORD, params.data.hook"]
    assert VALUE not in out and "0123456789abcdef" not in out
    assert failed is not None and failed.returncode == 1 and "1 schedule(s)" in str(failed)


def test_check_secret_params_reads_a_reference_with_its_types_schema(reference_schema):
    make_schedule({"event": "e", "api_key": "erp/api-key"})
    out, failed = check_secret_params()
    assert failed is None and "No schedule holds a secret" in out


def test_a_fire_of_a_schedule_saved_before_is_refused_and_logged_with_the_code():
    clean = make_schedule(erp({"note": "fine"}))
    legacy = Schedule.objects.create(
        name="legacy",
        org=clean.org,
        owner=clean.owner,
        job_type="erp",
        params=erp({"secret": VALUE}),
        cron="* * * * *",
        next_fire_at=timezone.now() - timedelta(seconds=1),
    )
    with capture_logs() as logs:
        counts = schedules_fire_due()
    assert counts == {"fired": 1, "created": 0} and not Job.objects.exists()
    (failed,) = [e for e in logs if e["event"] == "schedule_fire_failed"]
    assert failed["schedule"] == legacy.name and failed["error"] == "ERR-JOB-PARAMS-SECRET"
    assert VALUE not in json.dumps(logs, default=str)
