"""The log view's levels: each line of an attempt's log carries the level its filter uses. A
``logging`` record and every line of its traceback (chained exceptions and the exception line that
ends it included) carry the record's level, a traceback outside a record (the attempt's failure) is
an error; text the task printed carries ``stdout``, its own level,
so "warning and above" hides it and "debug and above" differs from "every line"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.core.files.base import ContentFile
from django.templatetags.static import static
from django.urls import reverse

from orchestrator import access, clock, conf, logs
from orchestrator.models import Attempt, TaskRun, TaskState, Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from orchestrator.templatetags.orchestrator_logs import log_lines

LOG = """printed first
2026-03-29 00:30:00,250 DEBUG shop: counting
2026-03-29 00:30:00,251 ERROR shop: gave up
Traceback (most recent call last):
  File "shop.py", line 3, in count
    raise KeyError("eu")
KeyError: 'eu'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "shop.py", line 5, in count
    raise ValueError("no orders")
ValueError: no orders
printed last
2026-03-29 00:30:01,000 WARNING shop: late
ValueError: printed by the task, after a record without a traceback
Traceback (most recent call last):
  File "shop.py", line 9, in main
RuntimeError: the attempt failed
printed after the failure
"""


def levels(text: str) -> list[tuple[str, str]]:
    return [(level, line) for level, line in
            re.findall(r'<span class="ln" data-level="(\w+)">(.*?)\n</span>', str(log_lines(text)), re.S)]


def test_every_line_has_a_level_and_printed_text_is_stdout():
    found = levels(LOG)
    assert len(found) == len(LOG.splitlines())
    assert [level for level, _ in found] == (
        ["stdout", "debug"] + ["error"] * 12 + ["stdout", "warning", "stdout"] + ["error"] * 3 + ["stdout"])
    assert found[13] == ("error", "ValueError: no orders")  # the end of the record's traceback
    assert found[16][0] == "stdout"  # an exception-like line no traceback leads to is printed text
    # A traceback outside any record (the attempt's own failure) is an error, to its exception line.
    assert found[-2] == ("error", "RuntimeError: the attempt failed")



# --- the log box on the task run's page ------------------------------------------------------------


@pytest.fixture
def attempt(db, tmp_path, settings):
    settings.ORCHESTRATOR_LOG_STORAGE_OPTIONS = {"location": str(tmp_path / "logs")}
    sync_workflows()
    run, _ = create_run(Workflow.objects.get(name="nightly_etl"), trigger="manual")
    tr = run.task_runs.get(task="extract")
    TaskRun.objects.filter(pk=tr.pk).update(state=TaskState.SUCCEEDED, attempts=1, started_at=clock.now(),
                                            finished_at=clock.now())
    attempt = Attempt.objects.create(task_run=tr, number=1, started_at=clock.now(), finished_at=clock.now(),
                                     outcome="succeeded")
    conf.log_storage().save(logs.attempt_log_name(attempt), ContentFile(LOG.encode()))
    return attempt


@pytest.fixture
def as_viewer(db, client):
    user = User.objects.create_user("victor", password="pw-victor")
    access.add_to_group(user, access.VIEWERS)
    client.force_login(user)
    return client


def test_the_log_box_is_a_named_region_the_keyboard_reaches_and_offers_the_printed_level(as_viewer, attempt):
    html = as_viewer.get(reverse("orchestrator:web:task_run", args=[attempt.task_run_id])).content.decode()
    box = re.search(r'<pre class="log"[^>]*>', html).group(0)
    assert 'tabindex="0"' in box and 'role="region"' in box and 'aria-label="log of attempt #1"' in box
    assert '<option value="stdout">printed (stdout)</option>' in html
    assert html.count('data-level="stdout"') == 4


def test_the_log_fragments_address_opened_in_a_browser_is_the_task_runs_page_at_that_attempt(as_viewer, attempt):
    url = reverse("orchestrator:web:attempt_log", args=[attempt.pk])
    page = as_viewer.get(url + "?offset=20")
    assert page.status_code == 302
    assert page["Location"] == f"/task-runs/{attempt.task_run_id}/?attempt=1&offset=20"
    fragment = as_viewer.get(url + "?offset=20", headers={"HX-Request": "true"})
    assert fragment.status_code == 200 and "<html" not in fragment.content.decode()


def test_favicon_ico_is_answered_and_every_page_names_the_icon_the_admins_included(as_viewer, admin_client):
    icon = as_viewer.get("/favicon.ico")
    assert icon.status_code == 302 and icon["Location"] == static("orchestrator/favicon.svg")
    assert Path(finders.find("orchestrator/favicon.svg")).read_text().startswith("<svg")
    link = f'<link rel="icon" href="{static("orchestrator/favicon.svg")}" type="image/svg+xml">'
    assert link in as_viewer.get("/runs/").content.decode()
    assert link in admin_client.get("/admin/").content.decode()
