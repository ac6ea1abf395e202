"""MFA lifecycle commands: enroll a TOTP device (URI + QR code), issue backup tokens, and
the first administrator that `make run` creates."""

from __future__ import annotations

import re
from io import StringIO
from urllib.parse import parse_qs, urlparse

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django_otp.oath import TOTP
from django_otp.plugins.otp_static.models import StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from tests.factories import StaffFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_throttling(settings):
    # A refused code makes django-otp wait before the next try; these tests try at once.
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    settings.OTP_STATIC_THROTTLE_FACTOR = 0


def _run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _code_from_uri(uri: str) -> str:
    """What an authenticator app shows after scanning `uri` (base32 secret, 30 s, 6 digits)."""
    import base64

    secret = parse_qs(urlparse(uri).query)["secret"][0]
    key = base64.b32decode(secret + "=" * (-len(secret) % 8))
    return f"{TOTP(key, step=30, digits=6).token():06d}"


def _login(username: str, password: str, token: str) -> int:
    page = Client().post(
        "/admin/login/?next=/admin/",
        {"username": username, "password": password, "otp_token": token},
    )
    return page.status_code  # 302 to the portal, 200 = the form again


def test_enroll_prints_the_uri_and_a_qr_code_that_log_the_user_in():
    StaffFactory(username="carol")
    out = _run("otp_enroll", "carol")
    uri = re.search(r"otpauth://totp/\S+", out).group(0)
    assert "issuer=jobops" in uri
    assert "\u2588" in out or "\u2580" in out  # the QR code, drawn in the terminal
    assert TOTPDevice.objects.filter(user__username="carol", confirmed=True).count() == 1
    assert _login("carol", "pw-for-tests", _code_from_uri(uri)) == 302


def test_enroll_keeps_an_existing_device_unless_asked_to_replace_it():
    StaffFactory(username="dave")
    first = re.search(r"otpauth://\S+", _run("otp_enroll", "dave")).group(0)
    with pytest.raises(CommandError, match="--replace"):
        _run("otp_enroll", "dave")
    second = re.search(r"otpauth://\S+", _run("otp_enroll", "dave", "--replace")).group(0)
    assert TOTPDevice.objects.filter(user__username="dave").count() == 1
    assert _login("dave", "pw-for-tests", _code_from_uri(first)) == 200  # the lost phone
    assert _login("dave", "pw-for-tests", _code_from_uri(second)) == 302


def test_backup_tokens_replace_the_old_ones_and_work_once():
    StaffFactory(username="erin")
    old = re.findall(r"^  (\w+)$", _run("otp_backup_tokens", "erin", "--count", "3"), re.M)
    new = re.findall(r"^  (\w+)$", _run("otp_backup_tokens", "erin"), re.M)
    assert len(old) == 3 and len(new) == 10
    assert StaticToken.objects.filter(device__user__username="erin").count() == 10
    assert _login("erin", "pw-for-tests", old[0]) == 200
    assert _login("erin", "pw-for-tests", new[0]) == 302
    assert _login("erin", "pw-for-tests", new[0]) == 200  # used up


def test_the_commands_refuse_unknown_users_and_silly_counts():
    UserFactory(username="frank")
    with pytest.raises(CommandError, match="no user"):
        _run("otp_enroll", "ghost")
    with pytest.raises(CommandError, match="between 1 and 50"):
        _run("otp_backup_tokens", "frank", "--count", "0")


def test_the_first_administrator_of_make_run_still_logs_in():
    out = _run("bootstrap_admin")
    password = re.search(r"password: (\S+)", out).group(1)
    uri = re.search(r"TOTP URI: (\S+)", out).group(1)
    tokens = re.search(r"backup tokens: (.+)$", out, re.M).group(1).split()
    assert len(tokens) == 6 and ("\u2588" in out or "\u2580" in out)
    assert _login("admin", password, _code_from_uri(uri)) == 302
    assert _login("admin", password, tokens[0]) == 302
    assert "nothing to do" in _run("bootstrap_admin")
