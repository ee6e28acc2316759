"""The pages in a real headless Chromium against a real server, dispatcher and worker: an
operator logs in, triggers a run with params, watches it turn green without reloading, reads a
task's log, retries a dead task from the dead-letter queue, and backfills from the admin after
a dry run. Each page is saved as a screenshot under test-artifacts/."""

from __future__ import annotations

import shutil
import socket
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from orchestrator import access
from orchestrator.models import Attempt, Backfill, Run, TaskRun, Workflow
from orchestrator.sync import sync_workflows
from tests.conftest import ROOT, process_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
FAST = {"ORCHESTRATOR_POLL_SECONDS": "0.2", "ORCHESTRATOR_HEARTBEAT_SECONDS": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def workflows():
    sync_workflows(ROOT / "tests" / "e2e" / "workflows", "tests.e2e.workflows")


@pytest.fixture
def server(processes, tmp_path, workflows, monkeypatch):
    """A real web server (and, for ``stack``, a dispatcher and a worker) on the test database."""
    # Playwright's sync API runs an event loop in this thread; the ORM calls of the test are
    # still plain synchronous calls.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
    env = process_env(ORCHESTRATOR_DATA_DIR=tmp_path / "data", **FAST)
    port = free_port()
    proc = processes.start("runserver", f"127.0.0.1:{port}", "--noreload", env=env, name="web")
    base = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"the server exited:\n{processes.output(proc)}")
        try:
            return urllib.request.urlopen(base + "/login/", timeout=2).status == 200
        except OSError:
            return False

    wait_for(up, timeout=30, interval=0.2, message="the web server")
    return type("Server", (), {"url": base, "env": env, "processes": processes})


@pytest.fixture
def browser(tmp_path):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900}, timezone_id="Europe/Berlin", locale="en-GB",
        )
        context.set_default_timeout(15_000)
        # Every page of every browser test obeys the Content-Security-Policy: a violation (an
        # inline script or style, an on* attribute, a foreign source), on a page or in content
        # htmx swaps in, fails the test that met it.
        context.add_init_script(CSP_LISTENER)
        page = context.pages[0] if context.pages else context.new_page()
        page.dialogs = []
        page.csp_violations = []
        page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.accept()))
        page.on("console", lambda message: csp_violation(page, message.text))
        yield page
        context.close()
        assert page.csp_violations == [], "Content-Security-Policy violations:\n" + "\n".join(page.csp_violations)


CSP_LISTENER = """
document.addEventListener("securitypolicyviolation", function (e) {
  console.error("CSP violation: " + e.violatedDirective + " blocked " + (e.blockedURI || "inline") + " in "
                + e.documentURI + " at " + e.sourceFile + ":" + e.lineNumber + " " + e.sample);
}, true);
"""


def csp_violation(page, text: str) -> None:
    if text.startswith("CSP violation") or "Content Security Policy" in text:
        page.csp_violations.append(f"{page.url}: {text}")


def seed_history(workflow: Workflow, days: int = 24):
    """Finished scheduled runs of the last days, as the scheduler would have left them: every
    fifth lost count_apac (so publish never ran), one was cancelled. Only terminal states, so
    the dispatcher and the worker leave them alone."""
    now = timezone.now().replace(microsecond=0)
    tasks = workflow.current_version.spec["tasks"]
    for day in range(days, 0, -1):
        fired = now - timedelta(days=day)
        failed, cancelled = day % 5 == 0, day == 7
        run = Run.objects.create(
            workflow=workflow, version=workflow.current_version, logical_date=fired, trigger="schedule",
            state="cancelled" if cancelled else "failed" if failed else "succeeded", started_at=fired,
            finished_at=fired + timedelta(seconds=40 + day * 3), schedule_delay=0.4,
        )
        for index, name in enumerate(tasks):
            state = "succeeded"
            if failed and name == "count_apac":
                state = "dead"
            elif failed and name == "publish":
                state = "upstream_failed"
            elif cancelled and name != "extract":
                state = "cancelled"
            started = fired + timedelta(seconds=index * 8)
            task_run = TaskRun.objects.create(
                run=run, task=name, state=state, spec=tasks[name], upstream=tasks[name]["upstream"],
                attempts=0 if state in ("upstream_failed", "cancelled") else 1,
                error="TimeoutError: the APAC warehouse did not answer" if state == "dead" else "",
                started_at=started, finished_at=started + timedelta(seconds=8),
            )
            if task_run.attempts:
                Attempt.objects.create(task_run=task_run, number=1, started_at=started,
                                       finished_at=started + timedelta(seconds=8),
                                       outcome="succeeded" if state == "succeeded" else "timed_out")


def wait_for_run_state(page, state: str, processes, timeout: float = 60):
    """Wait, without reloading, until the run page shows ``state``; fail early if a process died."""

    def shown():
        for proc in processes.started:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[2]} exited:\n{processes.output(proc)[-3000:]}")
        return page.locator(f'#live[data-state="{state}"]').count() == 1

    wait_for(shown, timeout=timeout, interval=0.25, message=f"the run page to show {state}")


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def log_in(page, base: str, username: str, password: str, start: str = "/"):
    page.goto(base + start)
    assert "/login/" in page.url
    shot(page, "login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(base + start)


def operator(username="olivia", password="a-long-password-1"):
    user = User.objects.create_user(username, password=password)
    access.add_to_group(user, access.OPERATORS)
    return username, password


@pytest.mark.slow
def test_an_operator_triggers_a_run_watches_it_succeed_and_retries_a_dead_task(server, browser):
    processes, page, base = server.processes, browser, server.url
    seed_history(Workflow.objects.get(name="sales_report"))
    processes.start("dispatcher", env=server.env)
    processes.start("worker", "--queues", "default", "--concurrency", "3", env=server.env)
    log_in(page, base, *operator())

    # A bad value is answered next to its field and creates nothing.
    page.goto(base + "/workflows/sales_report/")
    page.fill("input[name='param.orders']", "lots")
    page.click("#trigger button[type=submit]")
    assert page.inner_text("#e-orders") == 'expected an integer, got "lots"'
    assert not Run.objects.filter(trigger="manual").exists()

    page.fill("input[name='param.orders']", "40")
    page.select_option("select[name='param.currency']", "USD")
    page.click("#trigger button[type=submit]")
    page.wait_for_url(f"{base}/runs/*/")
    run = Run.objects.get(trigger="manual")
    assert run.params == {"orders": 40, "currency": "USD", "dry_run": False}
    # The page updates itself: a marker set in this document survives until the run is green.
    page.evaluate("window.notReloaded = true")
    wait_for_run_state(page, "succeeded", processes)
    assert page.evaluate("window.notReloaded") is True
    assert page.locator("#live .gantt .bar.out-succeeded").count() == 5
    page.wait_for_timeout(2500)
    assert page.evaluate("window.notReloaded") is True  # polling stopped; still the same document
    assert page.locator("time").first.get_attribute("title").endswith("UTC")
    shot(page, "run")

    page.click("#live table.list >> text=publish")
    page.wait_for_selector("pre.log")
    assert page.inner_text("pre.log").strip() == "Sales report: 120 orders in USD"
    shot(page, "task-log")

    page.goto(base + "/workflows/sales_report/")
    assert page.locator("table.grid a.runbar").count() == 25  # 24 scheduled days and the manual run
    assert page.locator("table.grid a.cell.st-dead").count() == 4
    shot(page, "workflow")
    page.goto(base + "/workflows/")
    shot(page, "workflows")

    # The flaky workflow's first attempt fails: its task lands in the dead-letter queue.
    page.goto(base + "/workflows/flaky_import/")
    page.fill("input[name='param.label']", "orders feed")
    page.click("#trigger button[type=submit]")
    page.wait_for_url(f"{base}/runs/*/")
    wait_for_run_state(page, "failed", processes)
    dead = TaskRun.objects.get(task="fetch", state="dead")
    page.click("#live table.list >> text=fetch")
    page.wait_for_selector("pre.log")
    assert "<script>alert('orders feed')</script> attempt 1" in page.inner_text("pre.log")
    assert "upstream said <b>no</b> to orders feed" in page.inner_text(".error-box")
    assert page.dialogs == []  # the markup was shown, never run

    page.goto(base + "/dead-letter/")
    shot(page, "dead-letter")
    page.check(f"input[name=ids][value='{dead.pk}']")
    page.click("#bulk-retry")
    assert "Retry 1 dead task run?" in page.inner_text("h1")
    shot(page, "dead-letter-confirm")
    page.click("#confirm")
    assert "Retrying 1 task run." in page.inner_text("ul.messages")
    page.goto(f"{base}/runs/{dead.run_id}/")
    wait_for_run_state(page, "succeeded", processes)
    assert TaskRun.objects.get(pk=dead.pk).attempts == 2
    assert TaskRun.objects.get(run_id=dead.run_id, task="store").result == {"stored": 3}

    # Cancel asks for confirmation (hx-confirm), posts with the CSRF header htmx sends, and the
    # page follows the redirect to the cancelled run.
    go_file = server.env["ORCHESTRATOR_DATA_DIR"] + "/go"
    page.goto(base + "/workflows/slow_export/")
    page.fill("input[name='param.go_file']", go_file)
    page.click("#trigger button[type=submit]")
    page.wait_for_url(f"{base}/runs/*/")
    slow_run = Run.objects.get(workflow__name="slow_export")
    wait_for(lambda: TaskRun.objects.filter(run=slow_run, state="running").exists(), timeout=30,
             message="the slow task to start")
    # Its log page follows the tail while the attempt runs: a later line appears without a reload.
    page.goto(f"{base}/task-runs/{slow_run.task_runs.get().pk}/")
    page.evaluate("window.notReloaded = true")
    # Polled from here: the page's own eval (wait_for_function) is what the CSP refuses.
    wait_for(lambda: "exporting" in page.inner_text("pre.log"), timeout=15, interval=0.2, message="the log's first line")
    assert "halfway there" not in page.inner_text("pre.log")
    Path(go_file).touch()
    wait_for(lambda: "halfway there" in page.inner_text("pre.log"), timeout=20, interval=0.2,
             message="the log's later line")
    assert page.evaluate("window.notReloaded") is True
    page.goto(f"{base}/runs/{slow_run.pk}/")
    page.click("#cancel")
    wait_for_run_state(page, "cancelled", processes)
    assert page.dialogs == [f"Cancel run #{slow_run.pk}? Running tasks are stopped and nothing new starts."]
    assert Run.objects.get(pk=slow_run.pk).reason == "cancelled in the web UI by olivia"

    page.goto(base + "/runs/")
    shot(page, "runs")
    page.goto(base + "/")
    shot(page, "dashboard")


def test_an_operator_backfills_a_workflow_from_the_admin_after_a_dry_run(server, browser):
    page, base = browser, server.url
    User.objects.create_superuser("root", password="a-long-password-2")
    page.goto(base + "/admin/login/?next=/admin/orchestrator/workflow/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "a-long-password-2")
    page.click("input[type=submit]")
    page.wait_for_url(base + "/admin/orchestrator/workflow/")

    etl = Workflow.objects.get(name="sales_report")
    page.check(f"input.action-select[value='{etl.pk}']")
    page.select_option("select[name=action]", "backfill")
    page.click("button[name=index]")
    page.wait_for_url(f"{base}/admin/orchestrator/workflow/{etl.pk}/backfill/")
    page.fill("input[name=start]", "2026-03-01T00:00")
    page.fill("input[name=end]", "2026-03-05T23:59")
    page.fill("textarea[name=params]", '{"orders": 5}')
    page.click("#preview-button")
    # 06:15 Berlin on weekdays: Monday 2 March to Thursday 5 March, 05:15 UTC
    assert page.inner_text("#preview-count") == "4"
    assert page.locator("#preview-fires li").first.inner_text() == "2026-03-02 05:15:00 UTC 2026-03-02 06:15 Europe/Berlin"
    assert not Backfill.objects.exists() and not Run.objects.exists()
    shot(page, "admin-backfill-preview")

    page.click("#start-backfill")
    page.wait_for_url(f"{base}/admin/orchestrator/backfill/*/change/")
    assert "0 / 4" in page.inner_text(".field-progress")
    assert Run.objects.filter(trigger="backfill").count() == 4
    shot(page, "admin-backfill")
