"""The operator portal asks for password AND a one-time password, in a real browser."""

from __future__ import annotations

import pytest
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice
from selenium.webdriver.common.by import By

from tests.browser.conftest import next_page, shoot
from tests.factories import UserFactory, totp_code

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def operator():
    user = UserFactory(username="operator", is_staff=True, is_superuser=True)
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    backup = StaticDevice.objects.create(user=user, name="backup", confirmed=True)
    StaticToken.objects.create(device=backup, token="backup01")
    return user, device


def _login(browser, live_server, password: str, token: str, *, screenshot: str = "") -> None:
    browser.get(f"{live_server.url}/admin/")
    assert "/admin/login/" in browser.current_url
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.find_element(By.NAME, "otp_token").send_keys(token)
    if screenshot:
        shoot(browser, screenshot)
    # The assertions must read the POST's answer, not the form that was just submitted.
    next_page(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click)


def test_login_form_asks_for_password_and_otp(browser, live_server, operator):
    browser.get(f"{live_server.url}/admin/")
    names = {e.get_attribute("name") for e in browser.find_elements(By.CSS_SELECTOR, "input")}
    assert {"username", "password", "otp_token"} <= names


def test_password_without_valid_otp_is_refused(browser, live_server, operator):
    _login(browser, live_server, "pw-for-tests", "000000")
    assert "/admin/login/" in browser.current_url
    assert "Dashboard" not in browser.title
    shoot(browser, "01-login-refused-without-otp")


def test_password_and_totp_code_open_the_portal(browser, live_server, operator):
    _, device = operator
    _login(browser, live_server, "pw-for-tests", totp_code(device), screenshot="00-login")
    assert "/admin/login/" not in browser.current_url
    assert "Dashboard" in browser.title


def test_a_backup_token_works_once(browser, live_server, operator):
    _login(browser, live_server, "pw-for-tests", "backup01")
    assert "Dashboard" in browser.title
    browser.delete_all_cookies()
    _login(browser, live_server, "pw-for-tests", "backup01")
    assert "/admin/login/" in browser.current_url


def test_an_unsafe_next_after_login_lands_on_the_dashboard(browser, live_server, operator):
    _, device = operator
    browser.get(f"{live_server.url}/admin/login/?next=https://evil.example/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys("pw-for-tests")
    browser.find_element(By.NAME, "otp_token").send_keys(totp_code(device))
    next_page(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click)
    assert browser.current_url == f"{live_server.url}/admin/"
    assert "Dashboard" in browser.title
