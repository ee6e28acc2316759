# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""Bad input never reaches a server error: each request below once answered 500 (a Django debug
page under ./dev run). The API answers a 400 (or 404) in JSON that names what is wrong, the pages
answer a 400 page in the site's style, and nothing stored changes.

Django's test client re-raises any exception a view lets through, so a regression fails here with
its traceback rather than as a mere status code."""

from __future__ import annotations

import json
import re
import textwrap
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.test import Client

from orchestrator import dispatcher, logs
from orchestrator.models import Attempt, Run, TaskRun, Workflow
from orchestrator.runs import create_run, trigger_workflow
from orchestrator.sync import sync_workflows
from tests.support.api_support import api, operator, stored, workflow  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

NOTES = '''
from orchestrator.dsl import Param, Workflow

wf = Workflow("notes", params={"note": Param(str, default=""), "ratio": Param(float, default=1.0),
                               "count": Param(int, default=1), "tags": Param(list, default=[])})

@wf.task
def write(ctx):
    return ctx.params["note"]
'''


@pytest.fixture(autouse=True)
def log_storage(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "logs")},
    }}


@pytest.fixture
def notes(tmp_path) -> Workflow:
    """A workflow with free-text, number and list params."""
    package = f"notes_{uuid.uuid4().hex[:10]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "notes.py").write_text(textwrap.dedent(NOTES))
    assert sync_workflows(tmp_path / package, package).created == ["notes"]
    return Workflow.objects.select_related("current_version").get(name="notes")


@pytest.fixture
def attempt_with_log(workflow) -> Attempt:
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    task_run = TaskRun.objects.filter(run=run).order_by("id").first()
    attempt = Attempt.objects.create(task_run=task_run, number=1, started_at=run.created_at, outcome="failed",
                                     finished_at=run.created_at)
    default_storage.save(logs.attempt_log_name(attempt), ContentFile(b"a line of log\n"))
    return attempt


@pytest.fixture
def browser(operator) -> Client:
    """The web pages as a logged-in operator."""
    client = Client()
    client.force_login(operator)
    return client


def assert_api_error(response, status: int, field: str, *fragments: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert field in body, body
    message = " ".join(str(m) for m in body[field]) if isinstance(body[field], list) else str(body[field])
    for fragment in fragments:
        assert fragment in message, message
    return body


def assert_error_page(response, *fragments: str) -> str:
    assert response.status_code == 400, response.content[:500]
    html = response.content.decode()
    assert "<title>Bad request · Orchestrator</title>" in html and 'class="card"' in html  # the site's page
    for fragment in fragments:
        assert fragment in html, html
    return html


# --- the API ------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", ["0001-01-01T00:00:00Z", "0001-01-02T00:00:00Z"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_backfill_from_the_first_days_of_the_calendar_is_refused_naming_start(api, workflow, start, dry_run):
    before = stored()
    response = api.post("/api/backfills/", {"workflow": "reports", "start": start, "end": "0001-01-03T00:00:00Z",
                                            "dry_run": dry_run}, format="json")
    assert_api_error(response, 400, "start", "outside the range of logical dates, 1900-01-01 to 2199-12-31")
    assert stored() == before


@pytest.mark.parametrize("path", ["/api/workflows/reports/runs/", "/api/jobs/", "/api/backfills/",
                                  "/api/runs/{run}/cancel/", "/api/dlq/retry/"])
def test_json_nested_100000_deep_is_a_400(api, workflow, path):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    before = stored()
    deep = "[" * 100_000 + "]" * 100_000
    response = api.generic("POST", path.format(run=run.pk), deep, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "nested far deeper than the 32 levels allowed" in response.json()["detail"]
    assert stored() == before


@pytest.mark.parametrize("path", ["/api/runs/", "/api/jobs/", "/api/backfills/", "/api/dlq/",
                                  "/api/workflows/reports/runs/"])
@pytest.mark.parametrize("cursor", ["cD14", "older.x", "older.1.2.3", "newer.99999999999999999999", "older.-1"])
def test_a_cursor_that_is_not_a_position_is_a_400_naming_it(api, workflow, path, cursor):
    response = api.get(path, {"cursor": cursor})
    assert_api_error(response, 400, "cursor", "expected a cursor like", repr(cursor))


@pytest.mark.parametrize("offset", ["9223372036854775807", "99999999999999999999", "1099511627777", "-1", "²", "1.0"])
def test_a_log_offset_beyond_any_log_is_a_400_naming_it(api, attempt_with_log, offset):
    task_run = attempt_with_log.task_run_id
    response = api.get(f"/api/task-runs/{task_run}/attempts/1/log/", {"offset": offset})
    assert_api_error(response, 400, "offset")
    # The largest offset allowed reads nothing, without an error.
    response = api.get(f"/api/task-runs/{task_run}/attempts/1/log/", {"offset": str(2**40)})
    assert response.status_code == 200 and response.json()["text"] == ""


@pytest.mark.parametrize("limit", ["-1", "0", "abc", "1e20", "null", "", "501", "5.0", "99999999999999999999"])
@pytest.mark.parametrize("path", ["/api/runs/", "/api/jobs/", "/api/backfills/", "/api/dlq/"])
def test_an_invalid_limit_is_refused_naming_it_not_replaced(api, path, limit):
    response = api.get(path, {"limit": limit})
    assert_api_error(response, 400, "limit", "must be a whole number from 1 to 500", repr(limit))


def test_pages_follow_their_links_both_ways_with_any_limit(api, workflow):
    runs = [trigger_workflow(workflow, {"day": "2026-03-01"})[0].pk for _ in range(5)]
    first = api.get("/api/runs/", {"limit": "2"}).json()
    assert [r["id"] for r in first["results"]] == runs[:-3:-1] and first["previous"] is None
    second = api.get(first["next"]).json()
    assert [r["id"] for r in second["results"]] == [runs[2], runs[1]]
    assert "cursor=older." in first["next"] and "limit=2" in first["next"]
    third = api.get(second["next"]).json()
    assert [r["id"] for r in third["results"]] == [runs[0]] and third["next"] is None
    back = api.get(third["previous"]).json()
    assert [r["id"] for r in back["results"]] == [runs[2], runs[1]]
    assert [r["id"] for r in api.get(back["previous"]).json()["results"]] == runs[:-3:-1]
    # A cursor past either end is a valid, empty page.
    assert api.get("/api/runs/", {"cursor": "older.1"}).json() == {"next": None, "previous": None, "results": []}


def test_the_dead_letter_queue_pages_by_the_time_each_task_run_died(api, workflow):
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    dead = []
    for minutes in (5, 1, 3):  # created in this order, died in another
        run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
        task_run = TaskRun.objects.filter(run=run).order_by("id").first()
        TaskRun.objects.filter(pk=task_run.pk).update(state="dead", finished_at=now + timedelta(minutes=minutes))
        dead.append(task_run.pk)
    first = api.get("/api/dlq/", {"limit": "2"}).json()
    assert [t["id"] for t in first["results"]] == [dead[0], dead[2]]
    assert first["next"].split("cursor=")[1].split("&")[0] == f"older.{int((now + timedelta(minutes=3)).timestamp()) * 10**6}.{dead[2]}"
    assert [t["id"] for t in api.get(first["next"]).json()["results"]] == [dead[1]]


@pytest.mark.parametrize(("query", "field"), [("workflow=", "workflow"), ("state=", "state"),
                                              ("created_after=", "created_after")])
def test_an_empty_filter_is_refused_rather_than_read_as_any(api, workflow, query, field):
    response = api.get(f"/api/runs/?{query}")
    assert_api_error(response, 400, field, "must not be empty")


@pytest.mark.parametrize("path", ["/api/runs/?workflow=nope", "/api/dlq/?workflow=nope"])
def test_a_filter_by_an_unknown_workflow_is_a_404_naming_it(api, workflow, path):
    assert_api_error(api.get(path), 404, "workflow", "unknown workflow 'nope'")


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/api/runs/{run}/cancel/", {"reason": 0}, "reason"),
    ("/api/runs/{run}/cancel/", {"reason": ["a"]}, "reason"),
    ("/api/workflows/reports/runs/", {"priority": "5"}, "priority"),
    ("/api/workflows/reports/runs/", {"priority": 5.0}, "priority"),
    ("/api/workflows/reports/runs/", {"priority": True}, "priority"),
    ("/api/backfills/", {"workflow": "reports", "start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z",
                         "dry_run": "yes"}, "dry_run"),
    ("/api/backfills/", {"workflow": 7, "start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}, "workflow"),
    ("/api/dlq/retry/", {"ids": ["1"]}, "ids"),
    ("/api/jobs/", {"ref": "workflows.jobs:noop", "timeout": "5"}, "timeout"),
    ("/api/jobs/", {"ref": "workflows.jobs:noop", "queue": 5}, "queue"),
])
def test_a_value_of_the_wrong_json_type_is_refused_as_the_schema_says(api, workflow, path, body, field):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    before = stored()
    response = api.post(path.format(run=run.pk), body, format="json")
    assert_api_error(response, 400, field)
    assert stored() == before


@pytest.mark.parametrize("text", ["a\x00b", "\ud800"])
def test_text_postgresql_cannot_store_is_a_400_in_any_json_field(api, workflow, text):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    before = stored()

    def post(path, body):
        # json.dumps writes both as \u escapes, as a client would send them.
        return api.generic("POST", path, json.dumps(body), content_type="application/json")

    assert_api_error(post(f"/api/runs/{run.pk}/cancel/", {"reason": text}), 400, "reason")
    assert_api_error(post("/api/workflows/reports/runs/", {"params": {"day": "2026-03-01", "currency": text}}),
                     400, "params")
    assert_api_error(post("/api/jobs/", {"ref": "workflows.jobs:noop", "kwargs": {"k": [text]}}), 400, "kwargs",
                     "at k[0]")
    assert_api_error(post("/api/jobs/", {"ref": "workflows.jobs:noop", "args": [{text: 1}]}), 400, "args")
    assert stored() == before


@pytest.mark.parametrize("header", ["a\x00b", " key", "key ", "", "ключ", "x" * 256])
def test_an_idempotency_key_header_outside_printable_ascii_is_a_400(api, workflow, header):
    before = stored()
    response = api.post("/api/workflows/reports/runs/", {"params": {"day": "2026-03-01"}}, format="json",
                        headers={"Idempotency-Key": header})
    assert response.status_code == 400, response.content
    assert stored() == before


def test_a_trigger_with_a_logical_date_outside_the_window_is_refused_naming_it(api, workflow):
    before = stored()
    for date in ("9999-12-31T00:00:00Z", "2200-01-01T00:00:00Z", "1899-12-31T23:59:59Z"):
        response = api.post("/api/workflows/reports/runs/", {"params": {"day": "2026-03-01"}, "logical_date": date},
                            format="json")
        assert_api_error(response, 400, "logical_date", "outside the range of logical dates")
    assert stored() == before
    for date in ("1900-01-01T00:00:00Z", "2199-12-31T23:59:59Z"):
        response = api.post("/api/workflows/reports/runs/", {"params": {"day": "2026-03-01"}, "logical_date": date},
                            format="json")
        assert response.status_code == 201, response.content


def test_the_schedule_delay_of_a_triggered_run_counts_from_its_creation_not_its_logical_date():
    from django.utils import timezone

    from orchestrator.worker import Worker as WorkerLoop

    # created_at is the database row's own time, so this test runs on real time; an hour later at the
    # claim stands out from any slowness of the machine.
    now = timezone.now()
    spec = {"kind": "python", "ref": "tests.support.tasks_for_tests:add", "call": "job", "args": [1, 2], "kwargs": {}}
    past, _ = create_run(None, trigger="api", tasks={"a": spec}, now=now, logical_date=datetime(2000, 1, 1, tzinfo=UTC))
    future, _ = create_run(None, trigger="manual", tasks={"a": spec}, now=now,
                           logical_date=datetime(2199, 1, 1, tzinfo=UTC))
    job, _ = create_run(None, trigger="job", tasks={"a": spec}, now=now, logical_date=now - timedelta(hours=1))
    later = now + timedelta(hours=1)
    dispatcher.tick(now=later)
    loop = WorkerLoop(["default"], concurrency=4)
    loop.register()
    assert len(loop.claim(8, later)) == 3
    delays = dict(Run.objects.filter(pk__in=[past.pk, future.pk, job.pk]).values_list("pk", "schedule_delay"))
    # Due when created: an hour; a job is due at its logical date (its run_after): two hours.
    assert delays == {past.pk: pytest.approx(3600, abs=60), future.pk: pytest.approx(3600, abs=60),
                      job.pk: pytest.approx(7200, abs=60)}


def test_a_bug_in_an_api_view_answers_json_without_internals(api, workflow, monkeypatch, settings):
    settings.DEBUG = True  # even the debug page would show source and locals

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr("orchestrator.api.views.workflow_detail", broken)
    api.raise_request_exception = False
    response = api.get("/api/workflows/reports/")
    assert response.status_code == 500
    assert response.json() == {"detail": "internal server error; the server's log has the details"}
    assert b"secret" not in response.content and b"Traceback" not in response.content
    # The test client (like an error tracker) still hears about the exception.
    api.raise_request_exception = True
    with pytest.raises(RuntimeError, match="secret internals"):
        api.get("/api/workflows/reports/")


def test_a_bug_in_a_page_answers_a_plain_page_without_internals(operator, workflow, monkeypatch, settings):
    settings.DEBUG = False

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr("orchestrator.web.workflows.workflow_context", broken)
    client = Client(raise_request_exception=False)
    client.force_login(operator)
    response = client.get("/workflows/reports/")
    assert response.status_code == 500
    html = response.content.decode()
    assert "<h1>Server error</h1>" in html and "app.css" in html
    assert "secret" not in html and "Traceback" not in html


# --- the pages ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/runs/?until=9999-12-31", "/dead-letter/?until=9999-12-31",
                                  "/runs/?since=0001-01-01&until=9999-12-31"])
def test_a_date_filter_up_to_the_end_of_the_calendar_lists_everything(browser, workflow, path):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    TaskRun.objects.filter(run=run).update(state="dead", finished_at=run.created_at)
    response = browser.get(path)
    assert response.status_code == 200
    assert f"#{run.pk}" in response.content.decode()


@pytest.mark.parametrize(("query", "name"), [
    ("offset=99999999999999999999", "offset"), ("offset=9223372036854775807", "offset"), ("offset=%C2%B2", "offset"),
    ("offset=-5", "offset"), ("attempt=99999999999999999999999", "attempt"), ("attempt=%C2%B2", "attempt"),
])
def test_a_task_run_page_with_an_impossible_number_is_a_400_page_naming_it(browser, attempt_with_log, query, name):
    response = browser.get(f"/task-runs/{attempt_with_log.task_run_id}/?{query}")
    assert_error_page(response, f"{name} must be a whole number from")
    response = browser.get(f"/attempts/{attempt_with_log.pk}/log/?offset=99999999999999999999")
    assert_error_page(response, "offset must be a whole number from 0 to 1,099,511,627,776")


@pytest.mark.parametrize("query", ["run=99999999999999999999", "run=%C2%B2", "run=abc", "run=0"])
def test_a_workflow_page_with_an_impossible_run_number_is_a_400_page(browser, workflow, query):
    assert_error_page(browser.get(f"/workflows/reports/?{query}"), "run must be a whole number from 1")


def test_a_text_param_with_a_nul_byte_shows_the_error_on_the_form_and_creates_nothing(browser, notes):
    before = stored()
    response = browser.post("/workflows/notes/trigger/", {"param.note": "a\x00b"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "contains a NUL character" in html and 'id="e-note"' in html
    assert stored() == before


@pytest.mark.parametrize(("values", "name", "fragment"), [
    ({"param.ratio": "inf"}, "ratio", "expected a finite number"),
    ({"param.ratio": "nan"}, "ratio", "expected a finite number"),
    ({"param.count": "9" * 30}, "count", "expected an integer from"),
    ({"param.count": "9" * 5000}, "count", "expected an integer, got"),
    ({"param.tags": "[" * 100_000 + "]" * 100_000}, "tags", "expected a JSON list"),
    ({"param.tags": "[" * 5000 + "]" * 5000}, "tags", "nested deeper than 32 levels"),
    ({"param.tags": '["\\u0000"]'}, "tags", "contains a NUL character"),
])
def test_a_param_json_cannot_hold_is_an_error_on_the_form(browser, notes, values, name, fragment):
    before = stored()
    response = browser.post("/workflows/notes/trigger/", values)
    assert response.status_code == 400
    message = re.search(f'<span class="error field-error" id="e-{name}">(.*?)</span>', response.content.decode())
    assert message and fragment in message.group(1)
    assert len(message.group(1)) < 300  # a huge value is quoted only in part
    assert stored() == before


@pytest.mark.parametrize("path", ["/workflows/a%00b/", "/runs/?workflow=a%00b", "/dead-letter/?queue=a%00b",
                                  "/dead-letter/?error=x%00", "/runs/?a%00=1", "/admin/orchestrator/run/?state=a%00b"])
def test_a_nul_byte_anywhere_in_the_address_is_a_400_page(browser, workflow, path):
    assert_error_page(browser.get(path), "contains a NUL character")


def test_a_nul_byte_in_the_api_address_is_a_json_400(api, workflow):
    assert_api_error(api.get("/api/workflows/a%00b/"), 400, "path", "contains a NUL character")
    assert_api_error(api.get("/api/runs/?workflow=a%00b"), 400, "workflow", "contains a NUL character")


def test_a_nul_byte_in_a_cookie_or_a_header_is_a_400_not_a_session_lookup(workflow):
    response = Client(HTTP_COOKIE="sessionid=abcdefgh\x00ijk").get("/")
    assert_error_page(response, "the cookie &#x27;sessionid&#x27; contains a NUL character")
    response = Client(HTTP_X_FORWARDED_FOR="1.2.3.4\x00").get("/api/runs/")
    assert_api_error(response, 400, "X-Forwarded-For", "contains a NUL character")


@pytest.mark.parametrize("name", ["sec/slash", ""])
def test_every_page_shows_a_workflow_stored_under_a_name_that_a_url_cannot_hold(browser, workflow, operator, name):
    # Sync no longer stores such names; a row from before must not take the pages down.
    old = Workflow.objects.create(name=name, module="gone", broken=True, sync_error="bad name", present=True,
                                  current_version=workflow.current_version)
    run, _ = create_run(old, trigger="manual")
    task_run = TaskRun.objects.filter(run=run).order_by("id").first()
    TaskRun.objects.filter(pk=task_run.pk).update(state="dead", finished_at=run.created_at)
    operator.is_staff = operator.is_superuser = True
    operator.save()
    for path in ["/", "/workflows/", "/runs/", f"/runs/{run.pk}/", f"/task-runs/{task_run.pk}/", "/dead-letter/",
                 f"/workflows/{name}/", f"/admin/orchestrator/workflow/{old.pk}/change/",
                 "/admin/orchestrator/workflow/", "/api/workflows/", f"/api/runs/{run.pk}/", "/api/dlq/"]:
        response = browser.get(path)
        assert response.status_code == 200, (path, response.status_code)
        # Its links (or, on its own page, its forms) lead to it.
        assert f'"/workflows/{name}/' in response.content.decode() or path.startswith(("/api/", "/admin/")), path
    assert browser.post(f"/workflows/{name}/pause/").status_code == 302
    assert Workflow.objects.get(pk=old.pk).paused


# --- the admin and the command line ---------------------------------------------------------------


def test_a_backfill_from_the_year_1_in_the_admin_shows_the_error_on_the_form(browser, operator, workflow):
    operator.is_staff = True
    operator.save()
    before = stored()
    response = browser.post(f"/admin/orchestrator/workflow/{workflow.pk}/backfill/",
                            {"start": "0001-01-01 00:00", "end": "0001-01-03 00:00", "reprocess": "none",
                             "params": '{"day": "2026-01-01"}'})
    assert response.status_code == 200
    assert "outside the range of logical dates" in response.content.decode()
    assert stored() == before


@pytest.mark.parametrize(("start", "end"), [("0001-01-01", "0001-01-03"), ("9999-12-30", "9999-12-31"),
                                            ("2000-01-01", "9999-12-31")])
def test_a_backfill_outside_the_window_on_the_command_line_says_why(workflow, start, end):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="outside the range of logical dates"):
        call_command("backfill", "reports", "--start", start, "--end", end, "--dry-run")
