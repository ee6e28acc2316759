# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""The clear dialog in a real Chromium, at 1400 and 390 px, light and dark: an operator opens it
from a dead task's page, ticks upstream and past runs, and the dry run lists exactly the task
runs the clear then touches, with their count, inside the page's width; axe-core finds nothing
serious, no request fails, no Content-Security-Policy violation (the browser fixture checks).
Confirmed, the clear runs those task runs again and is in the audit log."""

from __future__ import annotations

import pytest

from orchestrator.models import AuditEvent, TaskRun, Workflow
from tests.e2e.test_browser import (  # noqa: F401 - fixtures
    ARTIFACTS,
    browser,
    log_in,
    operator,
    server,
    workflows,
)
from tests.e2e.test_operator_day import history, in_mode, serious, watch_requests
from tests.e2e.test_pages import MODES

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SHOTS = ARTIFACTS / "clear-dialog"


@pytest.mark.slow
def test_the_clear_dialog_lists_what_it_clears_in_every_mode_and_clears_it(server, browser):
    page, base = browser, server.url
    SHOTS.mkdir(parents=True, exist_ok=True)
    wf = Workflow.objects.get(name="sales_report")
    # Three runs a day apart: the oldest has only extract; in the newest count_apac died and
    # publish was upstream-failed.
    newest, dead = history(wf, days=3)
    runs = sorted(set(TaskRun.objects.filter(run__workflow=wf).values_list("run_id", flat=True)))
    failed_requests = watch_requests(page)
    log_in(page, base, *operator(), start=f"/task-runs/{dead.pk}/")
    # Upstream (extract) and past runs, downstream (publish) as by default: extract, count_apac and
    # publish in the newest run and the one before; extract alone in the oldest.
    expected = [(runs[0], "extract"), (runs[1], "count_apac"), (runs[1], "extract"), (runs[1], "publish"),
                (runs[2], "count_apac"), (runs[2], "extract"), (runs[2], "publish")]
    problems = {}
    for width, theme in MODES:
        in_mode(page, width, theme)
        page.goto(f"{base}/task-runs/{dead.pk}/")
        page.click("#task-clear-options")
        page.wait_for_selector("section#clear-dialog")
        page.check("input[name=upstream]")
        page.check("input[name=past]")
        assert page.is_checked("input[name=downstream]")
        page.click("#clear-preview-button")
        page.wait_for_selector("#clear-count")
        assert page.inner_text("#clear-count") == "7"
        assert "7 task runs in 3 runs will run again" in page.inner_text("#clear-preview")
        rows = page.locator("#clear-list tbody tr").all_inner_texts()
        listed = sorted((int(row.split()[0].lstrip("#")), row.split("\t")[2].strip()) for row in rows)
        assert listed == sorted(expected), rows
        # The dialog fits the page: nothing wider than the window at 390 px.
        wide = page.evaluate("""w => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > w)
            .map(e => e.tagName + '.' + e.className + '#' + e.id + ' ' + Math.round(e.getBoundingClientRect().right)).slice(0, 15)""", width)
        assert page.evaluate("document.documentElement.scrollWidth") <= width, wide
        assert page.is_visible("#clear-go")
        problems[f"{width} {theme}"] = serious(page)
        page.screenshot(path=str(SHOTS / f"clear-dialog-{width}-{theme}.png"), full_page=True)
    # Nothing changed by the dry runs.
    assert TaskRun.objects.get(pk=dead.pk).state == "dead" and not AuditEvent.objects.exists()

    page.click("#clear-go")
    page.wait_for_url(f"{base}/task-runs/{dead.pk}/")
    page.wait_for_selector("text=Cleared 7 task runs: they run again.")
    states = dict(((run_id, task), state) for run_id, task, state in
                  TaskRun.objects.filter(run__workflow=wf).values_list("run_id", "task", "state"))
    assert {key: states[key] for key in expected} == {
        key: "scheduled" if key[1] == "extract" else "waiting" for key in expected}
    # What the clear left alone: the other counts of the runs.
    assert states[(runs[2], "count_emea")] == "succeeded"
    event = AuditEvent.objects.get(action="clear")
    assert (event.detail["workflow"], event.detail["task"], event.detail["count"]) == ("sales_report", "count_apac", 7)
    assert not any(problems.values()), problems
    assert failed_requests == []


@pytest.mark.slow
def test_the_workflow_pages_runs_are_ticked_and_cleared_after_the_same_dry_run_in_every_mode(server, browser):
    page, base = browser, server.url
    SHOTS.mkdir(parents=True, exist_ok=True)
    wf = Workflow.objects.get(name="sales_report")
    # Three runs a day apart; in the newest count_apac died and publish was upstream-failed.
    newest, dead = history(wf, days=3)
    failed_requests = watch_requests(page)
    workflow_page = f"/workflows/{wf.name}/"
    log_in(page, base, *operator(), start=workflow_page)
    problems = {}
    for width, theme in MODES:
        in_mode(page, width, theme)
        page.goto(base + workflow_page)
        # The grid's runs listed newest first under it, each with a tick box.
        first_row = page.locator("#workflow-runs tbody tr").first.inner_text()
        assert f"#{newest.pk}" in first_row and "failed" in first_row
        assert page.locator("#workflow-runs input[name=ids]").count() == 3
        page.check(f"#wf-tick-{newest.pk}")
        page.select_option("#workflow-bulk-action", "clear-failed")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        problems[f"{width} {theme} workflow"] = serious(page)
        page.locator("#workflow-runs").screenshot(path=str(SHOTS / f"workflow-runs-{width}-{theme}.png"))
        page.click("#workflow-bulk-preview")
        page.wait_for_url("**/runs/bulk/")
        assert page.inner_text("#bulk-count") == "2"  # count_apac (dead) and publish (upstream failed)
        assert "2 task runs will run again (only failed ones)" in page.inner_text("#bulk-preview")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        assert page.is_visible("#bulk-go")
        problems[f"{width} {theme}"] = serious(page)
        page.screenshot(path=str(SHOTS / f"workflow-bulk-{width}-{theme}.png"), full_page=True)
        page.click("#bulk-cancel")  # back to the workflow page, nothing done
        page.wait_for_url(f"{base}{workflow_page}")
    assert TaskRun.objects.get(pk=dead.pk).state == "dead" and not AuditEvent.objects.exists()

    page.check(f"#wf-tick-{newest.pk}")
    page.select_option("#workflow-bulk-action", "clear-failed")
    page.click("#workflow-bulk-preview")
    page.wait_for_url("**/runs/bulk/")
    page.click("#bulk-go")
    page.wait_for_url(f"{base}{workflow_page}")
    page.wait_for_selector("text=Cleared 2 task runs in 1 run(s).")
    assert TaskRun.objects.get(pk=dead.pk).state == "scheduled"
    event = AuditEvent.objects.get(action="clear")
    assert (event.detail["workflow"], event.detail["bulk"], event.detail["count"]) == ("sales_report", 1, 2)
    assert not any(problems.values()), problems
    assert failed_requests == []
