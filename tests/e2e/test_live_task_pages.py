# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""The live pages in a real browser while a real worker runs the task: the task-run page follows
its attempts (a failed first attempt, the retry that starts while one watches, the durations)
without a reload, the run page keeps an opened <details> open across its updates, and an
operator clears a finished task from its page after confirming."""

from __future__ import annotations

import pytest

from orchestrator.models import Run, TaskRun, Workflow
from orchestrator.runs import trigger_workflow
from tests.conftest import wait_for
from tests.e2e.test_browser import browser, log_in, operator, server, shot, workflows  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def count_swaps(page):
    page.evaluate("window.swaps = 0; document.body.addEventListener('htmx:afterSwap', () => window.swaps++)")


def wait_for_swaps(page, more: int = 2):
    """Until the live region was replaced ``more`` more times (a poll that changed nothing counts)."""
    start = page.evaluate("window.swaps")
    # Polled from here: the page's own eval (wait_for_function) is what the CSP refuses.
    wait_for(lambda: page.evaluate("window.swaps") >= start + more, timeout=15, interval=0.1,
             message=f"{more} more swaps of the live region")


@pytest.mark.slow
def test_the_task_run_page_follows_attempts_live_and_the_run_page_keeps_details_open(server, browser, tmp_path):
    processes, page, base = server.processes, browser, server.url
    folder = tmp_path / "gates"
    folder.mkdir()
    processes.start("dispatcher", env=server.env)
    processes.start("worker", "--queues", "default", "--concurrency", "2", env=server.env)
    log_in(page, base, *operator())
    run, _ = trigger_workflow(Workflow.objects.get(name="gated_retry"), {"folder": str(folder)})
    gate, after = (TaskRun.objects.get(run=run, task=name) for name in ("gate", "after"))

    # The downstream task's page, opened while it waits for its parent.
    waiting = page.context.new_page()
    waiting.goto(f"{base}/task-runs/{after.pk}/")
    assert "No attempt yet: waiting for upstream tasks." in waiting.inner_text("#attempts")
    waiting.evaluate("window.notReloaded = true")

    # The run page, with its params opened by the user: the live updates keep them open.
    run_page = page.context.new_page()
    run_page.goto(f"{base}/runs/{run.pk}/")
    count_swaps(run_page)
    run_page.click("details#params summary")
    wait_for_swaps(run_page)
    assert run_page.evaluate("document.querySelector('details#params').open") is True
    assert str(folder) in run_page.inner_text("details#params pre")

    # The task's own page while its first attempt runs: the duration counts up, live.
    page.goto(f"{base}/task-runs/{gate.pk}/")
    page.wait_for_selector("#attempts .tabs a[data-outcome=running]")
    page.evaluate("window.notReloaded = true")
    first = page.inner_text("#attempt-duration")
    wait_for(lambda: page.evaluate("document.querySelector('#attempt-duration').textContent") != first,
             timeout=30, interval=0.1, message="the attempt's duration to move on")
    assert "attempt 1 waits for go1" in page.inner_text("pre.log")

    # The first attempt fails; the retry that starts appears, selected, with its own log.
    (folder / "go1").touch()
    page.wait_for_selector("#attempts .tabs a:nth-child(2)[data-outcome=running]", timeout=30_000)
    assert page.inner_text("#attempts .tabs a:nth-child(1)") == "#1 failed"
    wait_for(lambda: "attempt 2 waits for go2" in page.evaluate("document.querySelector('pre.log').textContent"),
             timeout=30, interval=0.1, message="the retry's log line")
    shot(page, "task-run-retrying")
    (folder / "go2").touch()
    page.wait_for_selector("#live[data-state=succeeded]", timeout=30_000)
    assert page.inner_text("#attempts .tabs a:nth-child(2)") == "#2 succeeded"
    assert page.inner_text("#task-state") == "succeeded"
    assert page.evaluate("window.notReloaded") is True

    # The page that waited shows its task's attempt, and its end, without a reload.
    waiting.wait_for_selector("#live[data-state=succeeded]", timeout=30_000)
    assert waiting.inner_text("#attempts .tabs a") == "#1 succeeded"
    assert waiting.evaluate("window.notReloaded") is True
    wait_for(lambda: Run.objects.get(pk=run.pk).state == "succeeded", timeout=30, message="the run to succeed")
    run_page.wait_for_selector("#live[data-state=succeeded]")
    assert run_page.evaluate("document.querySelector('details#params').open") is True

    # Cleared from its page (after confirming): gate and after run again, the old attempts stay.
    page.click("#task-clear")
    assert page.dialogs == [f"Clear gate of run #{run.pk} and every task downstream of it? They run again; "
                            "earlier attempts stay in the history."]
    page.wait_for_selector("ul.messages >> text=Cleared gate and 1 downstream: they run again.")
    page.wait_for_selector("#attempts .tabs a:nth-child(3)[data-outcome=succeeded]", timeout=30_000)
    assert [page.inner_text(f"#attempts .tabs a:nth-child({n})") for n in (1, 2)] == ["#1 failed", "#2 succeeded"]
    wait_for(lambda: TaskRun.objects.get(pk=after.pk).attempts == 2 and Run.objects.get(pk=run.pk).state == "succeeded",
             timeout=30, message="the cleared run to succeed again")
    shot(page, "task-run-cleared")

    # The grid: a column per run with its date; picking a cell shows its task run and the
    # actions; marking it failed (after confirming) comes back to the panel, and after follows.
    page.goto(f"{base}/workflows/gated_retry/")
    assert page.locator("table.grid time.grid-date.local").count() == 1
    page.click(f"table.grid a.cell[href='/task-runs/{gate.pk}/']")
    page.wait_for_selector("#grid-panel #grid-mark-failed")
    assert page.url == f"{base}/workflows/gated_retry/"  # the panel came without leaving the page
    shot(page, "workflow-grid-panel")
    page.click("#grid-mark-failed")
    assert page.dialogs[-1] == f"Mark gate of run #{run.pk} failed? Its downstream tasks follow their trigger rules."
    page.wait_for_selector("ul.messages >> text=Marked gate failed.")
    assert page.url.endswith(f"/workflows/gated_retry/?run={run.pk}&task=gate#grid-panel")
    assert page.inner_text("#grid-panel .st") == "failed"
    assert TaskRun.objects.get(pk=after.pk).state == "succeeded"  # it had run already: it keeps its outcome
    assert Run.objects.get(pk=run.pk).state == "failed"
