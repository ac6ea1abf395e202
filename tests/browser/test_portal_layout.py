"""What an operator must reach without a sideways scroll (docs/operations/portal.md): the
job list whole beside its filters on a 1440-pixel laptop, "Run at" included; a dead
letter cause's Replay and Discard on a phone held upright."""

from __future__ import annotations

import pytest

from jobs.services import job_create
from tenants.selectors import Placement
from tests.browser.conftest import SCREENSHOTS, settled, viewport
from tests.browser.test_portal import log_in, wait
from tests.factories import (
    OrganisationFactory,
    ProjectFactory,
    UserFactory,
    job_failed,
    job_in_state,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDE = (1440, 900)
PHONE = (390, 844)


def at(browser, size: tuple[int, int], name: str, *, mobile: bool = False) -> None:
    """Show the page at `size`, let it lay out, and keep what it looked like."""
    viewport(browser, *size, mobile=mobile)
    settled(browser)  # laid out and painted at this width, for the screenshot
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def box(browser, css: str) -> list[dict[str, float]]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => {"
        " const r = e.getBoundingClientRect();"
        " return {left: r.left, right: r.right, text: e.textContent.trim()}; })",
        css,
    )


def overflow(browser, css: str) -> list[int]:
    """[scrollWidth, clientWidth] of each element `css` selects: wider content scrolls."""
    return browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(e => [e.scrollWidth, e.clientWidth])",
        css,
    )


def test_the_job_list_fits_a_laptop_and_replay_and_discard_fit_a_phone(
    browser, live_server, broker
):
    log_in(browser, live_server, "operator", "olga")
    # Names as long as real ones: they, not the test's "user1", widen the columns.
    org = OrganisationFactory(slug="acme-industries", name="Acme Industries")
    project = ProjectFactory(organisation=org, slug="quarterly-reports")
    owner = UserFactory(username="alexandra.johnson", org=org)
    job_in_state("scheduled", owner=owner)
    job_create(
        owner=owner,
        job_type="sim",
        params={"steps": 1},
        placement=Placement(org_id=org.id, project_id=project.id),
    )
    job_failed("TRANSIENT_EXTERNAL", job_type="erp")
    job_failed("UPSTREAM_CERTIFICATE_EXPIRED", reason="fatal")

    browser.get(f"{live_server.url}/admin/jobs/job/")
    wait(browser, "#result_list")
    at(browser, WIDE, "23-job-list-1440")
    [results] = box(browser, "#changelist .results")
    [run_at] = box(browser, "#result_list th.column-run_at_utc")
    assert "RUN AT" in run_at["text"].upper()
    assert run_at["right"] <= results["right"] + 1, (run_at, results)
    [(scrolled, shown)] = overflow(browser, "#changelist .results")
    assert scrolled <= shown, "the job list scrolls sideways at 1440 px"

    browser.get(f"{live_server.url}/admin/jobs/deadletter/?state=open")
    wait(browser, "#groups")
    at(browser, PHONE, "55-dead-letters-by-cause-phone", mobile=True)
    buttons = box(browser, "#groups td.actions a.button")
    assert {b["text"].split()[0] for b in buttons} == {"Replay", "Discard…"}
    width = browser.execute_script("return document.documentElement.clientWidth")
    for button in buttons:
        assert 0 <= button["left"] and button["right"] <= width, (button, width)
    assert all(s <= c for s, c in overflow(browser, "#groups, #groups ~ *, .scroll"))

    browser.get(f"{live_server.url}/admin/jobs/deadletter/queues/")
    wait(browser, "#dlq-queues")
    at(browser, PHONE, "42-dlq-overview-phone", mobile=True)
    buttons = box(browser, "#dlq-queues a.button")
    assert {"Replay…", "Discard…"} <= {b["text"] for b in buttons}
    for button in buttons:
        assert 0 <= button["left"] and button["right"] <= width, (button, width)
