# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""Every page in a real Chromium at 1400 px and at 390 px (a phone), in the light and the dark
theme: axe-core finds no serious or critical violation, no request fails, no page is wider than
the window, and no Content-Security-Policy violation happens (the browser fixture fails the test
on any). A screenshot of each is saved under test-artifacts/every-page/.

The pages are found, not listed by hand: every URL pattern of the web UI is either visited here
(PAGES: how to reach it with the seeded rows) or named in NOT_PAGES with the reason (a POST, a
file download), and ``test_the_sweep_knows_every_web_url`` fails for a new pattern in neither. The
admin pages are every ModelAdmin the app registers (list, and a row's change form when it has
rows), the admin's index and the app's own admin views.

With UPDATE_DOCS_SCREENSHOTS=1 the README's screenshots in docs/ are refreshed from this run."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import URLPattern, URLResolver
from django.utils import timezone

from orchestrator import access, approval_links, audit, logs
from orchestrator.models import Attempt, Backfill, Dataset, DatasetEvent, Run, TaskRun, Workflow
from orchestrator.people import Approval
from orchestrator.web import lineage
from orchestrator.web import urls as web_urls
from tests.conftest import ROOT
from tests.e2e.test_browser import ARTIFACTS, browser, seed_history, server, workflows  # noqa: F401 - fixtures
from tests.e2e.test_pages import AXE, COLOUR_RULES, MODES, axe_problems

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SHOTS = ARTIFACTS / "every-page"
DOCS = ROOT / "docs"

# Every web URL name the sweep opens (its address is built from the seeded rows below).
PAGES = {
    "dashboard", "login", "workflows", "workflow", "workflow_calendar", "workflow_code", "runs", "run",
    "run_clear", "task_run", "task_run_clear", "task_run_result", "mapped_instances", "attempt_log", "dead_letter", "approvals",
    "approval_link", "audit", "datasets", "dataset_named", "dataset",
}
# The web URL names that are no page of their own, and why.
NOT_PAGES = {
    "logout": "POST only (Django's LogoutView)",
    "workflow_trigger": "POST; its refused answer is visited as workflow-refused-trigger",
    "workflow_pause": "POST, redirects to the workflow page",
    "workflow_resume": "POST, redirects to the workflow page",
    "workflow_backfill": "POST; the dialog is part of the workflow page",
    "run_cancel": "POST, redirects to the run page",
    "run_retry": "POST, redirects to the run page",
    "task_run_action": "POST, redirects to the task-run page",
    "attempt_log_download": "a file download (checked to answer 200), not a page",
    "approval_answer": "POST, redirects to the approvals page",
    "dataset_event": "POST; its confirmation is visited as dataset-event-confirm",
    "clock": "POST, redirects back",
    "run_mark": "POST, redirects to the run page",
    "run_note": "POST, redirects to the run page",
    "task_run_note": "POST, redirects to the task-run page",
    "runs_bulk": "POST; its dry run is visited as runs-bulk-preview",
}
# While working on some pages: SWEEP_ONLY=<regex of page names> opens only those (the test then
# proves nothing about the others).
ONLY = os.environ.get("SWEEP_ONLY", "")
LONG_LOG_LINES = 400  # many times the log box's height: it scrolls
# The README's screenshots: docs file -> (sweep screenshot, viewport) it is taken from.
DOC_SHOTS = {
    "web-workflow.png": "workflow-1400-light", "web-workflow-dark.png": "workflow-1400-dark",
    "web-run.png": "run-1400-light", "web-dead-letter.png": "dead-letter-1400-light",
    "web-runs-phone.png": "runs-390-light",
}


def web_url_names(patterns=None, prefix: str = "") -> set[str]:
    found = set()
    for entry in patterns if patterns is not None else web_urls.urlpatterns:
        if isinstance(entry, URLResolver):
            found |= web_url_names(entry.url_patterns)
        elif isinstance(entry, URLPattern) and entry.name:
            found.add(entry.name)
    return found


def test_the_sweep_knows_every_web_url():
    names = web_url_names()
    assert not names - PAGES - set(NOT_PAGES), f"open these in the sweep or say why not: {names - PAGES - set(NOT_PAGES)}"
    assert not (PAGES | set(NOT_PAGES)) - names, "names the web UI no longer has"
    assert not PAGES & set(NOT_PAGES)


def watch_requests(page) -> list[str]:
    """Requests that fail or answer 4xx/5xx, but for the document itself (its status is checked
    where it is loaded) and a poll or load the next navigation cancelled."""
    failed: list[str] = []

    def on_failed(request):
        if "ERR_ABORTED" not in (request.failure or ""):
            failed.append(f"{page.url}: {request.url}: {request.failure}")

    def on_response(response):
        if response.status >= 400 and response.request.resource_type != "document":
            failed.append(f"{page.url}: {response.url}: {response.status}")

    page.on("requestfailed", on_failed)
    page.on("response", on_response)
    return failed


def long_log(server, attempt: Attempt) -> None:
    path = Path(server.env["ORCHESTRATOR_DATA_DIR"]) / "logs" / logs.attempt_log_name(attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"2026-03-01 06:15:{i % 60:02d},000 INFO sales: row {i} of {LONG_LOG_LINES}: ok" for i in range(LONG_LOG_LINES)]
    lines[10] = "a line without a break " + "x" * 4000
    path.write_text("\n".join(lines) + "\n")


def seed(server) -> dict:
    """The rows every page needs: a history, a dead task (dead-letter queue), a task run with a
    long log and a result, a mapped task with instances, an open approval with its signed link, a
    dataset with events, a backfill; returns the addresses of the pages."""
    wf = Workflow.objects.get(name="sales_report")
    seed_history(wf, days=12)
    run = Run.objects.filter(workflow=wf, state="succeeded").order_by("-id").first()
    task_run = TaskRun.objects.get(run=run, task="publish")
    TaskRun.objects.filter(pk=task_run.pk).update(result={"published": 120, "regions": ["emea", "apac"]})
    attempt = task_run.attempt_set.get()
    long_log(server, attempt)

    daily = Workflow.objects.get(name="orders_daily")
    spec = daily.current_version.spec["tasks"]
    now = timezone.now().replace(microsecond=0)
    mapped_run = Run.objects.create(workflow=daily, version=daily.current_version, logical_date=now - timedelta(hours=2),
                                    trigger="schedule", state="succeeded", started_at=now - timedelta(hours=2),
                                    finished_at=now - timedelta(hours=1), dynamic=True)
    rows = {}
    for index, name in enumerate(["export_ready", "choose", "shops", "count_shop", "publish"]):
        started = now - timedelta(hours=2) + timedelta(minutes=index)
        rows[name] = TaskRun.objects.create(
            run=mapped_run, task=name, state="succeeded", spec=spec[name], upstream=spec[name]["upstream"],
            attempts=0 if name == "count_shop" else 1, started_at=started, finished_at=started + timedelta(seconds=30),
            result=["north", "south", "east"] if name == "shops" else None)
    for index, shop in enumerate(["north", "south", "east"]):
        TaskRun.objects.create(run=mapped_run, task="count_shop", map_index=index, item=shop, state="succeeded",
                               spec=spec["count_shop"], upstream=["shops"], attempts=1,
                               started_at=now - timedelta(minutes=100), finished_at=now - timedelta(minutes=99),
                               result={"shop": shop, "orders": 3})
    dataset = Dataset.objects.create(name="s3://warehouse/orders/daily")
    DatasetEvent.objects.create(dataset=dataset, task_run=rows["publish"], run=mapped_run, workflow=daily.name,
                                task="publish", logical_date=mapped_run.logical_date, metadata={"rows": 3},
                                created_at=now - timedelta(hours=1), handled=True)

    Dataset.objects.create(name="orders_plain")
    gate = TaskRun.objects.filter(state="succeeded", run__workflow=wf).exclude(pk=task_run.pk).first()
    approval = Approval.objects.create(task_run=gate, number=1, run=gate.run, workflow=wf.name, task=gate.task,
                                       question="Publish the weekly numbers?", options=["approve", "reject"],
                                       reject=["reject"], asked_at=now)
    with override_settings(SECRET_KEY=server.env["SECRET_KEY"]):  # the server's key signs its links
        link = approval_links.token(approval.pk, "approve", "ops@example.com")
    Backfill.objects.create(workflow=wf, start=now - timedelta(days=3), end=now, total=0)
    dead = TaskRun.objects.filter(state="dead").order_by("-id").first()
    return {
        "dashboard": "/", "workflows": "/workflows/", "workflow": "/workflows/sales_report/",
        "workflow-mapped": f"/workflows/orders_daily/?run={mapped_run.pk}",
        "workflow-consumer": "/workflows/orders_dashboard/",
        "workflow_calendar": "/workflows/sales_report/calendar/",
        "workflow_code": f"/workflows/orders_daily/code/?run={mapped_run.pk}",
        "runs": "/runs/", "run": f"/runs/{run.pk}/", "run-mapped": f"/runs/{mapped_run.pk}/",
        "run_clear": f"/runs/{run.pk}/clear/",  # the clear dialog as a page of its own (no JavaScript)
        "task_run": f"/task-runs/{task_run.pk}/", "task-run-dead": f"/task-runs/{dead.pk}/",
        "task-run-sensor": f"/task-runs/{rows['export_ready'].pk}/",
        "task_run_result": f"/task-runs/{task_run.pk}/result/",
        "task_run_clear": f"/task-runs/{dead.pk}/clear-options/",
        "task-run-result-mapped": f"/task-runs/{rows['count_shop'].pk}/result/",
        "task-run-mapped": f"/task-runs/{rows['count_shop'].pk}/",
        "mapped_instances": f"/task-runs/{rows['count_shop'].pk}/instances/",
        "attempt_log": f"/attempts/{attempt.pk}/log/",  # opened by itself: the task-run page at that attempt
        "dead_letter": "/dead-letter/", "approvals": "/approvals/",
        "approval_link": f"/approvals/answer/{link}/",
        "audit": "/audit/", "datasets": "/datasets/",
        "dataset_named": lineage.url(dataset.name),
        "dataset": "/datasets/orders_plain/",  # the first links' address: a plain name still works
        "attempt-log-download": f"/attempts/{attempt.pk}/log/download/",
    }


def admin_pages() -> dict[str, str]:
    """The admin's index, the app's index, every registered ModelAdmin's list and (when it has
    rows) its first row's change form, and the workflow's backfill form."""
    pages = {"admin": "/admin/", "admin-orchestrator": "/admin/orchestrator/"}
    for model in admin.site._registry:
        meta = model._meta
        if meta.app_label != "orchestrator":
            continue
        pages[f"admin-{meta.model_name}"] = f"/admin/orchestrator/{meta.model_name}/"
        first = model._default_manager.order_by("pk").first()
        if first is not None:
            pages[f"admin-{meta.model_name}-change"] = f"/admin/orchestrator/{meta.model_name}/{first.pk}/change/"
    wf = Workflow.objects.get(name="sales_report")
    pages["admin-workflow-backfill"] = f"/admin/orchestrator/workflow/{wf.pk}/backfill/"
    return pages


SPENT = {"axe": 0.0, "screenshots": 0.0}


def check(page, key: str, report: dict, rules: list[str] | None = None) -> None:
    width = int(key.split()[1])
    began = time.monotonic()
    report[key] = {"scroll_width": page.evaluate("document.documentElement.scrollWidth"),
                   "violations": axe_problems(page, rules), "width": width}
    SPENT["axe"] += time.monotonic() - began
    began = time.monotonic()
    name, _, mode = key.partition(" ")
    shot = f"{name}-{mode.replace(' ', '-')}"
    # PNG for the README's screenshots, JPEG (several times faster to encode) for the rest.
    if shot in DOC_SHOTS.values():
        page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)
    else:
        page.screenshot(path=str(SHOTS / f"{shot}.jpg"), full_page=True, type="jpeg", quality=80)
    SPENT["screenshots"] += time.monotonic() - began


def visit(page, base: str, name: str, path: str | None, report: dict, action=None, status: int = 200) -> None:
    """The page at each width, loaded (or produced by ``action``) once per width and checked in
    each theme: the theme is CSS only, so switching it needs no reload."""
    for width in sorted({w for w, _theme in MODES}, reverse=True):
        page.set_viewport_size({"width": width, "height": 900})
        page.emulate_media(color_scheme="light")
        if action:
            action()
        else:
            response = page.goto(base + path)
            assert response.status == status, f"{path}: {response.status}"
        page.wait_for_load_state("load")
        for number, theme in enumerate([t for w, t in MODES if w == width]):
            page.emulate_media(color_scheme=theme)
            # Colour transitions (the admin has some) end at once: axe reads the final colours.
            page.evaluate("document.getAnimations().forEach(a => { try { a.finish(); } catch (e) {} })")
            # Every rule in the first theme; in the next, which changes colours only, the colour rules.
            check(page, f"{name} {width} {theme}", report, rules=COLOUR_RULES if number else None)


@pytest.mark.slow
def test_every_page_passes_axe_fits_its_window_and_loads_every_request_in_both_themes(server, browser):
    assert AXE.exists(), "axe-core is not installed: run ./dev test (it runs npm ci in tests/e2e)"
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    page, base = browser, server.url
    started = time.monotonic()
    failed = watch_requests(page)
    report: dict = {}
    pages = seed(server)

    visit(page, base, "login", "/login/", report)  # before anyone is logged in
    User.objects.create_superuser("root", password="a-long-password-9")
    access.add_to_group(User.objects.get(username="root"), access.OPERATORS)
    page.goto(base + "/login/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "a-long-password-9")
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")
    audit.record("pause", target=Workflow.objects.get(name="sales_report"))  # the audit log has a row

    download = pages.pop("attempt-log-download")
    assert page.request.get(base + download).status == 200
    visited = set()
    for name, path in pages.items():
        if ONLY and not re.search(ONLY, name):
            continue
        visit(page, base, name.replace("_", "-"), path, report)
        visited.add(name)
    assert ONLY or PAGES <= visited | {"login"}, PAGES - visited

    # The long log scrolls in its box, by keyboard too, and does not widen the page.
    page.goto(base + pages["task_run"])
    log = page.locator("pre.log")
    assert log.get_attribute("tabindex") == "0"
    assert page.evaluate("document.querySelector('pre.log').scrollHeight > document.querySelector('pre.log').clientHeight")

    def refused_trigger():
        page.goto(base + "/workflows/sales_report/")
        page.fill("input[name='param.orders']", "lots")
        page.click("#trigger button[type=submit]")

    visit(page, base, "workflow-refused-trigger", None, report, action=refused_trigger)
    # The refused field has the focus and is described by its error.
    assert page.evaluate("document.activeElement.id") == "p-orders"
    assert page.get_attribute("#p-orders", "aria-invalid") == "true"
    assert "e-orders" in page.get_attribute("#p-orders", "aria-describedby")

    def confirm_retry():
        page.goto(base + "/dead-letter/")
        page.check("input[name=ids]")
        page.click("#bulk-retry")

    visit(page, base, "dead-letter-confirm", None, report, action=confirm_retry)

    def bulk_preview():
        page.goto(base + "/runs/")
        page.locator("input[name=ids]").first.check()
        page.select_option("#bulk-action", "clear-failed")
        page.click("#bulk-preview-button")
        page.wait_for_url("**/runs/bulk/")

    visit(page, base, "runs-bulk-preview", None, report, action=bulk_preview)

    def confirm_event():
        page.goto(base + pages["dataset_named"])
        page.fill("#event-metadata", '{"rows": 4}')
        page.click("#record-event-button")
        page.wait_for_selector("#confirm-event")

    visit(page, base, "dataset-event-confirm", None, report, action=confirm_event)

    for name, path in admin_pages().items():
        if not ONLY or re.search(ONLY, name):
            visit(page, base, name, path, report)

    # At 390 px the header's links stay on the dark header band, readable.
    page.set_viewport_size({"width": 390, "height": 900})
    page.emulate_media(color_scheme="light")
    page.goto(base + "/runs/")
    header = page.locator("header.top").bounding_box()
    for link in page.locator("header nav a").all():
        box = link.bounding_box()
        assert header["y"] <= box["y"] and box["y"] + box["height"] <= header["y"] + header["height"], box
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, box

    (ARTIFACTS / "every-page-axe.json").write_text(json.dumps(report, indent=1))
    too_wide = {key: r["scroll_width"] for key, r in report.items() if r["scroll_width"] > r["width"]}
    serious = {key: [v for v in r["violations"] if v["impact"] in ("serious", "critical")]
               for key, r in report.items()}
    serious = {key: found for key, found in serious.items() if found}
    assert not serious, serious
    assert not too_wide, too_wide
    assert failed == [], failed
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS") == "1":
        for target, shot in DOC_SHOTS.items():
            shutil.copyfile(SHOTS / f"{shot}.png", DOCS / target)
    print(f"{len(report)} page views in {time.monotonic() - started:.0f} s: axe {SPENT['axe']:.0f} s, "
          f"screenshots {SPENT['screenshots']:.0f} s")
