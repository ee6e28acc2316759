# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""The graph of a big workflow in a real browser: pan and zoom (buttons, kept across the live
updates), every node a link the keyboard reaches and a screen reader names; and the log view:
search within an attempt's log (next and previous match) and filter its lines by level."""

from __future__ import annotations

import textwrap
import uuid

import pytest

from orchestrator.models import TaskRun, Workflow
from orchestrator.runs import create_run, trigger_workflow
from orchestrator.sync import sync_workflows
from tests.conftest import wait_for
from tests.e2e.test_browser import ARTIFACTS, browser, log_in, operator, server, shot, workflows  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# 300 shell tasks in 20 layers of 15, each with two parents in the layer before.
GENERATED = '''
from orchestrator.dsl import Workflow

wide = Workflow("generated_300", description="300 tasks in 20 layers.")
layers = [[wide.shell(f"step_{layer:02d}_{index:02d}", "true") for index in range(15)] for layer in range(20)]
for layer in range(1, 20):
    for index, task in enumerate(layers[layer]):
        layers[layer - 1][index] >> task
        layers[layer - 1][(index + 1) % 15] >> task
'''


def window_shot(page, name: str):
    """A screenshot of the window only: the whole page is as tall as 300 grid rows."""
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def scale(page) -> float:
    # The run is active, so the live update replaces the graph every few seconds; the new view has
    # its kept zoom once graph.js has set it up (read in one step, so no swap falls in between).
    found = page.wait_for_function(
        "() => { const view = document.querySelector('.dag-view'); return view && view.getAttribute('data-scale'); }",
        timeout=10_000)
    return float(found.json_value())


@pytest.mark.slow
def test_a_300_task_graph_pans_zooms_and_every_node_is_reachable_by_keyboard(server, browser, tmp_path):
    page, base = browser, server.url
    package = f"generated_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "wide.py").write_text(textwrap.dedent(GENERATED))
    sync_workflows(tmp_path / package, package)
    sync_workflows()  # the project's own workflows: maintenance
    wide = Workflow.objects.get(name="generated_300")
    assert len(wide.spec["tasks"]) == 300
    run, _ = create_run(wide, trigger="manual")  # active: the page updates itself; nodes link to task runs
    log_in(page, base, *operator())

    page.goto(f"{base}/workflows/maintenance/")
    # Its two housekeeping steps are one folded group node, then summarize.
    assert page.locator("svg.dag .node").count() == 2 and scale(page) == 1.0
    shot(page, "graph-maintenance")

    page.goto(f"{base}/workflows/generated_300/")
    assert page.locator("svg.dag .node").count() == 300
    # Too wide for the page: it opens fitted, the whole graph in view.
    assert scale(page) < 1
    box = page.locator(".dag-scroll").bounding_box()
    assert page.locator("svg.dag").bounding_box()["width"] <= box["width"]
    window_shot(page, "graph-300-fit")
    page.click("button[data-zoom=reset]")
    assert scale(page) == 1.0
    page.click("button[data-zoom=out]")
    assert scale(page) == pytest.approx(0.8)
    page.click("button[data-zoom=in]")
    page.click("button[data-zoom=in]")
    assert scale(page) == pytest.approx(1.25)
    natural = page.evaluate("document.querySelector('svg.dag').viewBox.baseVal.width")
    assert float(page.get_attribute("svg.dag", "width")) == pytest.approx(natural * 1.25, abs=1)
    # The live update (every 3 s while the run is active) keeps the zoom and the scroll.
    page.evaluate("document.querySelector('.dag-scroll').scrollLeft = 900")
    page.evaluate("window.swaps = 0; document.body.addEventListener('htmx:afterSwap', () => window.swaps++)")
    # Polled from here: the page's own eval (wait_for_function) is what the CSP refuses.
    wait_for(lambda: page.evaluate("window.swaps") >= 1, timeout=45, interval=0.1, message="a live update")
    # The new graph is set up when htmx settles it (htmx:load), just after the swap.
    wait_for(lambda: page.evaluate("document.querySelector('.dag-view').dataset.ready") == "1", timeout=30,
             interval=0.05, message="the new graph to be set up")
    assert scale(page) == pytest.approx(1.25)
    assert page.evaluate("document.querySelector('.dag-scroll').scrollLeft") == pytest.approx(900, abs=2)

    # A screen reader finds each node as a link named by its task and state; the SVG is no image.
    assert page.get_attribute("svg.dag", "role") != "img"
    assert page.get_by_role("link", name="step_07_03: waiting").count() == 1
    assert page.get_by_role("link", name="step_00_00: scheduled").count() == 1
    # The keyboard walks the nodes; the focused one is scrolled into view.
    page.click("button[data-zoom=reset]")
    page.focus("svg.dag a")
    for _ in range(120):
        page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.getAttribute('aria-label')")
    name, state = focused.split(": ")
    assert TaskRun.objects.get(run=run, task=name).state == state
    # The focused node lies inside the scroll box: the browser scrolled it into view, and a live
    # update meanwhile (the run is polled) gives the focus back to it and scrolls it into view
    # again (graph.js), which may take until that update has settled.
    def inside():
        return page.evaluate("""(() => {
            const n = document.activeElement.getBoundingClientRect();
            const v = document.activeElement.closest('.dag-scroll').getBoundingClientRect();
            return v.left <= n.left && n.right <= v.right + 1 && v.top <= n.top && n.bottom <= v.bottom + 1;
        })()""")

    wait_for(inside, timeout=10, interval=0.1, message="the focused node to be in view")
    assert page.evaluate("document.activeElement.getAttribute('aria-label')").split(": ")[0] == name
    # Scrolled away from it (the kept scroll is now where the focused node is out of view), the
    # next live update brings the focused node back into view.
    page.evaluate("document.querySelector('.dag-scroll').scrollTo(0, 0)")
    assert not inside()
    swaps = page.evaluate("window.swaps")
    wait_for(lambda: page.evaluate("window.swaps") > swaps, timeout=45, interval=0.1, message="a live update")
    wait_for(inside, timeout=10, interval=0.1, message="the focused node back in view after a live update")
    assert page.evaluate("document.activeElement.getAttribute('aria-label')").split(": ")[0] == name
    window_shot(page, "graph-300-keyboard")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}/task-runs/*/")
    assert TaskRun.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1])).task == name


def test_an_attempts_log_is_searched_and_filtered_by_level(server, browser):
    processes, page, base = server.processes, browser, server.url
    processes.start("dispatcher", env=server.env)
    processes.start("worker", "--queues", "default", env=server.env)
    run, _ = trigger_workflow(Workflow.objects.get(name="chatty_log"), {})
    wait_for(lambda: TaskRun.objects.get(run=run).state == "succeeded", timeout=60, message="the task to end")
    log_in(page, base, *operator(), start=f"/task-runs/{TaskRun.objects.get(run=run).pk}/")

    # Search: case-insensitive, every match counted, next and previous (buttons, Enter, Shift+Enter).
    page.fill("#log-search", "orders")
    assert page.inner_text("#log-count") == "1 of 10"
    assert page.evaluate("CSS.highlights.get('log-match').size") == 10
    page.click("#log-next")
    page.click("#log-next")
    assert page.inner_text("#log-count") == "3 of 10"
    page.press("#log-search", "Shift+Enter")
    assert page.inner_text("#log-count") == "2 of 10"
    assert page.evaluate("CSS.highlights.get('log-current').values().next().value.toString()") == "orders"
    page.click("#log-prev")
    page.click("#log-prev")
    assert page.inner_text("#log-count") == "10 of 10"  # wraps around
    page.fill("#log-search", "no such words")
    assert page.inner_text("#log-count") == "no match"

    # Level: only records at or above it (a record's traceback stays with it); printed text is a
    # level of its own, hidden by the others and shown alone by "printed".
    def shown():
        return [line for line in page.inner_text("pre.log").splitlines() if line.strip()]

    everything = shown()
    assert len(everything) > 12 and any("debug line 1" in line for line in everything)
    page.select_option("#log-level", "warning")
    lines = shown()
    assert not any("debug line" in line or "info line" in line for line in lines)
    assert any("warning: ORDERS are late" in line for line in lines)
    assert any("ValueError: no orders today" in line for line in lines)  # the traceback of the error record
    assert any("critical: giving up" in line for line in lines)
    assert not any(line.startswith("printed") for line in lines)
    page.fill("#log-search", "orders")
    assert page.inner_text("#log-count") == "1 of 4"  # hidden lines are not searched
    page.select_option("#log-level", "debug")
    assert any("debug line 1" in line for line in shown()) and len(shown()) == len(everything) - 2
    page.select_option("#log-level", "stdout")
    assert shown() == ["printed before any record", "printed at the end"]
    shot(page, "task-log-search")
    page.select_option("#log-level", "")
    assert shown() == everything
