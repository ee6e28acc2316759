# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""Task-level actions, as Airflow users know them: retry a task run, clear it (and everything
downstream: they run again in the same run, the old attempts stay in the history) and mark it
succeeded or failed (its downstream follows its trigger rules). Through the control functions,
the API and the web pages; each recorded in the audit log, none open to viewers."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from orchestrator import clock, control
from orchestrator.channels import CANCEL_CHANNEL
from orchestrator.models import Attempt, AttemptOutcome, AuditEvent, Run, RunState, TaskRun, TaskState
from orchestrator.runs import trigger_workflow
from tests.support.api_support import (  # noqa: F401 - fixtures
    anonymous,
    api,
    operator,
    stored,
    viewer,
    viewer_api,
    workflow,
)

pytestmark = pytest.mark.django_db


def ended_run(workflow, extract=TaskState.SUCCEEDED, load=TaskState.SUCCEEDED, run_state=RunState.SUCCEEDED):
    """A finished run of extract >> load, each task run with one attempt (or none, for a task that
    never started)."""
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    now = clock.now()
    for task, state in (("extract", extract), ("load", load)):
        tr = TaskRun.objects.get(run=run, task=task)
        tried = state not in (TaskState.UPSTREAM_FAILED, TaskState.SKIPPED, TaskState.CANCELLED)
        TaskRun.objects.filter(pk=tr.pk).update(state=state, attempts=int(tried), max_attempts=tr.max_attempts,
                                                started_at=now if tried else None, finished_at=now,
                                                result=1 if state == TaskState.SUCCEEDED else None,
                                                error="" if state == TaskState.SUCCEEDED else "boom")
        if tried:
            Attempt.objects.create(task_run=tr, number=1, started_at=now, finished_at=now,
                                   outcome=AttemptOutcome.SUCCEEDED if state == TaskState.SUCCEEDED
                                   else AttemptOutcome.FAILED)
    Run.objects.filter(pk=run.pk).update(state=run_state, finished_at=now)
    return run


def states(run):
    run.refresh_from_db()
    return run.state, dict(TaskRun.objects.filter(run=run).values_list("task", "state"))


# --- control -------------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_clearing_a_task_runs_it_and_its_downstream_again_keeping_the_old_attempts(workflow):
    run = ended_run(workflow)
    extract = TaskRun.objects.get(run=run, task="extract")

    cleared = control.clear_task_runs([extract.pk])

    assert sorted(cleared) == sorted(TaskRun.objects.filter(run=run).values_list("pk", flat=True))
    # extract is a root: due now; load waits for it again; the run is running again.
    assert states(run) == (RunState.RUNNING, {"extract": TaskState.SCHEDULED, "load": TaskState.WAITING})
    extract.refresh_from_db()
    # The first attempt stays; the next one will be number 2, with a fresh allowance (retries=2: 3).
    assert (extract.attempts, extract.max_attempts, extract.result, extract.finished_at) == (1, 4, None, None)
    assert list(extract.attempt_set.values_list("number", flat=True)) == [1]


@pytest.mark.time_sensitive
def test_clearing_only_the_task_leaves_its_downstream_as_it_was(workflow):
    run = ended_run(workflow, load=TaskState.DEAD, run_state=RunState.FAILED)
    extract = TaskRun.objects.get(run=run, task="extract")
    assert len(control.clear_task_runs([extract.pk], downstream=False)) == 1
    assert states(run) == (RunState.RUNNING, {"extract": TaskState.SCHEDULED, "load": TaskState.DEAD})


@pytest.mark.time_sensitive
def test_clearing_a_child_of_a_succeeded_parent_releases_it_at_once(workflow):
    run = ended_run(workflow, load=TaskState.DEAD, run_state=RunState.FAILED)
    load = TaskRun.objects.get(run=run, task="load")
    control.clear_task_runs([load.pk])
    assert states(run) == (RunState.RUNNING, {"extract": TaskState.SUCCEEDED, "load": TaskState.SCHEDULED})


@pytest.mark.time_sensitive
def test_an_unfinished_task_run_is_not_cleared(workflow):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    before = states(run)
    assert control.clear_task_runs(TaskRun.objects.filter(run=run).values_list("pk", flat=True)) == []
    assert states(run) == before


@pytest.mark.time_sensitive
def test_marking_a_dead_task_succeeded_lets_its_downstream_run(workflow):
    run = ended_run(workflow, extract=TaskState.DEAD, load=TaskState.UPSTREAM_FAILED, run_state=RunState.FAILED)
    extract = TaskRun.objects.get(run=run, task="extract")
    assert control.mark_task_runs([extract.pk], TaskState.SUCCEEDED) == [extract.pk]
    assert states(run) == (RunState.RUNNING, {"extract": TaskState.SUCCEEDED, "load": TaskState.SCHEDULED})


@pytest.mark.time_sensitive
def test_marking_a_waiting_task_failed_fails_its_downstream_and_the_run(workflow):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    extract = TaskRun.objects.get(run=run, task="extract")
    control.mark_task_runs([extract.pk], TaskState.FAILED, by="olga")
    assert states(run) == (RunState.FAILED, {"extract": TaskState.FAILED, "load": TaskState.UPSTREAM_FAILED})
    assert TaskRun.objects.get(pk=extract.pk).error == "marked failed by olga"


@pytest.mark.time_sensitive
def test_marking_the_last_failed_task_succeeded_ends_the_run_well(workflow):
    run = ended_run(workflow, load=TaskState.DEAD, run_state=RunState.FAILED)
    load = TaskRun.objects.get(run=run, task="load")
    control.mark_task_runs([load.pk], TaskState.SUCCEEDED)
    assert states(run) == (RunState.SUCCEEDED, {"extract": TaskState.SUCCEEDED, "load": TaskState.SUCCEEDED})


@pytest.mark.time_sensitive
def test_other_states_are_refused(workflow):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    extract = TaskRun.objects.get(run=run, task="extract")
    with pytest.raises(ValueError, match="succeeded or failed, not 'skipped'"):
        control.mark_task_runs([extract.pk], TaskState.SKIPPED)


@pytest.mark.time_sensitive
def test_marking_keeps_the_recorded_end_times_of_the_task_run_and_of_its_run(workflow, pinned_process_clock):
    # A task that died after 0.07 s, an hour ago; its run ended then too.
    run = ended_run(workflow, load=TaskState.DEAD, run_state=RunState.FAILED)
    load = TaskRun.objects.get(run=run, task="load")
    ended = clock.now()
    TaskRun.objects.filter(pk=load.pk).update(started_at=ended - timedelta(seconds=0.07), finished_at=ended)
    pinned_process_clock.advance(3600)

    control.mark_task_runs([load.pk], TaskState.FAILED)
    load.refresh_from_db()
    run.refresh_from_db()
    assert load.state == TaskState.FAILED
    assert (load.finished_at - load.started_at).total_seconds() == pytest.approx(0.07)
    assert (run.state, run.finished_at) == (RunState.FAILED, ended)

    control.mark_task_runs([load.pk], TaskState.SUCCEEDED)
    load.refresh_from_db()
    run.refresh_from_db()
    assert (load.state, load.finished_at) == (TaskState.SUCCEEDED, ended)
    assert (run.state, run.finished_at) == (RunState.SUCCEEDED, ended)


@pytest.mark.time_sensitive
def test_a_task_run_that_had_not_ended_ends_at_the_clocks_now_when_marked(workflow, pinned_process_clock):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    pinned_process_clock.advance(90)
    extract = TaskRun.objects.get(run=run, task="extract")
    control.mark_task_runs([extract.pk], TaskState.FAILED)
    extract.refresh_from_db()
    run.refresh_from_db()
    assert extract.finished_at == clock.now()
    assert (run.state, run.finished_at) == (RunState.FAILED, clock.now())


@pytest.mark.time_sensitive
def test_a_running_task_run_is_marked_its_attempt_ended_and_its_worker_told(workflow, pinned_process_clock):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    extract = TaskRun.objects.get(run=run, task="extract")
    started = clock.now()
    TaskRun.objects.filter(pk=extract.pk).update(state=TaskState.RUNNING, attempts=1, started_at=started)
    Attempt.objects.create(task_run=extract, number=1, started_at=started, outcome=AttemptOutcome.RUNNING)
    pinned_process_clock.advance(12)

    with CaptureQueriesContext(connection) as queries:
        assert control.mark_task_runs([extract.pk], TaskState.FAILED, by="olga") == [extract.pk]
    assert states(run) == (RunState.FAILED, {"extract": TaskState.FAILED, "load": TaskState.UPSTREAM_FAILED})
    extract.refresh_from_db()
    assert (extract.finished_at, extract.error) == (started + timedelta(seconds=12), "marked failed by olga")
    attempt = Attempt.objects.get(task_run=extract)
    assert (attempt.outcome, attempt.error) == (AttemptOutcome.CANCELLED, "marked failed by olga")
    # The workers are told to stop its process, as for a cancelled run.
    told = [q["sql"] for q in queries.captured_queries if CANCEL_CHANNEL in q["sql"]]
    assert told == [f"SELECT pg_notify('{CANCEL_CHANNEL}', '[{extract.pk}]')"], told


# --- API -----------------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_the_api_clears_marks_and_retries_a_task_run_and_records_each(api, workflow):
    run = ended_run(workflow, extract=TaskState.DEAD, load=TaskState.UPSTREAM_FAILED, run_state=RunState.FAILED)
    extract = TaskRun.objects.get(run=run, task="extract")

    marked = api.post(f"/api/task-runs/{extract.pk}/mark/", {"state": "succeeded"}, format="json")
    assert marked.status_code == 200, marked.content
    assert marked.json()["changed"] == [extract.pk] and marked.json()["task_run"]["state"] == "succeeded"

    cleared = api.post(f"/api/task-runs/{extract.pk}/clear/", {"downstream": False}, format="json")
    assert cleared.status_code == 200 and cleared.json()["changed"] == [extract.pk]
    assert cleared.json()["task_run"]["state"] == "scheduled"

    # Not dead or failed any more: the retry changes nothing, and says so.
    retried = api.post(f"/api/task-runs/{extract.pk}/retry/")
    assert retried.status_code == 200 and retried.json()["changed"] == []

    events = list(AuditEvent.objects.filter(target_type="taskrun", target_id=str(extract.pk)).order_by("id"))
    assert [(e.action, e.actor_name, e.source) for e in events] == [
        ("mark", "olga", "api"), ("clear", "olga", "api"), ("retry", "olga", "api")]
    # Each names what it touched: the workflow, the task and the run, not only ids.
    assert events[0].detail == {"state": "succeeded", "changed": [extract.pk], "was": "dead", "workflow": "reports",
                                "task": "extract", "run": run.pk}
    assert (events[1].detail["workflow"], events[1].detail["task"], events[1].detail["changed_tasks"]) == (
        "reports", "extract", ["extract"])


@pytest.mark.time_sensitive
def test_the_api_task_actions_need_an_operator_and_good_input(api, viewer_api, anonymous, workflow):
    run = ended_run(workflow, extract=TaskState.DEAD, load=TaskState.UPSTREAM_FAILED, run_state=RunState.FAILED)
    extract = TaskRun.objects.get(run=run, task="extract")
    before = stored()
    for action in ("retry", "clear", "mark"):
        assert viewer_api.post(f"/api/task-runs/{extract.pk}/{action}/", {"state": "failed"}, format="json").status_code == 403
        assert anonymous.post(f"/api/task-runs/{extract.pk}/{action}/").status_code == 401
        assert api.post(f"/api/task-runs/999999/{action}/", {"state": "failed"}, format="json").status_code == 404
    bad = api.post(f"/api/task-runs/{extract.pk}/mark/", {"state": "skipped"}, format="json")
    assert bad.status_code == 400 and "state" in bad.json()
    assert api.post(f"/api/task-runs/{extract.pk}/mark/", {}, format="json").status_code == 400
    bad = api.post(f"/api/task-runs/{extract.pk}/clear/", {"downstream": "maybe"}, format="json")
    assert bad.status_code == 400 and "downstream" in bad.json()
    assert stored() == before
    assert not AuditEvent.objects.exists()


# --- web -----------------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_an_operator_sees_the_actions_that_apply_and_each_asks_first(client, operator, workflow):
    run = ended_run(workflow, extract=TaskState.DEAD, load=TaskState.UPSTREAM_FAILED, run_state=RunState.FAILED)
    extract = TaskRun.objects.get(run=run, task="extract")
    client.force_login(operator)
    html = client.get(reverse("orchestrator:web:task_run", args=[extract.pk])).content.decode()
    for action in ("retry", "clear", "mark-succeeded", "mark-failed"):
        assert f'id="task-{action}"' in html, action
    assert f'hx-confirm="Retry extract of run #{run.pk}? It gets a fresh set of attempts."' in html
    TaskRun.objects.filter(pk=extract.pk).update(state=TaskState.SUCCEEDED)
    html = client.get(reverse("orchestrator:web:task_run", args=[extract.pk])).content.decode()
    assert 'id="task-retry"' not in html and 'id="task-mark-succeeded"' not in html
    assert 'id="task-clear"' in html and 'id="task-mark-failed"' in html


@pytest.mark.time_sensitive
def test_an_operator_clears_a_task_from_its_page_and_it_is_recorded(client, operator, workflow):
    run = ended_run(workflow)
    extract = TaskRun.objects.get(run=run, task="extract")
    client.force_login(operator)
    response = client.post(reverse("orchestrator:web:task_run_action", args=[extract.pk, "clear"]), follow=True)
    assert response.status_code == 200
    assert "Cleared extract and 1 downstream: they run again." in response.content.decode()
    assert states(run) == (RunState.RUNNING, {"extract": TaskState.SCHEDULED, "load": TaskState.WAITING})
    event = AuditEvent.objects.get(action="clear")
    assert (event.actor_name, event.source, event.target_id) == (operator.username, "ui", str(extract.pk))
    # Marked from the page: the run's downstream decides again.
    response = client.post(reverse("orchestrator:web:task_run_action", args=[extract.pk, "mark-failed"]), follow=True)
    assert "Marked extract failed." in response.content.decode()
    assert states(run) == (RunState.FAILED, {"extract": TaskState.FAILED, "load": TaskState.UPSTREAM_FAILED})
    assert AuditEvent.objects.get(action="mark").detail["state"] == "failed"


@pytest.mark.time_sensitive
def test_a_viewer_sees_no_task_action_and_is_refused_each(client, viewer, workflow):
    run = ended_run(workflow, extract=TaskState.DEAD, load=TaskState.UPSTREAM_FAILED, run_state=RunState.FAILED)
    extract = TaskRun.objects.get(run=run, task="extract")
    client.force_login(viewer)
    html = client.get(reverse("orchestrator:web:task_run", args=[extract.pk])).content.decode()
    assert "task_run_action" not in html and 'id="task-retry"' not in html and "/clear/" not in html
    before = stored()
    for action in ("retry", "clear", "mark-succeeded", "mark-failed"):
        assert client.post(reverse("orchestrator:web:task_run_action", args=[extract.pk, action])).status_code == 403
    assert stored() == before


@pytest.mark.time_sensitive
def test_an_unknown_task_action_is_a_400_that_names_the_actions(client, operator, workflow):
    run = ended_run(workflow)
    extract = TaskRun.objects.get(run=run, task="extract")
    client.force_login(operator)
    response = client.post(f"/task-runs/{extract.pk}/explode/")
    assert response.status_code == 400
    assert "retry, clear, mark-succeeded, mark-failed" in response.content.decode()
    assert client.get(reverse("orchestrator:web:task_run_action", args=[extract.pk, "clear"])).status_code == 405
