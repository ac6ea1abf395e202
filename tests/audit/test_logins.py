"""Portal login throttling (django-axes): lockouts per user and per address, audited on
the ops chain by user id only, lifted by time or by `manage.py login_unlock`."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from audit.models import AuditLog
from audit.services import OPS_CHAIN
from tests.factories import StaffFactory, totp_code, totp_device

pytestmark = pytest.mark.django_db
LOGIN = "/admin/login/?next=/admin/"
PASSWORD = "pw-for-tests"  # StaffFactory's


def _login(username: str, password: str, token: str = "000000", ip: str = "10.0.0.1"):
    return Client(REMOTE_ADDR=ip).post(
        LOGIN, {"username": username, "password": password, "otp_token": token}
    )


def _ops(event_type: str) -> list[AuditLog]:
    return list(AuditLog.objects.filter(chain=OPS_CHAIN, event_type=event_type).order_by("seq"))


@pytest.fixture
def carol():
    user = StaffFactory(username="carol")
    return user, totp_device(user)


def test_wrong_passwords_lock_the_user_out_with_a_clear_wait(carol, settings):
    _, device = carol
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login("carol", "wrong").status_code == 200  # the form again
    locked = _login("carol", "wrong")
    assert locked.status_code == 429
    assert locked["Retry-After"] == str(settings.JOBOPS_LOGIN_LOCKOUT_MINUTES * 60)
    assert b"Try again in 15 minutes" in locked.content
    # The right password and a current code are refused too, from any address.
    again = _login("carol", PASSWORD, totp_code(device), ip="10.9.9.9")
    assert again.status_code == 429


def test_wrong_passwords_from_one_address_lock_that_address_out(settings):
    for n in range(settings.AXES_FAILURE_LIMIT):
        _login(f"nobody-{n}", "wrong", ip="10.0.0.7")
    victim = StaffFactory(username="dora")
    assert (
        _login("dora", PASSWORD, totp_code(totp_device(victim)), ip="10.0.0.7").status_code == 429
    )
    assert (
        _login("dora", PASSWORD, totp_code(totp_device(victim)), ip="10.0.0.8").status_code == 302
    )


def test_a_lockout_is_audited_once_by_user_id_without_the_typed_name_or_address(carol, settings):
    user, _ = carol
    for _ in range(settings.AXES_FAILURE_LIMIT + 3):
        _login("carol", "wrong", ip="10.1.2.3")
    (entry,) = _ops("login_locked_out")
    data = json.loads(entry.payload)["data"]
    assert data == {"user_id": user.pk, "failures": settings.AXES_FAILURE_LIMIT, "minutes": 15}
    assert "carol" not in entry.payload and "10.1.2.3" not in entry.payload


def test_a_lockout_of_an_unknown_name_is_audited_without_a_user(settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login("my-password-typed-as-a-name", "wrong")
    (entry,) = _ops("login_locked_out")
    assert json.loads(entry.payload)["data"]["user_id"] is None
    assert "my-password" not in entry.payload


def test_login_unlock_lifts_the_lockout_and_is_audited(carol, settings):
    user, device = carol
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login("carol", "wrong", ip="10.0.0.2")
    assert _login("carol", PASSWORD, totp_code(device), ip="10.0.0.2").status_code == 429
    out = StringIO()
    call_command("login_unlock", "carol", stdout=out)
    assert "Unlocked user carol" in out.getvalue()
    (entry,) = _ops("login_unlocked")
    assert json.loads(entry.payload)["data"] == {"user_id": user.pk, "scope": "username"}
    assert _login("carol", PASSWORD, totp_code(device), ip="10.0.0.2").status_code == 302


def test_login_unlock_of_an_address_lifts_its_lockout(carol, settings):
    _, device = carol
    for n in range(settings.AXES_FAILURE_LIMIT):
        _login(f"guess-{n}", "wrong", ip="10.0.0.3")
    assert _login("carol", PASSWORD, totp_code(device), ip="10.0.0.3").status_code == 429
    call_command("login_unlock", "--ip", "10.0.0.3", stdout=StringIO())
    (entry,) = _ops("login_unlocked")
    assert json.loads(entry.payload)["data"] == {"user_id": None, "scope": "address"}
    assert "10.0.0.3" not in entry.payload
    assert _login("carol", PASSWORD, totp_code(device), ip="10.0.0.3").status_code == 302


def test_login_unlock_of_someone_not_locked_changes_nothing():
    out = StringIO()
    call_command("login_unlock", "nobody", stdout=out)
    assert "nothing to unlock" in out.getvalue()
    assert _ops("login_unlocked") == []


def test_a_successful_login_clears_the_count(carol, settings):
    _, device = carol
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _login("carol", "wrong")
    assert _login("carol", PASSWORD, totp_code(device)).status_code == 302
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login("carol", "wrong").status_code == 200


def test_what_axes_keeps_of_a_failure_holds_no_password_code_or_csrf_token(carol):
    from axes.models import AccessAttempt

    Client(REMOTE_ADDR="10.0.0.9").post(
        LOGIN,
        {
            "username": "carol",
            "password": "secret-guess",
            "otp_token": "424242",
            "csrfmiddlewaretoken": "csrf-value",
        },
    )
    (attempt,) = AccessAttempt.objects.all()
    for secret in ("secret-guess", "424242", "csrf-value"):
        assert secret not in attempt.post_data


@pytest.mark.parametrize("length", [151, 256, 300_000])
def test_an_oversize_name_gets_the_form_with_its_bound_and_checks_no_password(carol, length):
    """Issue 37, M1: a name longer than any user's (150 characters) answered 500 when
    axes stored it in its varchar(255). The form refuses it before any password is
    checked, so it is no attempt to count and no way around a lockout."""
    from axes.models import AccessAttempt

    answer = Client(REMOTE_ADDR="10.3.3.3", raise_request_exception=False).post(
        LOGIN, {"username": "c" * length, "password": "wrong", "otp_token": "000000"}
    )
    assert answer.status_code == 200
    assert "at most 150 characters" in answer.content.decode()
    assert not AccessAttempt.objects.exists()


def test_an_oversize_password_or_code_gets_the_form_and_counts_as_a_failure(carol, settings):
    """A 300,000-character password or code is refused by its bound in words; with a
    real name it still counts towards that name's lockout."""
    for field in ("password", "otp_token"):
        fields = {"username": "carol", "password": "wrong", "otp_token": "000000"}
        fields[field] = "p" * 300_000
        answer = Client(REMOTE_ADDR="10.3.3.4", raise_request_exception=False).post(LOGIN, fields)
        assert answer.status_code == 200
        assert "at most" in answer.content.decode()
    for _ in range(settings.AXES_FAILURE_LIMIT - 2):
        assert _login("carol", "wrong", ip="10.3.3.5").status_code == 200
    assert _login("carol", "wrong", ip="10.3.3.6").status_code == 429
