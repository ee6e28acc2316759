# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""A big run in a real Chromium, at 1400 and 390 px, light and dark: the run page of a run of
5,000 tasks (a page of them, the counts, no graph too big to draw) and of a map over 5,000 items,
and the mapped task's own page with its instances' counts, each fitting the window with no serious
or critical axe-core violation; screenshots under test-artifacts/pages/."""

from __future__ import annotations

import re

import pytest

from orchestrator import clock
from orchestrator.bench.pages import fill_run
from orchestrator.models import Run, TaskRun, Workflow
from tests.e2e.test_browser import browser, log_in, operator, server, workflows  # noqa: F401 - fixtures
from tests.e2e.test_pages import AXE, SHOTS, visit_in_every_mode

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

N = 5_000


def big_run(mapped: str | None) -> Run:
    workflow, _ = Workflow.objects.get_or_create(name="big")
    now = clock.now()
    run = Run.objects.create(workflow=workflow, trigger="manual", state="failed", logical_date=now, started_at=now,
                             finished_at=now)
    fill_run(run, N, mapped)
    return run


def test_a_big_runs_pages_and_its_mapped_tasks_page_fit_and_pass_axe(server, browser):
    assert AXE.exists(), "axe-core is not installed: run ./dev test (it runs npm ci in tests/e2e)"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page, base = browser, server.url
    tasks, mapped = big_run(None), big_run("square")
    own = TaskRun.objects.get(run=mapped, map_index=-1)
    log_in(page, base, *operator())
    report: dict = {}
    for name, path in {"big-run": f"/runs/{tasks.pk}/", "big-map-run": f"/runs/{mapped.pk}/",
                       "mapped-task-run": f"/task-runs/{own.pk}/"}.items():
        visit_in_every_mode(page, base + path, name, report)
    too_wide = {key: r["scroll_width"] for key, r in report.items() if r["scroll_width"] > int(key.split()[1])}
    assert not too_wide, too_wide
    serious = {key: [v for v in r["violations"] if v["impact"] in ("serious", "critical")]
               for key, r in report.items()}
    assert not any(serious.values()), {key: found for key, found in serious.items() if found}

    # The run of 5,000 tasks: a page of them, the next page a click away.
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{base}/runs/{tasks.pk}/")
    assert "5000 tasks: too many to draw" in page.inner_text("#no-graph")
    page.click("a[rel=next]")
    page.wait_for_url(re.compile(r"\?after=\d+$"))
    assert page.locator("table.list tbody tr").first.inner_text().startswith("t000100")
    # The mapped task's page: its instances counted by state, each count a link to them.
    page.goto(f"{base}/task-runs/{own.pk}/")
    assert page.inner_text("#instances-ended") == f"{N}/{N} ended"
    assert "No attempt yet" not in page.inner_text("main")
    page.click("#instances a.count:has-text('dead')")
    page.wait_for_url(re.compile(r"/instances/\?state=dead$"))
    assert re.findall(r"square\[(\d+)\]", page.inner_text("#rows"))[:2] == ["5", "102"]
