# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""An operator's day in a real Chromium, at 1400 and 390 px, light and dark: grid cells whose
colour is their state (a failed task of 0.02 s is as red as any), dark tiles in the dark theme, the
newest runs in view on a phone; "mark failed" that keeps the recorded times; a backfill preview
whose times are in the zone its inputs are read in; and a long log that the keyboard scrolls, that
filters printed output as its own level, and that never widens the page. axe-core finds nothing
serious on these pages, no request fails, no Content-Security-Policy violation (the browser
fixture checks that)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from orchestrator import logs
from orchestrator.models import Attempt, Lease, Run, TaskRun, Worker, Workflow
from tests.conftest import wait_for
from tests.e2e.test_browser import (  # noqa: F401 - fixtures
    ARTIFACTS,
    browser,
    log_in,
    operator,
    server,
    workflows,
)
from tests.e2e.test_pages import MODES, axe_problems

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SHOTS = ARTIFACTS / "operator-day"
FAILED_RED = "rgb(207, 34, 46)"  # --failed, in both themes


def serious(page) -> list[dict]:
    return [v for v in axe_problems(page) if v["impact"] in ("serious", "critical")]


def watch_requests(page) -> list[str]:
    """Every request of the page that fails or answers 4xx/5xx, as it happens."""
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(f"{request.url}: {request.failure}"))
    page.on("response", lambda response: response.status >= 400 and failed.append(f"{response.url}: {response.status}"))
    return failed


def in_mode(page, width: int, theme: str) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    page.emulate_media(color_scheme=theme)


def history(workflow: Workflow, days: int = 30) -> tuple[Run, TaskRun]:
    """Finished runs, a day apart; in the newest, count_apac died after 0.02 s while the other tasks
    took minutes; the oldest has a task run of its first task only. Returns the newest run and that
    dead task run."""
    now = timezone.now().replace(microsecond=0)
    tasks = workflow.current_version.spec["tasks"]
    newest = dead = None
    for day in range(days, 0, -1):
        fired = now - timedelta(days=day)
        last = day == 1
        run = Run.objects.create(workflow=workflow, version=workflow.current_version, logical_date=fired,
                                 trigger="schedule", state="failed" if last else "succeeded", started_at=fired,
                                 finished_at=fired + timedelta(minutes=6))
        for name in list(tasks)[:1] if day == days else tasks:  # the oldest run has only its first task
            quick = last and name == "count_apac"
            state = "dead" if quick else "upstream_failed" if last and name == "publish" else "succeeded"
            took = timedelta(seconds=0.02) if quick else timedelta(minutes=5)
            task_run = TaskRun.objects.create(
                run=run, task=name, state=state, spec=tasks[name], upstream=tasks[name]["upstream"],
                attempts=0 if state == "upstream_failed" else 1,
                started_at=None if state == "upstream_failed" else fired,
                finished_at=fired + took, error="ValueError: no orders" if quick else "")
            if task_run.attempts:
                Attempt.objects.create(task_run=task_run, number=1, started_at=fired, finished_at=fired + took,
                                       outcome="failed" if quick else "succeeded")
            if quick:
                dead = task_run
        newest = run
    return newest, dead


@pytest.mark.slow
def test_grid_cells_show_their_state_at_a_glance_in_both_themes_and_a_phone_opens_on_the_newest(server, browser):
    page, base = browser, server.url
    SHOTS.mkdir(parents=True, exist_ok=True)
    wf = Workflow.objects.get(name="sales_report")
    newest, dead = history(wf, days=20)  # all in the grid's 25 columns
    failed_requests = watch_requests(page)
    log_in(page, base, *operator(), start="/workflows/sales_report/")
    cell = page.locator(f"table.grid a.cell[href='/task-runs/{dead.pk}/']")
    upstream = page.locator("table.grid a.cell.st-upstream_failed").first
    problems = {}
    for width, theme in MODES:
        in_mode(page, width, theme)
        page.goto(base + "/workflows/sales_report/#grid")
        # The dead task run took 0.02 s against minutes: its whole cell is red all the same.
        box = cell.bounding_box()
        assert (box["width"], box["height"]) == (16, 24)
        assert cell.evaluate("e => getComputedStyle(e).backgroundColor") == FAILED_RED
        assert upstream.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(188, 76, 0)"
        empty = page.locator("table.grid .cell.none")
        card = page.evaluate("getComputedStyle(document.querySelector('#grid')).backgroundColor")
        if theme == "dark":
            # Nothing in the dark grid is a light tile: the empty slots are as dark as the page.
            assert card == "rgb(22, 27, 34)"
            for colour in page.evaluate("[...document.querySelectorAll('table.grid .cell.none')]"
                                        ".map(e => getComputedStyle(e).backgroundColor)"):
                assert colour == "rgb(13, 17, 23)", colour
        if width == 390:
            # The newest run's column is in view without scrolling; older ones are a swipe away.
            column = page.locator(f"table.grid a.cell[href='/task-runs/{dead.pk}/']").bounding_box()
            assert 0 <= column["x"] and column["x"] + column["width"] <= 390, column
            assert page.evaluate("document.querySelector('.grid-scroll').scrollWidth") > 390
            assert page.evaluate("document.documentElement.scrollWidth") <= 390
        problems[f"{width} {theme}"] = serious(page)
        page.locator("#grid").screenshot(path=str(SHOTS / f"grid-{width}-{theme}.png"))
        assert empty.count() == len(wf.current_version.spec["tasks"]) - 1  # the oldest run's missing tasks
    assert not any(problems.values()), problems
    assert failed_requests == []


def test_mark_failed_keeps_the_recorded_times_and_a_running_task_can_be_marked(server, browser):
    page, base = browser, server.url
    wf = Workflow.objects.get(name="sales_report")
    run, dead = history(wf, days=3)
    finished = Run.objects.get(pk=run.pk).finished_at
    log_in(page, base, *operator(), start=f"/task-runs/{dead.pk}/")
    assert page.inner_text("#task-duration") == "0.02 s"

    page.click("#task-mark-failed")
    page.wait_for_selector("#task-state:has-text('failed')")
    assert page.inner_text("#task-duration") == "0.02 s"  # not the seconds since it ended
    dead.refresh_from_db()
    assert (dead.state, (dead.finished_at - dead.started_at).total_seconds()) == ("failed", 0.02)
    assert Run.objects.get(pk=run.pk).finished_at == finished
    assert "Mark count_apac" in page.dialogs[-1]

    # A running task run offers the marks too; the question says its attempt is stopped.
    going = TaskRun.objects.filter(run=run, task="publish").get()
    now = timezone.now()
    TaskRun.objects.filter(pk=going.pk).update(state="running", attempts=1, started_at=now, finished_at=None)
    Attempt.objects.create(task_run=going, number=1, started_at=now, outcome="running")
    Run.objects.filter(pk=run.pk).update(state="running", finished_at=None)
    page.goto(f"{base}/task-runs/{going.pk}/")
    page.click("#task-mark-succeeded")
    page.wait_for_selector("#task-state:has-text('succeeded')")
    assert "Its running attempt is stopped." in page.dialogs[-1]
    assert Attempt.objects.get(task_run=going).outcome == "cancelled"
    page.screenshot(path=str(SHOTS / "marked-running.png"), full_page=True)


def test_the_backfill_preview_shows_its_times_in_the_zone_its_inputs_are_read_in(server, browser):
    page, base = browser, server.url
    username, password = operator("root")
    User.objects.filter(username=username).update(is_staff=True, is_superuser=True)
    failed_requests = watch_requests(page)
    # Logged in through the app: the browser's zone (Berlin) is the user's clock, the admin's too.
    log_in(page, base, username, password)
    etl = Workflow.objects.get(name="sales_report")
    page.goto(f"{base}/admin/orchestrator/workflow/{etl.pk}/backfill/")
    assert page.inner_text("label[for=id_start]") == "from (UTC):"
    page.fill("input[name=start]", "2026-03-01T00:00")
    page.fill("input[name=end]", "2026-03-05T23:59")
    page.click("#preview-button")
    # 06:15 Berlin on weekdays is 05:15 UTC: the first is Monday 2 March.
    assert page.inner_text("#preview-count") == "4"
    fires = page.locator("#preview-fires li").all_inner_texts()
    assert fires[0] == "2026-03-02 05:15:00 UTC 2026-03-02 06:15 Europe/Berlin"
    assert all(" UTC " in fire for fire in fires)
    assert "First fire times, in UTC like the dates above" in page.inner_text("#preview")
    page.screenshot(path=str(SHOTS / "backfill-preview.png"), full_page=True)
    # The admin asks for /favicon.ico as well as its icon link: both answer.
    assert page.goto(base + "/favicon.ico").status == 200
    assert failed_requests == []


LOG_LINES = 1500


def long_log(path: Path) -> str:
    lines = ["printed before any record", "y" * 20000]  # a long line without a space, on the first page
    for n in range(LOG_LINES):
        level = ("DEBUG", "INFO", "INFO", "WARNING")[n % 4]
        lines.append(f"2026-03-02 05:15:{n % 60:02d},{n % 1000:03d} {level} report: line {n}")
        if n % 100 == 0:
            lines.append(f"printed {n}")
    lines.append("printed at the end")
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


@pytest.mark.slow
def test_a_long_log_scrolls_by_keyboard_filters_printed_output_and_keeps_the_page_width(server, browser):
    page, base = browser, server.url
    SHOTS.mkdir(parents=True, exist_ok=True)
    wf = Workflow.objects.get(name="sales_report")
    run, dead = history(wf, days=2)
    attempt = Attempt.objects.get(task_run=dead)
    long_log(Path(server.env["ORCHESTRATOR_DATA_DIR"]) / "logs" / logs.attempt_log_name(attempt))
    # The dashboard's tables have rows, wider than a phone: a worker and the scheduler's lease.
    now = timezone.now()
    Worker.objects.create(name="worker-" + "a" * 60, host="host-" + "b" * 40, pid=4242,
                          queues=["default", "reports", "exports"], concurrency=4, started_at=now, heartbeat_at=now)
    Lease.objects.create(name="scheduler", holder="scheduler@" + "c" * 60, epoch=7, acquired_at=now,
                         expires_at=now + timedelta(days=1))
    failed_requests = watch_requests(page)
    log_in(page, base, *operator(), start=f"/task-runs/{dead.pk}/")
    problems, widths = {}, {}
    for width, theme in MODES:
        in_mode(page, width, theme)
        page.goto(f"{base}/task-runs/{dead.pk}/")
        problems[f"task-run {width} {theme}"] = serious(page)
        widths[f"task-run {width} {theme}"] = page.evaluate("document.documentElement.scrollWidth")
        page.screenshot(path=str(SHOTS / f"long-log-{width}-{theme}.png"))
        page.goto(f"{base}/")
        assert page.locator("[aria-label=workers] table tr").count() == 2
        problems[f"dashboard {width} {theme}"] = serious(page)
        page.screenshot(path=str(SHOTS / f"dashboard-{width}-{theme}.png"), full_page=True)
    assert not any(problems.values()), problems
    assert all(width <= int(key.split()[1]) for key, width in widths.items()), widths

    in_mode(page, 1400, "light")
    page.goto(f"{base}/task-runs/{dead.pk}/")
    box = page.locator("pre.log")
    assert box.get_attribute("aria-label") == "log of attempt #1"
    # The keyboard reaches the box (Tab from the level filter) and scrolls it.
    page.focus("#log-level")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.tagName") == "PRE"
    assert box.evaluate("e => e.scrollTop") == 0
    assert box.evaluate("e => e.scrollHeight > e.clientHeight")
    page.keyboard.press("PageDown")
    page.keyboard.press("End")
    # The browser scrolls smoothly: the box moves over a few frames.
    wait_for(lambda: box.evaluate("e => e.scrollTop") > 0, timeout=10, interval=0.1, message="the log box to scroll")

    def shown():
        return [line for line in box.inner_text().splitlines() if line.strip() and "load the next" not in line]

    everything = shown()
    assert "printed before any record" in everything
    page.select_option("#log-level", "warning")
    warnings = shown()
    assert warnings and all(" WARNING " in line for line in warnings)  # no printed line gets through
    page.select_option("#log-level", "debug")
    records = shown()
    assert len(records) < len(everything) and not any(line.startswith("printed") for line in records)
    assert any(" DEBUG " in line for line in records)
    page.select_option("#log-level", "stdout")
    printed = shown()
    assert printed[0] == "printed before any record" and all(" INFO " not in line for line in printed)
    assert any(line.startswith("yyyy") for line in printed)

    # The log fragment's own address, opened in the browser, is the task run's page, as wide as the window.
    page.goto(f"{base}/attempts/{attempt.pk}/log/?offset=65536")
    assert page.url.startswith(f"{base}/task-runs/{dead.pk}/?attempt=1&offset=")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    assert failed_requests == []


@pytest.mark.slow
def test_an_operator_backfills_from_the_workflow_pages_dialog_after_a_dry_run(server, browser):
    page, base = browser, server.url
    SHOTS.mkdir(parents=True, exist_ok=True)
    failed_requests = watch_requests(page)
    log_in(page, base, *operator(), start="/workflows/sales_report/")
    page.click("a[href='#backfill-dialog']")
    page.fill("#id_start", "2026-03-01T00:00")
    page.fill("#id_end", "2026-03-05T23:59")
    page.fill("#id_params", '{"orders": 5}')
    page.click("#backfill-preview-button")
    page.wait_for_selector("#backfill-count")
    # The reader's clock is Berlin's, yet the dry run speaks UTC, as its inputs do, and says so.
    assert page.inner_text("#backfill-count") == "4"
    fires = page.locator("#backfill-fires li").all_inner_texts()
    assert fires[0] == "2026-03-02 05:15:00 UTC 2026-03-02 06:15 Europe/Berlin"
    assert page.inner_text("label[for=id_start]") == "from (UTC):"
    assert not Run.objects.exists()
    problems = {}
    for width, theme in MODES:
        in_mode(page, width, theme)
        problems[f"{width} {theme}"] = serious(page)
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        page.locator("#backfill-dialog").screenshot(path=str(SHOTS / f"backfill-dialog-{width}-{theme}.png"))
    assert not any(problems.values()), problems
    in_mode(page, 1400, "light")
    page.click("#backfill-start")
    page.wait_for_url(f"{base}/runs/?workflow=sales_report&trigger=backfill")
    assert Run.objects.filter(trigger="backfill").count() == 4
    assert page.locator("table.runs tbody tr").count() == 4
    assert failed_requests == []
