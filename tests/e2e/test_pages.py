# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""The clock switch in a real Chromium: one choice, kept for the user, changes every time on every
page and what the date filters take. Also what the browser tests share for axe-core (the sweep of
every page in every mode is tests/e2e/test_every_page.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User

from orchestrator import access
from orchestrator.models import Run, UserPreference, Workflow
from tests.conftest import ROOT
from tests.e2e.test_browser import (  # noqa: F401 - fixtures
    ARTIFACTS,
    browser,
    log_in,
    operator,
    seed_history,
    server,
    workflows,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

AXE = ROOT / "tests" / "e2e" / "node_modules" / "axe-core" / "axe.min.js"
SHOTS = ARTIFACTS / "pages"
MODES = [(1400, "light"), (1400, "dark"), (390, "light"), (390, "dark")]


# The rules whose verdict depends on colours: all a theme (CSS colours only) can change.
COLOUR_RULES = ["color-contrast", "link-in-text-block"]


def axe_problems(page, rules: list[str] | None = None) -> list[dict]:
    """axe-core's violations of the page as it is now, all impacts (the caller keeps the serious);
    with ``rules``, those rules only."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        # Evaluated through the browser's debugging protocol, which the page's CSP does not govern
        # (a <script> tag with the file's text would be an inline script, which it refuses).
        page.evaluate(AXE.read_text() + "\n;undefined")
    options = {"resultTypes": ["violations"]}
    if rules:
        options["runOnly"] = {"type": "rule", "values": rules}
    result = page.evaluate("options => axe.run(document, options)", options)
    return [{"id": v["id"], "impact": v["impact"], "help": v["help"],
             "nodes": [n["target"] for n in v["nodes"]][:5]} for v in result["violations"]]


def visit_in_every_mode(page, url: str, name: str, report: dict, action=None):
    """Load (or, with ``action``, produce) the page in each width and theme: check its width and
    axe's verdict, save a screenshot."""
    for width, theme in MODES:
        page.set_viewport_size({"width": width, "height": 900})
        page.emulate_media(color_scheme=theme)
        if action:
            action()
        else:
            page.goto(url)
        page.wait_for_load_state("load")
        scroll_width = page.evaluate("document.documentElement.scrollWidth")
        problems = axe_problems(page)
        key = f"{name} {width} {theme}"
        report[key] = {"scroll_width": scroll_width, "violations": problems}
        page.screenshot(path=str(SHOTS / f"{name}-{width}-{theme}.png"), full_page=True)


@pytest.mark.slow
def test_one_clock_choice_is_kept_for_the_user_and_used_by_every_time_and_filter(server, browser):
    page, base = browser, server.url  # the browser's zone is Europe/Berlin
    wf = Workflow.objects.get(name="sales_report")
    # A run whose logical date is 23:30 UTC on 1 March: already 2 March in Berlin.
    late = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)
    run = Run.objects.create(workflow=wf, version=wf.current_version, logical_date=late, trigger="schedule",
                             state="succeeded", started_at=late, finished_at=late + timedelta(minutes=1))
    username, password = operator()
    log_in(page, base, username, password, start="/runs/")

    # Local time by default: the Berlin wall time, the UTC one on hover.
    cell = page.locator(f"table.runs tr:has(a[href='/runs/{run.pk}/']) time").first
    assert cell.inner_text() == "2026-03-02 00:30:00"
    assert cell.get_attribute("title") == "2026-03-01 23:30:00 UTC"
    assert page.inner_text("[data-tz]") == "times in Europe/Berlin"
    # The date filter takes Berlin days: 2 March holds the run, 1 March does not.
    assert page.inner_text("#filter-zone") == "dates in Europe/Berlin"
    page.goto(base + "/runs/?since=2026-03-02&until=2026-03-02")
    assert page.locator(f"a[href='/runs/{run.pk}/']").count() == 1
    page.goto(base + "/runs/?since=2026-03-01&until=2026-03-01")
    assert page.locator(f"a[href='/runs/{run.pk}/']").count() == 0

    # Switch to UTC: every time on every page, and the filters, follow; the choice is stored.
    page.click(".clock-switch button[value=utc]")
    page.wait_for_url(base + "/runs/?since=2026-03-01&until=2026-03-01")
    assert UserPreference.objects.get(user__username=username).clock == "utc"
    assert page.get_attribute(".clock-switch button[value=utc]", "aria-pressed") == "true"
    assert page.inner_text("#filter-zone") == "dates in UTC"
    assert page.locator(f"a[href='/runs/{run.pk}/']").count() == 1  # 1 March in UTC
    cell = page.locator(f"table.runs tr:has(a[href='/runs/{run.pk}/']) time").first
    assert cell.inner_text() == "2026-03-01 23:30:00 UTC"
    assert cell.get_attribute("title") == "2026-03-02 00:30:00 Europe/Berlin"
    page.goto(f"{base}/runs/{run.pk}/")
    assert all(t.endswith(" UTC") for t in page.locator("main time").all_inner_texts())

    # Remembered for the user, not the browser: a new login elsewhere (a fresh session) keeps it.
    page.context.clear_cookies()
    log_in(page, base, username, password, start="/runs/")
    assert page.get_attribute(".clock-switch button[value=utc]", "aria-pressed") == "true"
    assert page.locator("main time").first.inner_text().endswith(" UTC")

    # The admin shows times with their zone: UTC here, Berlin's after switching back.
    User.objects.filter(username=username).update(is_staff=True, is_superuser=True)
    page.goto(f"{base}/admin/orchestrator/run/{run.pk}/change/")
    assert "2026-03-01 23:30:00 UTC" in page.inner_text("body")
    page.goto(base + "/runs/")
    page.click(".clock-switch button[value=local]")
    page.wait_for_url(base + "/runs/")
    page.goto(f"{base}/admin/orchestrator/run/")
    assert "2026-03-02 00:30:00 CET" in page.inner_text("#result_list")
    assert access.is_operator(User.objects.get(username=username))
