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


def test_an_oversize_password_checks_nothing_and_an_oversize_code_counts_the_password(
    carol, settings
):
    """A 300,000-character password is refused by its bound, in words, before it is
    checked (nothing to count). A 300,000-character code is refused too, but the
    password beside it was checked: a wrong one counts towards the name's lockout."""
    from axes.models import AccessAttempt

    def post(**fields: str):
        form = {"username": "carol", "password": "wrong", "otp_token": "000000", **fields}
        return Client(REMOTE_ADDR="10.3.3.4", raise_request_exception=False).post(LOGIN, form)

    answer = post(password="p" * 300_000)
    assert answer.status_code == 200
    assert "at most 4096 characters" in answer.content.decode()
    assert not AccessAttempt.objects.exists()
    answer = post(otp_token="1" * 300_000)
    assert answer.status_code == 200
    assert "at most 64 characters" in answer.content.decode()
    assert AccessAttempt.objects.get(username="carol").failures_since_start == 1
    for _ in range(settings.AXES_FAILURE_LIMIT - 2):
        assert _login("carol", "wrong", ip="10.3.3.5").status_code == 200
    assert _login("carol", "wrong", ip="10.3.3.6").status_code == 429


def test_a_name_longer_than_axes_stores_is_counted_cut_when_authenticate_is_called_directly():
    """Any other caller of authenticate() than the portal's form: axes counts the failure
    under the first 255 characters (AXES_USERNAME_CALLABLE), never a 500."""
    from axes.models import AccessAttempt
    from django.contrib.auth import authenticate
    from django.test import RequestFactory

    request = RequestFactory().post(LOGIN, REMOTE_ADDR="10.3.3.7")
    assert authenticate(request, username="n" * 300, password="wrong") is None
    (attempt,) = AccessAttempt.objects.all()
    assert attempt.username == "n" * 255 and attempt.failures_since_start == 1


def test_after_a_wrong_code_the_login_offers_no_device_choice_or_challenge(carol):
    """Issue 37, L15: "OTP Device" and "Get OTP Challenge" did nothing for TOTP devices
    and backup codes (the only kinds jobops enrols): the form has neither."""
    answer = _login("carol", PASSWORD, "000000")
    page = answer.content.decode()
    assert answer.status_code == 200 and "Invalid token" in page  # the password was right
    assert "OTP Device" not in page and "otp_device" not in page
    assert "Get OTP Challenge" not in page and "otp_challenge" not in page
    assert 'name="otp_token"' in page and "One-time code" in page
