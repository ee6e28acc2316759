# ruff: noqa: F811 - pytest fixtures imported from tests.e2e.test_browser
"""The Content-Security-Policy in a real Chromium: every page, the content htmx swaps in, the API
docs (Swagger UI), the browsable API and the admin, with no violation (the browser fixture fails a
test on any ``securitypolicyviolation`` event)."""

from __future__ import annotations

import urllib.request

import pytest
from django.contrib.auth.models import User

from orchestrator.models import Run, TaskRun
from tests.conftest import wait_for
from tests.e2e.test_browser import browser, server, wait_for_run_state, workflows  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.mark.slow
def test_every_page_runs_under_the_content_security_policy_without_a_violation(server, browser):
    page, base = browser, server.url
    with urllib.request.urlopen(base + "/login/", timeout=10) as response:
        policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self';" in policy + ";" and "unsafe-inline" not in policy and "object-src 'none'" in policy

    # An inline script is refused, and the listener reports it: the check can fail.
    page.goto(base + "/login/")
    page.evaluate("""() => { const s = document.createElement('script'); s.textContent = 'window.ran = 1';
                            document.body.appendChild(s); }""")
    wait_for(lambda: page.csp_violations, timeout=10, message="the probe's violation")
    assert page.evaluate("window.ran") is None and "script-src" in page.csp_violations[0]
    page.csp_violations.clear()

    server.processes.start("dispatcher", env=server.env)
    server.processes.start("worker", "--queues", "default", "--concurrency", "2", env=server.env)
    User.objects.create_superuser("root", password="a-long-password-3")
    page.goto(base + "/login/")
    page.fill("input[name=username]", "root")
    page.fill("input[name=password]", "a-long-password-3")
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")

    # A run triggered from the page and watched to its end: the live parts are htmx swaps.
    page.goto(base + "/workflows/sales_report/")
    page.click("#trigger button[type=submit]")
    page.wait_for_url(f"{base}/runs/*/")
    wait_for_run_state(page, "succeeded", server.processes)
    assert page.locator("#live .gantt .bar.out-succeeded").count() == 5
    # The bars are sized from data attributes by the static script, not by style attributes.
    assert page.locator("#live .gantt .bar[style]").count() == 5
    run = Run.objects.get(trigger="manual")
    task_run = TaskRun.objects.filter(run=run).first()

    pages = ["/", "/workflows/", "/workflows/sales_report/", "/runs/", f"/runs/{run.pk}/",
             f"/task-runs/{task_run.pk}/", "/dead-letter/", "/audit/",
             "/api/runs/", f"/api/runs/{run.pk}/", "/api/workflows/",
             "/admin/", "/admin/orchestrator/run/", f"/admin/orchestrator/run/{run.pk}/change/",
             "/admin/orchestrator/workflow/", "/admin/auth/user/", "/admin/auth/user/add/",
             "/admin/knox/authtoken/add/"]
    for path in pages:
        response = page.goto(base + path)
        assert response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"], path
        page.wait_for_load_state("load")
        page.wait_for_timeout(500)  # what the page's scripts and htmx do right after loading

    # Swagger UI draws the schema with its script from ?script and its style from a static file.
    page.goto(base + "/api/docs/")
    page.wait_for_selector(".swagger-ui .information-container", timeout=20_000)
    page.wait_for_selector("text=/api/runs/", timeout=20_000)
    page.wait_for_load_state("networkidle")
    assert page.csp_violations == []
