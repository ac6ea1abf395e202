"""The portal's site (config/admin_site.py): the dashboard as its index, and the tables
nobody may edit from it (Celery results, OTP devices)."""

from __future__ import annotations

import socket

import pytest
from django.core.cache import cache
from django.test import Client
from django_celery_results.models import GroupResult, TaskResult
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken

from config import dashboard
from config.dashboard import CACHE_KEY, dashboard_overview
from tests.factories import (
    StaffFactory,
    job_failed,
    make_job,
    otp_login,
    role_user,
    totp_code,
    totp_device,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer() -> Client:
    return otp_login(Client(), role_user("viewer"))


def test_the_dashboard_shows_queues_failures_by_cause_and_problems(viewer, broker):
    make_job()
    for _ in range(3):
        job_failed("TRANSIENT_EXTERNAL", job_type="erp")
    page = viewer.get("/admin/")
    overview = page.context["overview"]
    erp = next(q for q in overview["queues"] if q["queue"] == "erp")
    assert erp["open_dead_letters"] == 3 and erp["finished"]["failed"] == 3
    sim = next(q for q in overview["queues"] if q["queue"] == "sim")
    assert sim["unfinished"]["pending"] == 1 and sim["oldest_pending_seconds"] is not None
    [cause] = overview["failures"]
    assert (cause["count"], cause["error_code"], cause["queue"]) == (
        3,
        "TRANSIENT_EXTERNAL",
        "erp_dlq",
    )
    text = page.content.decode()
    assert "3 open dead letter(s) wait for a decision." in text
    assert "No live dispatcher" in text  # none runs in this test
    link = "/admin/jobs/deadletter/?queue=erp_dlq&amp;error_code=TRANSIENT_EXTERNAL"
    assert link in text
    assert 'data-refresh-url="/admin/dashboard/panel/"' in text


def test_the_panel_alone_is_what_the_page_refreshes(viewer, broker):
    panel = viewer.get("/admin/dashboard/panel/")
    assert panel.status_code == 200
    assert b'id="queues"' in panel.content and b"<html" not in panel.content


def _queue_row(panel: str, queue: str) -> str:
    start = panel.index(f'data-queue="{queue}"')
    return panel[start : panel.index("</tr>", start)]


def test_a_queue_on_postgresql_shows_no_broker_rather_than_unknown_depths(viewer, broker, settings):
    settings.JOBOPS_QUEUE_EXECUTORS = {**settings.JOBOPS_QUEUE_EXECUTORS, "sim": "postgres"}
    panel = viewer.get("/admin/dashboard/panel/").content.decode()
    sim, erp = _queue_row(panel, "sim"), _queue_row(panel, "erp")
    assert "—, no broker" in sim and "runs on PostgreSQL (run_worker)" in sim
    assert ">?<" not in sim and "/admin/jobs/deadletter/peek/sim_dlq/" not in sim
    # A queue on the broker keeps its depths (read from this run's vhost).
    assert "no broker" not in erp and "/admin/jobs/deadletter/peek/erp_dlq/" in erp
    assert ">Broker</th>" in panel


@pytest.mark.parametrize(
    "unsafe_next", ["https://evil.example", "//evil.example/admin/", "javascript:alert(1)"]
)
def test_a_login_with_an_unsafe_next_lands_on_the_portal_index(client, unsafe_next):
    user = role_user("operator")
    form = {
        "username": user.username,
        "password": "pw-for-tests",
        "otp_token": totp_code(totp_device(user)),
        "next": unsafe_next,
    }
    login = client.post("/admin/login/", form)
    assert login.status_code == 302
    assert login["Location"] == "/admin/"
    assert client.get(login["Location"]).status_code == 200


def test_the_dashboard_is_for_otp_verified_staff_only(client):
    assert client.get("/admin/dashboard/panel/").status_code == 302
    client.force_login(role_user("operator"))  # password only
    assert client.get("/admin/dashboard/panel/").status_code == 302


def test_viewers_share_one_computation_for_a_few_seconds(settings, broker):
    settings.JOBOPS_DASHBOARD_CACHE_SECONDS = 30
    cache.delete(CACHE_KEY)
    first = dashboard_overview()
    make_job()
    assert dashboard_overview()["generated_at"] == first["generated_at"]
    assert dashboard_overview(use_cache=False)["generated_at"] > first["generated_at"]
    cache.delete(CACHE_KEY)


def test_the_dashboard_says_so_when_rabbitmq_is_away(viewer, settings):
    settings.BROKER_URL = "amqp://guest:guest@127.0.0.1:1/"
    page = viewer.get("/admin/")
    assert page.status_code == 200
    assert "RabbitMQ unreachable" in page.content.decode()
    assert all(q["depth"] is None for q in page.context["overview"]["queues"])


def test_one_nodes_broker_trouble_shows_on_its_own_dashboard_only(
    viewer, settings, broker, monkeypatch
):
    """Two web nodes share the snapshot in Redis; one of them has a wrong BROKER_URL."""
    settings.JOBOPS_DASHBOARD_CACHE_SECONDS = 30
    monkeypatch.setattr(dashboard, "_views", {})  # no earlier test's look at the broker
    cache.delete(CACHE_KEY)
    healthy_url, broken_url = settings.BROKER_URL, "amqp://guest:guest@127.0.0.1:1/"
    seen_from_here = f"RabbitMQ unreachable from web node {socket.gethostname()}: "
    try:
        settings.BROKER_URL = broken_url
        broken = dashboard_overview()  # the broken node computes and shares the snapshot
        assert broken["problems"][0].startswith(seen_from_here)
        assert all(q["depth"] is None for q in broken["queues"])

        settings.BROKER_URL = healthy_url
        page = viewer.get("/admin/")
        healthy = page.context["overview"]
        assert healthy["generated_at"] == broken["generated_at"]  # the same snapshot
        assert "RabbitMQ unreachable" not in page.content.decode()
        assert healthy["health"]["broker_error"] is None
        assert all(q["depth"] == 0 and q["dlq_depth"] == 0 for q in healthy["queues"])

        cache.delete(CACHE_KEY)
        healthy = dashboard_overview()  # now the healthy node shares the snapshot
        settings.BROKER_URL = broken_url
        broken = dashboard_overview()
        assert broken["generated_at"] == healthy["generated_at"]
        assert all(q["depth"] == 0 for q in broken["queues"])  # read by the healthy node
        assert broken["problems"][0].startswith(seen_from_here)
        assert broken["node"]["host"] == socket.gethostname()
    finally:
        settings.BROKER_URL = healthy_url
        cache.delete(CACHE_KEY)


def test_celery_results_are_read_only_even_for_a_superuser():
    superuser = otp_login(Client(), role_user("operator", is_superuser=True))
    result = TaskResult.objects.create(task_id="t-1", status="SUCCESS")
    group = GroupResult.objects.create(group_id="g-1")
    base = "/admin/django_celery_results"
    assert superuser.get(f"{base}/taskresult/{result.pk}/change/").status_code == 200
    for url, data in (
        (f"{base}/taskresult/add/", {"task_id": "t-2"}),
        (f"{base}/taskresult/{result.pk}/change/", {"status": "FAILURE"}),
        (f"{base}/taskresult/{result.pk}/delete/", {"post": "yes"}),
        (f"{base}/groupresult/{group.pk}/delete/", {"post": "yes"}),
    ):
        assert superuser.post(url, data).status_code == 403, url
    page = superuser.get(f"{base}/taskresult/")
    assert page.context["action_form"] is None  # no bulk delete either
    assert TaskResult.objects.get(pk=result.pk).status == "SUCCESS"
    assert GroupResult.objects.filter(pk=group.pk).exists()


def test_otp_devices_are_hidden_from_staff_and_show_no_secret_to_a_superuser():
    owner = role_user("operator")
    device = totp_device(owner)
    backup = StaticDevice.objects.create(user=owner, name="backup", confirmed=True)
    StaticToken.objects.create(device=backup, token="secret77")
    staff = otp_login(Client(), role_user("operator"))
    assert b"otp_totp" not in staff.get("/admin/").content
    assert staff.get(f"/admin/otp_totp/totpdevice/{device.pk}/change/").status_code == 403
    superuser = otp_login(Client(), role_user("operator", is_superuser=True))
    page = superuser.get(f"/admin/otp_totp/totpdevice/{device.pk}/change/")
    assert page.status_code == 200 and device.key.encode() not in page.content
    for url in (f"{device.pk}/config/", f"{device.pk}/qrcode/"):
        assert superuser.get(f"/admin/otp_totp/totpdevice/{url}").status_code == 403
    static = superuser.get(f"/admin/otp_static/staticdevice/{backup.pk}/change/")
    assert static.status_code == 200 and b"secret77" not in static.content
    for url, data in (
        (f"/admin/otp_totp/totpdevice/{device.pk}/change/", {"name": "mine"}),
        (f"/admin/otp_totp/totpdevice/{device.pk}/delete/", {"post": "yes"}),
        ("/admin/otp_totp/totpdevice/add/", {"name": "x"}),
        (f"/admin/otp_static/staticdevice/{backup.pk}/delete/", {"post": "yes"}),
    ):
        assert superuser.post(url, data).status_code == 403, url
    device.refresh_from_db()
    assert device.name == "phone"


def test_the_login_form_says_when_a_throttled_code_may_be_tried_again(settings):
    # django-otp waits FACTOR * 2**(failures - 1) s after a wrong code: a minute after two
    # here, so that the right code below meets the wait however slowly the machine runs
    # (at the default factor, 1, a loaded machine once took the 2 s before it came).
    settings.OTP_TOTP_THROTTLE_FACTOR = 30
    user = StaffFactory(username="erin")
    device = totp_device(user)
    wrong = f"{(int(totp_code(device)) + 1) % 1_000_000:06d}"

    def login(code: str):
        return Client().post(
            "/admin/login/?next=/admin/",
            {"username": "erin", "password": "pw-for-tests", "otp_token": code},
        )

    assert login(wrong).status_code == 200
    assert login(wrong).status_code == 200
    page = login(totp_code(device))  # right, but within the wait
    assert page.status_code == 200
    assert b"Too many wrong codes in a row" in page.content
    assert b"Try again in " in page.content


def test_the_pages_load_only_where_urls_do_and_the_admin_check_still_sees_them():
    """Workers and dispatchers skip the portal's pages at start-up (config/apps.py);
    `manage.py check` must still check every page, whichever order its checks run in."""

    from tests.processes import run_python

    code = (
        "import django; django.setup()\n"
        "from django.contrib import admin\n"
        "from jobs.models import Job\n"
        "print(admin.site.is_registered(Job))\n"
        "from django.core import checks\n"
        "checks.run_checks(tags=[checks.Tags.admin])\n"
        "print(admin.site.is_registered(Job))\n"
        "from config.admin_site import JobopsAdminSite\n"
        "print(type(admin.site._wrapped).__name__)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", "JobopsAdminSite"]
