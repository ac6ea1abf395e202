"""Recurring schedules (docs/operator-controls.md#recurring-schedules): validation, the
fire step (one job per fire time, whoever fires it; catch-up), the command, the admin."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from structlog.testing import capture_logs

from audit.models import AuditLog
from audit.services import Actor
from jobs.domain.exceptions import JobParamsInvalidError, ScheduleInvalidError
from jobs.models import Job, Schedule
from jobs.services.schedules import (
    next_fire,
    schedule_create,
    schedule_set_enabled,
    schedules_fire_due,
)
from tenants.models import OperatorScope
from tests.factories import OrganisationFactory, UserFactory, otp_login, role_user

pytestmark = pytest.mark.django_db
OPERATOR = Actor.system("test")
SIM = {"steps": 1, "step_seconds": 0}


def make_schedule(*, org=None, owner=None, name="nightly", cron="*/5 * * * *", **kwargs):
    org = org or OrganisationFactory(slug="acme")
    owner = owner or UserFactory(org=org)
    return schedule_create(
        name=name,
        org=org,
        owner=owner,
        job_type=kwargs.pop("job_type", "sim"),
        params=kwargs.pop("params", SIM),
        cron=cron,
        actor=OPERATOR,
        **kwargs,
    )


def ops(event_type):
    return list(AuditLog.objects.filter(chain="ops", event_type=event_type))


def test_a_new_schedule_fires_next_at_its_cron_time_in_its_time_zone():
    schedule = make_schedule(cron="0 9 * * *", timezone_name="Europe/Paris")
    assert schedule.next_fire_at > timezone.now()
    # 09:00 in Paris is 08:00 UTC in winter, 07:00 in summer.
    winter = next_fire(schedule, after=datetime(2026, 1, 10, 12, tzinfo=UTC))
    summer = next_fire(schedule, after=datetime(2026, 7, 10, 12, tzinfo=UTC))
    assert winter == datetime(2026, 1, 11, 8, tzinfo=UTC)
    assert summer == datetime(2026, 7, 11, 7, tzinfo=UTC)
    (added,) = ops("schedule_added")
    assert '"cron":"0 9 * * *"' in added.payload and '"params"' not in added.payload


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("cron", {"cron": "61 * * * *"}),
        ("cron", {"cron": "* * *"}),
        ("cron", {"cron": "@reboot"}),
        ("cron", {"cron": "x" * 101}),
        ("timezone", {"timezone_name": "Mars/Olympus"}),
        ("timezone", {"timezone_name": ""}),
        ("name", {"name": "has space"}),
        ("name", {"name": "-leading"}),
    ],
)
def test_a_bad_cron_time_zone_or_name_is_refused_with_its_field(field, kwargs):
    with pytest.raises(ScheduleInvalidError) as refused:
        make_schedule(**kwargs)
    assert field in refused.value.details
    assert not Schedule.objects.exists() and not ops("schedule_added")


def test_params_are_checked_by_the_type_schema_and_the_owner_must_be_a_member():
    with pytest.raises(JobParamsInvalidError):
        make_schedule(params={"steps": "many"})
    org = OrganisationFactory(slug="acme")
    with pytest.raises(ScheduleInvalidError) as refused:
        make_schedule(org=org, owner=UserFactory(org=OrganisationFactory(slug="other")))
    assert "owner" in refused.value.details


def test_a_name_is_unique_in_its_organisation_only():
    org = OrganisationFactory(slug="acme")
    make_schedule(org=org)
    with pytest.raises(ScheduleInvalidError):
        make_schedule(org=org)
    make_schedule(org=OrganisationFactory(slug="other"))
    assert Schedule.objects.count() == 2


def due(schedule, *, minutes_ago):
    """Make the schedule due as if its next fire time was `minutes_ago` (on a minute)."""
    moment = (timezone.now() - timedelta(minutes=minutes_ago)).replace(second=0, microsecond=0)
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=moment)
    return moment


def test_two_passes_at_the_same_fire_time_create_one_job_under_the_fire_key():
    schedule = make_schedule(cron="* * * * *")
    fire_time = due(schedule, minutes_ago=0)
    now = fire_time + timedelta(seconds=1)
    assert schedules_fire_due(now=now) == {"fired": 1, "created": 1}
    # A second dispatcher that read the schedule before the first moved it on.
    due(schedule, minutes_ago=0)
    assert schedules_fire_due(now=now) == {"fired": 1, "created": 0}
    (job,) = Job.objects.all()
    assert job.idempotency_key == f"schedule:nightly:{fire_time.isoformat()}"
    assert job.owner_id == schedule.owner_id and job.org_id == schedule.org_id
    assert job.status == "pending" and job.params == schedule.params  # the schema's defaults
    schedule.refresh_from_db()
    assert schedule.last_fired_at == fire_time and schedule.next_fire_at > now


def test_a_dispatcher_that_was_down_catches_up_at_most_the_setting(settings):
    schedule = make_schedule(cron="* * * * *")
    due(schedule, minutes_ago=10)
    assert schedules_fire_due()["created"] == 1  # the default: the latest missed fire
    latest = Job.objects.get()
    assert latest.idempotency_key.endswith(
        timezone.now().replace(second=0, microsecond=0).isoformat()
    ) or latest.idempotency_key.endswith(
        (timezone.now() - timedelta(minutes=1)).replace(second=0, microsecond=0).isoformat()
    )
    settings.JOBOPS_SCHEDULE_CATCH_UP = 3
    due(schedule, minutes_ago=10)
    assert schedules_fire_due()["created"] == 2  # 3 latest, one of them made already
    assert Job.objects.count() == 3


def test_a_disabled_schedule_never_fires_and_enabling_it_does_not_catch_up():
    schedule = make_schedule(cron="* * * * *")
    schedule = schedule_set_enabled(schedule=schedule, enabled=False, actor=OPERATOR)
    assert schedule.next_fire_at is None
    assert schedules_fire_due(now=timezone.now() + timedelta(hours=1))["fired"] == 0
    schedule = schedule_set_enabled(schedule=schedule, enabled=True, actor=OPERATOR)
    assert schedule.next_fire_at > timezone.now()
    assert [len(ops(e)) for e in ("schedule_disabled", "schedule_enabled")] == [1, 1]
    assert not Job.objects.exists()


def test_a_fire_that_cannot_create_its_job_is_logged_and_the_schedule_moves_on():
    schedule = make_schedule(cron="* * * * *")
    org = schedule.org
    org.suspended_at = timezone.now()
    org.save()
    fire_time = due(schedule, minutes_ago=0)
    with capture_logs() as logs:
        assert schedules_fire_due() == {"fired": 1, "created": 0}
    assert not Job.objects.exists()
    (skipped,) = [e for e in logs if e["event"] == "schedule_fire_skipped"]
    assert skipped["schedule"] == "nightly" and skipped["org_id"] == org.id
    assert skipped["reason"] == "org_suspended" and skipped["fires"] == 1
    schedule.refresh_from_db()
    assert schedule.next_fire_at > timezone.now() and schedule.last_fired_at == fire_time
    # Skipped, not saved up: resumed, the organisation gets only the next fire.
    org.suspended_at = None
    org.save()
    assert schedules_fire_due() == {"fired": 0, "created": 0}


def run(*args):
    out = StringIO()
    call_command("schedule", *args, stdout=out)
    return out.getvalue()


def test_the_command_adds_lists_disables_enables_fires_and_removes():
    org = OrganisationFactory(slug="acme")
    UserFactory(username="ann", org=org)
    added = run("add", "hourly", "--org", "acme", "--owner", "ann", "--type", "sim",
                "--params", '{"steps": 1, "step_seconds": 0}', "--cron", "0 * * * *",
                "--timezone", "Europe/Paris")  # fmt: skip
    assert "added acme/hourly: next fire" in added
    assert "acme/hourly\tsim\t0 * * * *\tEurope/Paris\tenabled" in run("list")
    assert "disabled acme/hourly" in run("disable", "hourly", "--org", "acme")
    assert "enabled acme/hourly" in run("enable", "hourly", "--org", "acme")
    due(Schedule.objects.get(), minutes_ago=0)
    assert "fired 1 schedule(s), created 1 job(s)" in run("fire-due")
    assert "removed acme/hourly" in run("remove", "hourly", "--org", "acme")
    assert not Schedule.objects.exists() and Job.objects.count() == 1
    assert len(ops("schedule_removed")) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enable", "nope", "--org", "acme"], "ERR-JOB-404"),
        (["add", "x", "--org", "nowhere", "--owner", "ann", "--type", "sim", "--cron", "* * * * *"],
         "No organisation"),
        (["add", "x", "--org", "acme", "--owner", "ann", "--type", "sim", "--cron", "bad"],
         "ERR-JOB-422"),
        (["add", "x", "--org", "acme", "--owner", "ann", "--type", "sim", "--cron", "* * * * *",
          "--params", "{"], "not valid JSON"),
    ],
)  # fmt: skip
def test_the_command_says_what_is_wrong(args, message):
    UserFactory(username="ann", org=OrganisationFactory(slug="acme"))
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_the_admin_pages_load_and_show_the_next_fire_time(otp_admin_client):
    schedule = make_schedule()
    listing = otp_admin_client.get("/admin/jobs/schedule/")
    assert listing.status_code == 200
    assert schedule.next_fire_at.strftime("%Y-%m-%d %H:%M:%S") in listing.content.decode()
    for url in ("/admin/jobs/schedule/add/", f"/admin/jobs/schedule/{schedule.pk}/change/"):
        assert otp_admin_client.get(url).status_code == 200, url


def test_the_admin_refuses_a_bad_cron_on_its_field_and_audits_a_good_edit(otp_admin_client):
    schedule = make_schedule()
    form = {
        "name": schedule.name, "org": schedule.org_id, "owner": schedule.owner_id,
        "project": "", "job_type": "sim", "params": '{"steps": 1, "step_seconds": 0}',
        "cron": "99 * * * *", "timezone": "UTC", "enabled": "on",
    }  # fmt: skip
    url = f"/admin/jobs/schedule/{schedule.pk}/change/"
    page = otp_admin_client.post(url, form)
    assert page.status_code == 200 and "Five fields" in page.content.decode()
    assert otp_admin_client.post(url, {**form, "cron": "0 3 * * *"}).status_code == 302
    assert Schedule.objects.get().cron == "0 3 * * *"
    assert len(ops("schedule_changed")) == 1


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ("[" * 5000 + "]" * 5000, "nested deeper than 32 levels"),
        ('{"steps": 1, "label": "a\\u0000b"}', "NUL character"),
        ('{"label": "' + "a" * 300_000 + '"}', "at most 262144 are accepted"),
    ],
    ids=["5000-deep", "nul", "oversize"],
)
def test_the_admin_refuses_params_past_the_api_bounds_on_their_field(
    otp_admin_client, params, said
):
    """Django's JSONField recursed on 5,000-deep params (a 500): the form reads them
    within the API's bounds and says what is wrong, also on the form shown again."""
    schedule = make_schedule()
    form = {
        "name": schedule.name, "org": schedule.org_id, "owner": schedule.owner_id,
        "project": "", "job_type": "sim", "params": params,
        "cron": "0 3 * * *", "timezone": "UTC", "enabled": "on",
    }  # fmt: skip
    otp_admin_client.raise_request_exception = False
    page = otp_admin_client.post(f"/admin/jobs/schedule/{schedule.pk}/change/", form)
    assert page.status_code == 200 and said in page.content.decode()
    assert Schedule.objects.get().params == schedule.params


def test_staff_limited_to_organisations_see_only_their_schedules():
    mine, theirs = OrganisationFactory(slug="mine"), OrganisationFactory(slug="theirs")
    make_schedule(org=mine, name="a")
    other = make_schedule(org=theirs, name="b")
    user = role_user("operator", is_superuser=True)
    user.is_superuser = False
    user.save()
    OperatorScope.objects.create(user=user).organisations.add(mine)
    from django.contrib.auth.models import Permission

    user.user_permissions.add(*Permission.objects.filter(codename__endswith="_schedule"))
    client = otp_login(Client(), user)
    page = client.get("/admin/jobs/schedule/").content.decode()
    assert ">a<" in page and ">b<" not in page
    assert client.get(f"/admin/jobs/schedule/{other.pk}/change/").status_code in (302, 404)
