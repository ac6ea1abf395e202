"""POST /api/v1/admin/otp: a current TOTP code becomes a 15-minute grant on the caller's token."""

from __future__ import annotations

import time

import pytest
from django.core.cache import cache
from django_otp.plugins.otp_totp.models import TOTPDevice
from rest_framework.authtoken.models import Token

from core.api.otp import key_digest, otp_grant_for
from tests.factories import StaffFactory, UserFactory, client_for, totp_code, totp_device

pytestmark = pytest.mark.django_db
OTP_URL = "/api/v1/admin/otp"
DLQ_URL = "/api/v1/admin/dlq"


@pytest.fixture(autouse=True)
def _fresh_limits():
    cache.clear()  # the admin throttle counts in the cache (this run's Redis db)


@pytest.fixture
def staff():
    user = StaffFactory()
    return user, totp_device(user), client_for(user)


def test_a_current_code_grants_fifteen_minutes_of_admin_calls(staff):
    _, device, api = staff
    assert api.get(DLQ_URL).status_code == 401
    granted = api.post(OTP_URL, {"otp_token": totp_code(device)}, format="json")
    assert granted.status_code == 200, granted.content
    assert 890 <= granted.json()["expires_in"] <= 900
    assert api.get(DLQ_URL).status_code == 200


def test_each_code_grants_once(staff):
    _, device, api = staff
    code = totp_code(device)
    assert api.post(OTP_URL, {"otp_token": code}, format="json").status_code == 200
    again = api.post(OTP_URL, {"otp_token": code}, format="json")
    assert again.status_code == 401 and again.json()["error"]["code"] == "ERR-OTP-401"


def test_a_wrong_code_is_refused_and_counted_for_throttling(staff):
    _, device, api = staff
    wrong = f"{(int(totp_code(device)) + 1) % 1_000_000:06d}"
    refused = api.post(OTP_URL, {"otp_token": wrong}, format="json")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "ERR-OTP-401"
    assert "WWW-Authenticate" in refused
    assert TOTPDevice.objects.get(id=device.id).throttling_failure_count == 1
    assert api.get(DLQ_URL).status_code == 401


def test_the_grant_is_bound_to_the_token_it_was_asked_with(staff):
    user, device, api = staff
    assert api.post(OTP_URL, {"otp_token": totp_code(device)}, format="json").status_code == 200
    old_key = Token.objects.get(user=user).key
    Token.objects.filter(user=user).delete()  # rotate the token
    new_api = client_for(user)
    assert new_api.get(DLQ_URL).json()["error"]["code"] == "ERR-DLQ-401"
    assert (
        otp_grant_for(token_digest=key_digest(old_key), user=UserFactory()) is None
    )  # not another user's


def test_the_grant_ends_after_its_time(staff, settings):
    settings.JOBOPS_OTP_GRANT_SECONDS = 1
    _, device, api = staff
    assert api.post(OTP_URL, {"otp_token": totp_code(device)}, format="json").status_code == 200
    assert api.get(DLQ_URL).status_code == 200
    time.sleep(1.2)
    assert api.get(DLQ_URL).status_code == 401


def test_grants_are_for_staff_with_a_totp_device():
    outsider = UserFactory()
    device = totp_device(outsider)
    refused = client_for(outsider).post(OTP_URL, {"otp_token": totp_code(device)}, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "ERR-OTP-403"
    no_device = client_for(StaffFactory()).post(OTP_URL, {"otp_token": "123456"}, format="json")
    assert no_device.status_code == 403


def test_the_grant_call_needs_a_token_and_a_well_formed_body(staff):
    _, _, api = staff
    anonymous = client_for(UserFactory())
    anonymous.credentials()
    assert anonymous.post(OTP_URL, {"otp_token": "123456"}, format="json").status_code == 401
    for body in ({}, {"otp_token": 123456}, {"otp_token": "12ab56"}, {"otp_token": "1", "x": 1}):
        bad = api.post(OTP_URL, body, format="json")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "ERR-OTP-400", body


def test_while_wrong_codes_throttle_the_device_even_a_right_code_is_told_when_to_retry(staff):
    _, device, api = staff
    wrong = f"{(int(totp_code(device)) + 1) % 1_000_000:06d}"
    for _ in range(3):  # django-otp then waits 2**(3-1) = 4 s before it checks a code again
        api.post(OTP_URL, {"otp_token": wrong}, format="json")
    waiting = api.post(OTP_URL, {"otp_token": totp_code(device)}, format="json")
    assert waiting.status_code == 429, waiting.content
    assert waiting.json()["error"]["code"] == "ERR-OTP-429"
    assert "wrong codes" in waiting.json()["error"]["message"]
    assert 1 <= int(waiting["Retry-After"]) <= 4
    time.sleep(int(waiting["Retry-After"]))
    assert api.post(OTP_URL, {"otp_token": totp_code(device)}, format="json").status_code == 200
