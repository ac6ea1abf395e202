from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
# The sizes the pages are made for: a laptop, and a phone held upright.
LAPTOP = (1366, 768)
PHONE = (390, 844)


def _options(extra: tuple[str, ...] = ()):
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        *extra,
    ):
        options.add_argument(flag)
    return options


def _driver(extra: tuple[str, ...] = ()) -> tuple[WebDriver, str]:
    """Headless Debian Chromium driven by its own chromedriver (no downloads)."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("Debian chromium + chromium-driver are not installed (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="jobops-chromium-")
    driver = webdriver.Chrome(
        service=Service(CHROMEDRIVER), options=_options((*extra, f"--user-data-dir={profile}"))
    )
    driver.set_page_load_timeout(30)
    viewport(driver, *LAPTOP)
    return driver, profile


class Chromium:
    """One Chromium for many tests: starting one costs seconds of a 2-core machine's CPU
    per test, the reset between two tests a few milliseconds.

    Each test gets it as a fresh one would be: one tab on about:blank at laptop size, no
    cookies, no cache, no storage of any site it visited, no permission granted. A driver
    that fails the reset (a test left an alert open, the browser crashed) is replaced."""

    def __init__(self, extra: tuple[str, ...] = ()) -> None:
        self.extra = extra
        self.driver: WebDriver | None = None
        self.profile: str | None = None

    def take(self) -> WebDriver:
        """The driver, clean: the last test's handover, checked; else a new browser."""
        if self.driver is not None:
            try:
                handles = self.driver.window_handles
                if len(handles) == 1 and self.driver.current_url == "about:blank":
                    return self.driver
            except Exception:  # a browser that does not answer is replaced
                pass
            self.close()
        driver, self.profile = _driver(self.extra)
        driver.get("about:blank")  # not the new-tab page a new browser shows
        self.driver = driver
        return driver

    def hand_back(self) -> None:
        """After a test: everything it left in the browser goes (its pages with them, so
        none of them polls the server while the test's data is flushed)."""
        if self.driver is None:
            return
        try:
            reset(self.driver)
        except Exception:  # chromedriver's errors, or its process gone (urllib3's)
            self.close()

    def close(self) -> None:
        if self.driver is not None:
            try:
                self.driver.quit()
            except Exception:  # already gone: its profile is removed all the same
                pass
        if self.profile is not None:
            shutil.rmtree(self.profile, ignore_errors=True)
        self.driver, self.profile = None, None


def reset(driver: WebDriver) -> None:
    """Back to a new browser's state. Each tab the test had is closed for one new blank
    tab (their scripts stop, their sessionStorage and history go, the emulated size with
    them); cookies and the HTTP cache are browser-wide; localStorage, IndexedDB and the
    rest are kept per origin: each origin in the closed tabs' histories is cleared."""
    tabs = driver.window_handles
    driver.switch_to.new_window("tab")
    blank = driver.current_window_handle
    origins = set()
    for tab in tabs:
        driver.switch_to.window(tab)
        for entry in driver.execute_cdp_cmd("Page.getNavigationHistory", {})["entries"]:
            url = urlsplit(entry["url"])
            if url.scheme in ("http", "https"):
                origins.add(f"{url.scheme}://{url.netloc}")
        driver.close()
    driver.switch_to.window(blank)
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.execute_cdp_cmd("Network.clearBrowserCache", {})
    for origin in sorted(origins):
        driver.execute_cdp_cmd(
            "Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"}
        )
    driver.execute_cdp_cmd("Browser.resetPermissions", {})
    viewport(driver, *LAPTOP)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    """This xdist worker's Chromium, started by the first test that asks for `browser`."""
    shared = Chromium()
    yield shared
    shared.close()


@pytest.fixture
def browser(chromium: Chromium) -> Iterator[WebDriver]:
    yield chromium.take()
    chromium.hand_back()


@pytest.fixture
def offline_browser() -> Iterator[WebDriver]:
    """A browser that reaches this machine and nothing else: no CDN, no font service.
    Its own, for its flags (one test asks for it)."""
    rules = "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"
    own = Chromium((f"--host-resolver-rules={rules}",))
    yield own.take()
    own.close()


def viewport(driver, width: int, height: int, *, mobile: bool = False) -> None:
    """Exactly this many CSS pixels of page (a window size would include browser chrome)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
    )


def settled(driver) -> None:
    """Wait until the page has laid out and painted at its present size: two animation
    frames (the first lays out at the new size, the second begins after its paint), not
    a fixed sleep."""
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "requestAnimationFrame(() => requestAnimationFrame(() => done(true)))"
    )


def shoot(driver, name: str, at: str | None = None) -> list[Path]:
    """Save what an operator sees now, at laptop and at phone width, under var/screenshots/;
    `at`: a CSS selector scrolled to the top first at each width (a panel below the fold)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    saved = []
    for (width, height), tag, mobile in ((LAPTOP, "laptop", False), (PHONE, "phone", True)):
        viewport(driver, width, height, mobile=mobile)
        settled(driver)
        if at is not None:
            driver.execute_script(
                "const e = document.querySelector(arguments[0]); if (e) e.scrollIntoView()", at
            )
        path = SCREENSHOTS / f"{name}-{tag}.png"
        driver.save_screenshot(str(path))
        saved.append(path)
    viewport(driver, *LAPTOP)
    return saved


def next_page(driver, act: Callable[[], object], timeout: float = 15) -> None:
    """Do `act` (a click that submits a form or follows a link) and wait until the next
    page has loaded: click() returns before the answer replaces the page.

    A mark left on this page's window is gone once another document is loaded. Asking for
    it is safe while the page is being replaced; asking an element of the old page whether
    it is stale can fail there with chromedriver's "Node with given id does not belong to
    the document", which is why a failed question is asked again."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    driver.execute_script("window.jobopsPageLeft = true")
    act()
    WebDriverWait(driver, timeout, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(
            "return !window.jobopsPageLeft && document.readyState === 'complete'"
        )
    )
