# ruff: noqa: F811 - pytest fixtures imported from tests.support
"""The operator actions on the pages: the clear dialog with its options and dry run, a whole
run's clear and marks, actions on many runs from the runs list, notes on runs and task runs, and
triggering with a chosen logical date. Each asks first, is recorded in the audit log with the
workflow's and the tasks' names, and none is shown or open to a viewer."""

import re
from datetime import UTC, datetime

import pytest
from django.urls import reverse

from orchestrator import clearing
from orchestrator.models import AuditEvent, Note, Run, RunState, TaskRun, TaskState, TenantGrant, Workflow
from tests.support.actions_support import chain, finished_run, states, task_run  # noqa: F401 - fixture
from tests.support.api_support import make_user, operator, stored, viewer  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db, pytest.mark.time_sensitive]

HTMX = {"HTTP_HX_REQUEST": "true"}


def listed_runs(html: str) -> list[str]:
    """The run ids of the dry run's list, in order."""
    table = html[html.index('id="clear-list"'):]
    table = table[:table.index("</table>")]
    return re.findall(r"<td class=\"num\"><a href=\"/runs/(\d+)/\">", table)


def digest(html: str) -> str:
    return re.search(r'name="confirm" value="([0-9a-f]+)"', html).group(1)


# --- the clear dialog of a task run -------------------------------------------------------------


def test_an_operator_clears_a_task_with_past_runs_after_a_dry_run_that_lists_them(client, operator, chain):
    first, second, third = (finished_run(chain, day) for day in (1, 2, 3))
    b = task_run(second, "b")
    client.force_login(operator)
    page = client.get(reverse("orchestrator:web:task_run", args=[b.pk])).content.decode()
    assert 'id="task-clear-options"' in page and 'id="clear-dialog"' in page
    url = reverse("orchestrator:web:task_run_clear", args=[b.pk])
    dialog = client.get(url, **HTMX)
    # htmx gets the dialog alone; the options with downstream ticked by default.
    html = dialog.content.decode()
    assert dialog.status_code == 200 and "<html" not in html and 'id="clear-dialog"' in html
    assert re.search(r'<input type="checkbox" name="downstream"[^>]*checked', html)

    preview = client.post(url, {"downstream": "on", "past": "on", "preview": "1"}, **HTMX).content.decode()
    assert 'id="clear-count">4<' in preview and "in 2 runs" in preview
    assert listed_runs(preview) == [str(first.pk)] * 2 + [str(second.pk)] * 2
    assert str(third.pk) not in listed_runs(preview)
    # A dry run changes nothing.
    assert states(first)["b"] == states(second)["b"] == "succeeded"
    assert not AuditEvent.objects.exists()

    done = client.post(url, {"downstream": "on", "past": "on", "go": "1", "confirm": digest(preview)}, **HTMX)
    assert done.status_code == 204 and done["HX-Redirect"] == reverse("orchestrator:web:task_run", args=[b.pk])
    assert states(first)["b"] == states(second)["b"] == "scheduled"
    assert states(third)["b"] == "succeeded"
    event = AuditEvent.objects.get(action="clear")
    assert (event.actor_name, event.source, event.target_type, event.target_id) == ("olga", "ui", "taskrun", str(b.pk))
    assert event.detail["workflow"] == "chain" and event.detail["task"] == "b" and event.detail["count"] == 4
    assert event.detail["changed_tasks"] == ["b", "c"] and event.detail["runs"] == [first.pk, second.pk]
    assert event.detail["options"] == {"upstream": False, "downstream": True, "only_failed": False, "past": True,
                                       "future": False}


def test_a_confirm_for_another_selection_shows_the_dry_run_again_and_clears_nothing(client, operator, chain):
    run = finished_run(chain, 1)
    b = task_run(run, "b")
    client.force_login(operator)
    url = reverse("orchestrator:web:task_run_clear", args=[b.pk])
    preview = client.post(url, {"downstream": "on", "preview": "1"}).content.decode()
    # The operator ticks upstream after the dry run: the confirm is of the old selection.
    again = client.post(url, {"downstream": "on", "upstream": "on", "go": "1", "confirm": digest(preview)})
    html = again.content.decode()
    assert again.status_code == 200 and 'id="clear-stale"' in html and 'id="clear-count">3<' in html
    assert states(run)["b"] == "succeeded" and not AuditEvent.objects.exists()


def test_the_dialog_says_when_nothing_or_too_much_matches(client, operator, chain, monkeypatch):
    runs = [finished_run(chain, day) for day in (1, 2, 3)]
    client.force_login(operator)
    url = reverse("orchestrator:web:task_run_clear", args=[task_run(runs[0], "a").pk])
    html = client.post(url, {"only_failed": "on", "preview": "1"}).content.decode()
    assert 'id="clear-none"' in html and 'id="clear-go"' not in html
    monkeypatch.setattr(clearing, "MOST", 2)
    html = client.post(url, {"downstream": "on", "future": "on", "preview": "1"}).content.decode()
    assert 'id="clear-too-many"' in html and 'id="clear-go"' not in html


def test_without_script_the_dialog_is_a_page_of_its_own(client, operator, chain):
    run = finished_run(chain, 1)
    client.force_login(operator)
    html = client.get(reverse("orchestrator:web:task_run_clear", args=[task_run(run, "b").pk])).content.decode()
    assert "<html" in html and 'id="clear-dialog"' in html and "/ clear</h1>" in html


# --- a whole run ---------------------------------------------------------------------------------


def test_an_operator_clears_the_failed_tasks_of_a_run(client, operator, chain):
    run = finished_run(chain, 1, {"b": TaskState.DEAD, "c": TaskState.UPSTREAM_FAILED}, run_state=RunState.FAILED)
    client.force_login(operator)
    page = client.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode()
    for button in ("run-clear", "run-mark-succeeded"):
        assert f'id="{button}"' in page, button
    assert 'id="run-mark-failed"' not in page  # it failed already
    url = reverse("orchestrator:web:run_clear", args=[run.pk])
    preview = client.post(url, {"only_failed": "on", "preview": "1"}).content.decode()
    assert 'id="clear-count">2<' in preview and 'name="past"' not in preview
    client.post(url, {"only_failed": "on", "go": "1", "confirm": digest(preview)})
    # b's parent a had succeeded: b is due at once; c waits for b.
    assert states(run) == {"a": "succeeded", "b": "scheduled", "c": "waiting", "d": "succeeded", "e": "succeeded"}
    event = AuditEvent.objects.get(action="clear")
    assert (event.target_type, event.detail["workflow"], event.detail["changed_tasks"]) == ("run", "chain", ["b", "c"])


def test_an_operator_marks_a_run_failed_and_succeeded(client, operator, chain):
    run = finished_run(chain, 1)
    client.force_login(operator)
    page = client.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode()
    assert f'hx-confirm="Mark run #{run.pk} failed?' in page
    response = client.post(reverse("orchestrator:web:run_mark", args=[run.pk, "failed"]), follow=True)
    assert f"Marked run #{run.pk} failed" in response.content.decode()
    run.refresh_from_db()
    assert run.state == RunState.FAILED
    client.post(reverse("orchestrator:web:run_mark", args=[run.pk, "succeeded"]))
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    events = list(AuditEvent.objects.filter(action="mark").order_by("id"))
    assert [(e.target_type, e.detail["state"], e.detail["workflow"]) for e in events] == [
        ("run", "failed", "chain"), ("run", "succeeded", "chain")]
    bad = client.post(reverse("orchestrator:web:run_mark", args=[run.pk, "skipped"]))
    assert bad.status_code == 400 and "succeeded or failed" in bad.content.decode()


# --- many runs at once ---------------------------------------------------------------------------


def test_an_operator_marks_ticked_runs_after_a_dry_run(client, operator, chain):
    one = finished_run(chain, 1, {"d": TaskState.DEAD}, run_state=RunState.FAILED)
    two = finished_run(chain, 2, {"e": TaskState.FAILED, "c": TaskState.UPSTREAM_FAILED}, run_state=RunState.FAILED)
    untouched = finished_run(chain, 3, {"d": TaskState.DEAD}, run_state=RunState.FAILED)
    client.force_login(operator)
    listing = client.get(reverse("orchestrator:web:runs")).content.decode()
    assert 'id="runs-bulk"' in listing and f'id="tick-{one.pk}"' in listing
    url = reverse("orchestrator:web:runs_bulk")
    preview = client.post(url, {"action": "mark-succeeded", "ids": [one.pk, two.pk]})
    html = preview.content.decode()
    assert preview.status_code == 200 and 'id="bulk-count">3<' in html
    assert states(one)["d"] == "dead"
    done = client.post(url, {"action": "mark-succeeded", "ids": [one.pk, two.pk], "go": "1",
                             "confirm": digest(html)}, follow=True)
    assert "Marked 2 run(s) succeeded" in done.content.decode()
    assert {Run.objects.get(pk=r.pk).state for r in (one, two)} == {RunState.SUCCEEDED}
    assert Run.objects.get(pk=untouched.pk).state == RunState.FAILED
    assert sorted(AuditEvent.objects.filter(action="mark").values_list("target_id", flat=True)) == sorted(
        [str(one.pk), str(two.pk)])


def test_an_operator_clears_ticked_runs(client, operator, chain):
    one, two = finished_run(chain, 1), finished_run(chain, 2)
    client.force_login(operator)
    url = reverse("orchestrator:web:runs_bulk")
    html = client.post(url, {"action": "clear", "ids": [one.pk, two.pk]}).content.decode()
    assert 'id="bulk-count">10<' in html
    client.post(url, {"action": "clear", "ids": [one.pk, two.pk], "go": "1", "confirm": digest(html)})
    assert states(one)["a"] == states(two)["a"] == "scheduled"
    assert AuditEvent.objects.filter(action="clear", target_type="run").count() == 2


def test_the_workflow_page_ticks_its_runs_for_the_same_bulk_actions_and_comes_back(client, operator, chain):
    one = finished_run(chain, 1, {"d": TaskState.DEAD}, run_state=RunState.FAILED)
    two = finished_run(chain, 2)
    client.force_login(operator)
    page_url = reverse("orchestrator:web:workflow", args=[chain.name]) + "?state=failed"
    html = client.get(page_url).content.decode()
    # The grid's runs (here filtered to the failed one) listed newest first, each with a tick box
    # of the form that posts to the runs list's bulk action, back to this page after.
    assert 'id="workflow-runs-bulk"' in html and f'id="wf-tick-{one.pk}"' in html
    assert f'id="wf-tick-{two.pk}"' not in html
    assert f'action="{reverse("orchestrator:web:runs_bulk")}"' in html
    assert f'name="next" value="{page_url}"' in html
    url = reverse("orchestrator:web:runs_bulk")
    preview = client.post(url, {"action": "clear-failed", "ids": [one.pk], "next": page_url})
    dry = preview.content.decode()
    assert 'id="bulk-count">1<' in dry and f'href="{page_url}" id="bulk-cancel"' in dry
    done = client.post(url, {"action": "clear-failed", "ids": [one.pk], "go": "1", "confirm": digest(dry),
                             "next": page_url})
    assert done.status_code == 302 and done["Location"] == page_url
    assert states(one)["d"] == "scheduled" and AuditEvent.objects.get(action="clear").detail["bulk"] == 1


def test_the_workflow_pages_tick_boxes_are_for_operators_of_its_tenant_only(client, viewer, chain):
    run = finished_run(chain, 1)
    page_url = reverse("orchestrator:web:workflow", args=[chain.name])
    client.force_login(viewer)
    html = client.get(page_url).content.decode()
    assert f"/runs/{run.pk}/" in html and "wf-tick-" not in html and "workflow-runs-bulk" not in html
    # An operator of another tenant who may read this one's workflows: no tick box either.
    Workflow.objects.filter(pk=chain.pk).update(tenant="finance")
    both = make_user("both", None)
    TenantGrant.objects.create(user=both, role=TenantGrant.Role.OPERATOR, tenant="default")
    TenantGrant.objects.create(user=both, role=TenantGrant.Role.VIEWER, tenant="finance")
    client.force_login(both)
    html = client.get(page_url).content.decode()
    assert f"/runs/{run.pk}/" in html and "wf-tick-" not in html and "workflow-runs-bulk" not in html
    TenantGrant.objects.create(user=both, role=TenantGrant.Role.OPERATOR, tenant="finance")
    assert f'id="wf-tick-{run.pk}"' in client.get(page_url).content.decode()


@pytest.mark.parametrize("data, message", [
    ({"action": "mark-succeeded"}, "Tick at least one run."),
    ({"action": "explode", "ids": ["1"]}, "explode is not an action on runs"),
    ({"action": "clear", "ids": ["x"]}, "Select a valid choice"),
    ({"action": "clear", "ids": ["²"]}, "Select a valid choice"),
    ({"action": "clear", "ids": [str(10**30)]}, "Select a valid choice"),
    ({"action": "clear", "ids": ["999999"]}, "no run #999999"),
])
def test_bad_bulk_requests_say_what_is_wrong_and_change_nothing(client, operator, chain, data, message):
    finished_run(chain, 1)
    client.force_login(operator)
    before = stored()
    response = client.post(reverse("orchestrator:web:runs_bulk"), data)
    assert response.status_code == 400 and message in response.content.decode()
    assert stored() == before and not AuditEvent.objects.exists()


# --- notes ---------------------------------------------------------------------------------------


def test_an_operator_writes_edits_and_deletes_a_note_on_a_run_and_a_task_run(client, operator, chain):
    run = finished_run(chain, 1)
    b = task_run(run, "b")
    client.force_login(operator)
    client.post(reverse("orchestrator:web:run_note", args=[run.pk]), {"text": "  rerun after the vendor fix  "})
    page = client.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode()
    assert '<p class="note-text" id="note-text">rerun after the vendor fix</p>' in page and "by olga" in page
    client.post(reverse("orchestrator:web:task_run_note", args=[b.pk]), {"text": "<b>slow</b> today"})
    page = client.get(reverse("orchestrator:web:task_run", args=[b.pk])).content.decode()
    assert "&lt;b&gt;slow&lt;/b&gt; today" in page
    client.post(reverse("orchestrator:web:run_note", args=[run.pk]), {"text": "checked"})
    assert list(Note.objects.order_by("id").values_list("task_run", "text")) == [(None, "checked"), (b.pk, "<b>slow</b> today")]
    client.post(reverse("orchestrator:web:run_note", args=[run.pk]), {"text": ""})
    assert list(Note.objects.values_list("task_run", flat=True)) == [b.pk]
    events = list(AuditEvent.objects.filter(action="note").order_by("id"))
    assert [(e.target_type, e.detail["text"], e.detail["was"]) for e in events] == [
        ("run", "rerun after the vendor fix", ""), ("taskrun", "<b>slow</b> today", ""),
        ("run", "checked", "rerun after the vendor fix"), ("run", "", "checked")]
    assert events[1].detail["task"] == "b" and events[1].detail["workflow"] == "chain"


def test_a_note_too_long_is_a_400_that_says_so(client, operator, chain):
    run = finished_run(chain, 1)
    client.force_login(operator)
    response = client.post(reverse("orchestrator:web:run_note", args=[run.pk]), {"text": "x" * 1001})
    assert response.status_code == 400 and "at most 1000 characters" in response.content.decode()
    assert not Note.objects.exists() and not AuditEvent.objects.exists()


# --- viewers ---------------------------------------------------------------------------------------


def test_a_viewer_sees_no_action_or_note_form_and_is_refused_each(client, viewer, chain):
    run = finished_run(chain, 1, {"b": TaskState.DEAD}, run_state=RunState.FAILED)
    b = task_run(run, "b")
    client.force_login(viewer)
    pages = [client.get(reverse(name, args=[pk])).content.decode()
             for name, pk in (("orchestrator:web:run", run.pk), ("orchestrator:web:task_run", b.pk))]
    pages.append(client.get(reverse("orchestrator:web:runs")).content.decode())
    pages.append(client.get(reverse("orchestrator:web:workflow", args=[chain.name])).content.decode())
    for html in pages:
        for marker in ("task-clear-options", "run-clear", "run-mark", "runs-bulk", "note-input", "clear-dialog"):
            assert marker not in html, marker
    before = stored()
    for url, data in [
        (reverse("orchestrator:web:task_run_clear", args=[b.pk]), {"go": "1"}),
        (reverse("orchestrator:web:run_clear", args=[run.pk]), {"go": "1"}),
        (reverse("orchestrator:web:run_mark", args=[run.pk, "succeeded"]), {}),
        (reverse("orchestrator:web:runs_bulk"), {"action": "clear", "ids": [run.pk], "go": "1"}),
        (reverse("orchestrator:web:run_note", args=[run.pk]), {"text": "hi"}),
        (reverse("orchestrator:web:task_run_note", args=[b.pk]), {"text": "hi"}),
    ]:
        assert client.post(url, data).status_code == 403, url
    # Reading a dialog is an operator's too.
    assert client.get(reverse("orchestrator:web:task_run_clear", args=[b.pk])).status_code == 403
    assert client.get(reverse("orchestrator:web:run_clear", args=[run.pk])).status_code == 403
    assert stored() == before and not Note.objects.exists() and not AuditEvent.objects.exists()


# --- trigger with a logical date -----------------------------------------------------------------


def test_an_operator_triggers_a_run_for_a_chosen_logical_date_read_in_utc(client, operator, chain):
    client.force_login(operator)
    page = client.get(reverse("orchestrator:web:workflow", args=["chain"])).content.decode()
    assert 'name="logical_date" type="datetime-local"' in page
    response = client.post(reverse("orchestrator:web:workflow_trigger", args=["chain"]),
                           {"logical_date": "2026-01-15T02:30"})
    run = Run.objects.get()
    assert response.status_code == 302 and run.logical_date == datetime(2026, 1, 15, 2, 30, tzinfo=UTC)
    event = AuditEvent.objects.get(action="trigger")
    assert event.detail["logical_date"] == "2026-01-15T02:30:00+00:00"


@pytest.mark.parametrize("text, message", [
    ("15/01/2026", "expected a date and time like 2026-03-01T02:30 (UTC)"),
    ("2026-02-30T10:00", "expected a date and time like"),
    ("0001-01-01T00:00", "outside the range of logical dates"),
])
def test_a_bad_logical_date_is_a_400_next_to_its_input_and_starts_nothing(client, operator, chain, text, message):
    client.force_login(operator)
    response = client.post(reverse("orchestrator:web:workflow_trigger", args=["chain"]), {"logical_date": text})
    html = response.content.decode()
    assert response.status_code == 400
    error = re.search(r'<span class="error field-error" id="e-logical-date">([^<]*)</span>', html)
    assert error and message in error.group(1).replace("&#x27;", "'"), html[-2000:]
    assert 'aria-invalid="true"' in html and not Run.objects.exists() and not TaskRun.objects.exists()


def test_the_grid_panel_opens_the_clear_dialog_of_its_task_run(client, operator, viewer, chain):
    run = finished_run(chain, 1)
    b = task_run(run, "b")
    url = reverse("orchestrator:web:workflow", args=["chain"]) + f"?run={run.pk}&task=b&panel=1"
    client.force_login(operator)
    html = client.get(url, **HTMX).content.decode()
    assert f'id="grid-clear-options" href="{reverse("orchestrator:web:task_run_clear", args=[b.pk])}"' in html
    client.force_login(viewer)
    assert "grid-clear-options" not in client.get(url, **HTMX).content.decode()


def test_the_audit_page_counts_every_task_run_a_clear_changed(client, operator, chain, monkeypatch):
    runs = [finished_run(chain, day) for day in (1, 2, 3)]
    monkeypatch.setattr("orchestrator.clearing.AUDIT_NAMES", 2)
    client.force_login(operator)
    url = reverse("orchestrator:web:task_run_clear", args=[task_run(runs[2], "b").pk])
    preview = client.post(url, {"downstream": "on", "past": "on", "preview": "1"}).content.decode()
    client.post(url, {"downstream": "on", "past": "on", "go": "1", "confirm": digest(preview)})
    event = AuditEvent.objects.get(action="clear")
    assert (event.detail["count"], len(event.detail["changed"])) == (6, 2)
    html = client.get(reverse("orchestrator:web:audit")).content.decode()
    assert "changed 6 task runs" in html and "count=" not in html
