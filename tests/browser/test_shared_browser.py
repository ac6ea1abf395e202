"""The Chromium the browser tests share (tests/browser/conftest.py `Chromium`): each test
gets it as a new browser would be, and one a test broke is replaced. Both use this
worker's shared browser, as every other test does (no browser started for them alone)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import LAPTOP, PHONE, Chromium, viewport

pytestmark = pytest.mark.browser


def state(driver) -> dict[str, object]:
    """What one test could leave for the next, read on the page now shown."""
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "navigator.permissions.query({name: 'clipboard-read'}).then(p => done({"
        " local: localStorage.getItem('left'), session: sessionStorage.getItem('left'),"
        " cookie: document.cookie.includes('left=behind'), clipboard: p.state,"
        " size: [innerWidth, innerHeight]}))"
    )


@pytest.mark.django_db(transaction=True)  # the live server's
def test_the_next_test_gets_the_same_browser_with_nothing_left_behind(
    chromium: Chromium, live_server
):
    try:
        driver = chromium.take()
        page = f"{live_server.url}/admin/login/"
        driver.get(page)
        driver.execute_script(
            "localStorage.setItem('left', 'behind'); sessionStorage.setItem('left', 'behind');"
            "document.cookie = 'left=behind; path=/'"
        )
        driver.execute_cdp_cmd(
            "Browser.grantPermissions",
            {"origin": live_server.url, "permissions": ["clipboardReadWrite"]},
        )
        driver.switch_to.new_window("tab")  # and a second tab, on the same page
        driver.get(page)
        driver.execute_script("sessionStorage.setItem('left', 'behind')")
        viewport(driver, *PHONE, mobile=True)
        left = state(driver)
        assert left == {
            "local": "behind",
            "session": "behind",
            "cookie": True,
            "clipboard": "granted",
            "size": list(PHONE),
        }, left

        chromium.hand_back()  # what the `browser` fixture does after a test
        again = chromium.take()  # and before the next
        assert again is driver  # no new browser: the reset worked
        assert again.current_url == "about:blank" and len(again.window_handles) == 1
        assert again.execute_cdp_cmd("Storage.getCookies", {})["cookies"] == []
        again.get(page)
        found = state(again)
        assert found == {
            "local": None,
            "session": None,
            "cookie": False,
            "clipboard": "prompt",
            "size": list(LAPTOP),
        }, found
    finally:
        chromium.hand_back()  # clean for the worker's next test


def test_a_browser_left_broken_is_replaced(chromium: Chromium):
    try:
        broken = chromium.take()
        broken.quit()  # as good as crashed: its chromedriver is gone
        chromium.hand_back()
        fresh = chromium.take()
        assert fresh is not broken
        assert fresh.current_url == "about:blank"
        assert fresh.execute_script("return [innerWidth, innerHeight]") == list(LAPTOP)
    finally:
        chromium.hand_back()
