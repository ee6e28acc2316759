# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""Task groups in a real Chromium, at 1400 and 390 px in both themes: the grid's group row
unfolds and folds by keyboard (its button says aria-expanded), the graph's folded group node
unfolds into a box and the box's name folds it again, the choice stays in the address; axe finds
no serious or critical violation in either state, and the browser fixture fails on any CSP
violation. Screenshots under test-artifacts/groups/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from orchestrator.models import Run, TaskRun, Workflow
from orchestrator.runs import create_run
from tests.e2e.test_browser import ARTIFACTS, browser, log_in, operator, server, workflows  # noqa: F401 - fixtures
from tests.e2e.test_pages import MODES, axe_problems
from tests.test_sync import Folder
from tests.test_task_groups import GROUPED

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SHOTS = ARTIFACTS / "groups"


def seeded(tmp_path) -> Workflow:
    """The grouped workflow with three finished runs: one failed in the group."""
    folder = Folder(tmp_path)
    folder.write("grouped", GROUPED.format(name="grouped"))
    assert folder.sync().ok
    wf = Workflow.objects.select_related("current_version").get(name="grouped")
    now = timezone.now().replace(microsecond=0)
    for day in (3, 2, 1):
        at = now - timedelta(days=day)
        run, _ = create_run(wf, trigger="manual", logical_date=at)
        Run.objects.filter(pk=run.pk).update(state="failed" if day == 2 else "succeeded", started_at=at,
                                             finished_at=at + timedelta(seconds=30))
        TaskRun.objects.filter(run=run).update(state="succeeded", attempts=1, started_at=at,
                                               finished_at=at + timedelta(seconds=day))
        if day == 2:
            TaskRun.objects.filter(run=run, task="pull_b").update(state="dead")
            TaskRun.objects.filter(run=run, task="load").update(state="upstream_failed")
    return wf


def serious(page) -> list[dict]:
    return [v for v in axe_problems(page) if v["impact"] in ("serious", "critical")]


@pytest.mark.slow
def test_groups_fold_and_unfold_in_the_grid_and_the_graph_by_keyboard(server, browser, tmp_path):
    page, base = browser, server.url
    wf = seeded(tmp_path)
    SHOTS.mkdir(parents=True, exist_ok=True)
    username, password = operator()
    url = f"{base}/workflows/{wf.name}/"
    log_in(page, base, username, password, start=f"/workflows/{wf.name}/")
    found = {}
    for width, theme in MODES:
        page.set_viewport_size({"width": width, "height": 900})
        page.emulate_media(color_scheme=theme)
        page.goto(url)
        # Folded: one row for the group, its worst state in the failed run, one node in the graph.
        button = page.locator("#fold-extract")
        assert button.get_attribute("aria-expanded") == "false"
        assert page.locator("table.grid tbody tr").count() == 3
        assert page.locator("table.grid a.cell.group.st-dead").count() == 1
        assert page.locator("svg.dag .node.group").count() == 1
        assert page.locator("svg.dag text", has_text="pull_a").count() == 0
        found[f"folded {width} {theme}"] = serious(page)
        page.screenshot(path=str(SHOTS / f"folded-{width}-{theme}.png"), full_page=True)

        # The grid's button, by keyboard: its tasks under it, the nested group still folded.
        button.focus()
        page.keyboard.press("Enter")
        page.wait_for_url("**unfold=extract**")
        assert page.locator("#fold-extract").get_attribute("aria-expanded") == "true"
        assert page.locator("#fold-checks").get_attribute("aria-expanded") == "false"
        assert page.locator("table.grid tbody th.task", has_text="pull_a").count() == 1
        assert page.locator("svg.dag .group-box").count() == 1
        found[f"unfolded {width} {theme}"] = serious(page)
        page.screenshot(path=str(SHOTS / f"unfolded-{width}-{theme}.png"), full_page=True)

        # The graph: the nested group's node unfolds it (Enter on the link), the box's name folds.
        node = page.locator("svg.dag a[aria-expanded='false']").first
        node.focus()
        page.keyboard.press("Enter")
        page.wait_for_url("**unfold=checks**")
        assert page.locator("svg.dag .group-box").count() == 2
        assert page.locator("svg.dag text", has_text="check").count() >= 1
        assert page.url.endswith("#graph")
        found[f"nested {width} {theme}"] = serious(page)
        page.screenshot(path=str(SHOTS / f"nested-{width}-{theme}.png"), full_page=True)
        page.locator("svg.dag a[aria-label^='group extract']").focus()
        page.keyboard.press("Enter")
        page.wait_for_url(lambda address: "unfold=extract" not in address)
        assert page.locator("#fold-extract").get_attribute("aria-expanded") == "false"
        assert page.locator("svg.dag .group-box").count() == 0
    assert not any(found.values()), found
