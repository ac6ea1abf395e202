from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

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


def _driver(extra: tuple[str, ...] = ()):
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


@pytest.fixture
def browser():
    driver, profile = _driver()
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def offline_browser():
    """A browser that reaches this machine and nothing else: no CDN, no font service."""
    rules = "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"
    driver, profile = _driver((f"--host-resolver-rules={rules}",))
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


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
