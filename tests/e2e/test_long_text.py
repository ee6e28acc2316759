# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""Very long unbroken text (a description, a log line, an error, a param value of 5,000
characters without a space) wraps inside its box: no page grows wider than the window. Measured
in a real Chromium, as the document's scroll width."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from orchestrator import logs
from orchestrator.models import Attempt, TaskRun, Workflow
from orchestrator.runs import trigger_workflow
from tests.e2e.test_browser import browser, log_in, operator, server, shot, workflows  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LONG = "x" * 5000
WIDTH = 1400  # the browser fixture's window


@pytest.mark.slow
def test_long_unbroken_text_wraps_instead_of_widening_the_pages(server, browser):
    page, base = browser, server.url
    Workflow.objects.filter(name="flaky_import").update(description=f"Imports {LONG} nightly.", owner="o" * 200)
    workflow = Workflow.objects.get(name="flaky_import")
    run, _ = trigger_workflow(workflow, {"label": LONG})
    task_run = TaskRun.objects.filter(run=run, task="fetch").get()
    now = timezone.now()
    TaskRun.objects.filter(pk=task_run.pk).update(state="dead", attempts=1, error=f"ValueError: {LONG}",
                                                  started_at=now, finished_at=now)
    attempt = Attempt.objects.create(task_run=task_run, number=1, started_at=now, finished_at=now, outcome="failed",
                                     error=f"ValueError: {LONG}", traceback=f"Traceback\n  {LONG}\nValueError")
    # The server's log storage is the data folder it was started with.
    log_file = Path(server.env["ORCHESTRATOR_DATA_DIR"]) / "logs" / logs.attempt_log_name(attempt)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text(f"fetching\n{LONG}\ndone\n")
    log_in(page, base, *operator())

    pages = {
        "workflow": "/workflows/flaky_import/", "workflows": "/workflows/", "run": f"/runs/{run.pk}/",
        "task-run": f"/task-runs/{task_run.pk}/", "runs": "/runs/", "dead-letter": "/dead-letter/",
    }
    widths = {}
    for name, path in pages.items():
        page.goto(base + path)
        widths[name] = page.evaluate("document.documentElement.scrollWidth")
        shot(page, f"long-text-{name}")
    assert all(width <= WIDTH for width in widths.values()), widths
    # The text is all there, wrapped, not cut off.
    page.goto(base + pages["task-run"])
    assert LONG in page.inner_text("pre.log")
    page.goto(base + pages["workflow"])
    assert LONG in page.inner_text("body")
