# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""The API's operator actions: pause and resume, cancel and retry runs, the dead-letter queue, and
attempt logs. Each with its success, its permissions and its bad inputs."""

import pytest

from orchestrator import clearing, clock
from orchestrator.models import Attempt, AttemptOutcome, Run, RunState, TaskRun, TaskState, Workflow
from orchestrator.runs import trigger_workflow
from tests.support.actions_support import chain, finished_run  # noqa: F401 - fixture
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


def a_run(workflow):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    return run


def dead_task_run(workflow, error="ValueError: boom"):
    run = a_run(workflow)
    task_run = TaskRun.objects.get(run=run, task="extract")
    now = clock.now()
    Attempt.objects.create(task_run=task_run, number=1, outcome=AttemptOutcome.FAILED, started_at=now,
                           finished_at=now, error=error)
    TaskRun.objects.filter(pk=task_run.pk).update(state=TaskState.DEAD, attempts=1, max_attempts=1,
                                                  finished_at=now, error=error)
    TaskRun.objects.filter(run=run, task="load").update(state=TaskState.UPSTREAM_FAILED, finished_at=now)
    Run.objects.filter(pk=run.pk).update(state=RunState.FAILED, finished_at=now)
    return TaskRun.objects.get(pk=task_run.pk)


# --- mark's dry run over the limit ----------------------------------------------------------------


@pytest.mark.time_sensitive
def test_a_mark_dry_run_over_the_limit_says_so_as_the_clears_does(api, chain, monkeypatch):
    monkeypatch.setattr(clearing, "MOST", 2)  # a mark changes at most 2 task runs here
    three = finished_run(chain, 1, {"a": TaskState.FAILED, "b": TaskState.UPSTREAM_FAILED,
                                    "c": TaskState.UPSTREAM_FAILED}, run_state=RunState.FAILED)
    two = finished_run(chain, 2, {"a": TaskState.FAILED, "b": TaskState.UPSTREAM_FAILED}, run_state=RunState.FAILED)
    over = api.post(f"/api/runs/{three.pk}/mark/", {"state": "succeeded", "dry_run": True}, format="json")
    assert over.status_code == 200
    assert (over.json()["count"], over.json()["too_many"]) == (3, True)  # more than 2: refused if done
    under = api.post(f"/api/runs/{two.pk}/mark/", {"state": "succeeded", "dry_run": True}, format="json").json()
    assert (under["count"], under["too_many"]) == (2, False)
    # Many runs at once: a 400 naming the limit, as the bulk clear's dry run answers.
    bulk = api.post("/api/runs/bulk/", {"action": "mark-succeeded", "ids": [two.pk, three.pk], "dry_run": True},
                    format="json")
    assert bulk.status_code == 400 and "more than 2 task runs would be marked" in bulk.json()["ids"][0]
    cleared = api.post("/api/runs/bulk/", {"action": "clear", "ids": [two.pk, three.pk], "dry_run": True},
                       format="json")
    assert cleared.status_code == 400 and "more than 2 task runs" in cleared.json()["ids"][0]
    # The mark itself refuses, and nothing changed.
    done = api.post(f"/api/runs/{three.pk}/mark/", {"state": "succeeded"}, format="json")
    assert done.status_code == 400 and "more than 2" in str(done.json())
    assert Run.objects.get(pk=three.pk).state == RunState.FAILED


# --- pause and resume ------------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_an_operator_pauses_and_resumes_a_workflow(api, workflow):
    paused = api.post("/api/workflows/reports/pause/")
    assert paused.status_code == 200 and paused.json()["paused"] is True
    assert Workflow.objects.get(name="reports").paused
    resumed = api.post("/api/workflows/reports/resume/")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert not Workflow.objects.get(name="reports").paused


@pytest.mark.time_sensitive
def test_pausing_needs_an_operator_and_a_known_workflow(viewer_api, anonymous, api, workflow):
    before = stored()
    assert viewer_api.post("/api/workflows/reports/pause/").status_code == 403
    assert anonymous.post("/api/workflows/reports/pause/").status_code == 401
    assert api.post("/api/workflows/nope/pause/").status_code == 404
    assert api.post("/api/workflows/nope/resume/").json()["detail"] == "unknown workflow 'nope'"
    assert stored() == before


# --- cancel and retry runs ----------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_an_operator_cancels_a_run_once(api, workflow):
    run = a_run(workflow)
    response = api.post(f"/api/runs/{run.pk}/cancel/", {"reason": "wrong day"}, format="json")
    assert response.status_code == 200
    assert response.json()["cancelled"] is True and response.json()["run"]["state"] == "cancelled"
    run.refresh_from_db()
    assert (run.state, run.reason) == ("cancelled", "wrong day")
    assert set(TaskRun.objects.filter(run=run).values_list("state", flat=True)) == {"cancelled"}
    again = api.post(f"/api/runs/{run.pk}/cancel/", format="json")
    assert again.status_code == 200 and again.json()["cancelled"] is False


@pytest.mark.time_sensitive
def test_cancelling_needs_an_operator_a_known_run_and_a_sane_reason(api, viewer_api, anonymous, workflow):
    run = a_run(workflow)
    before = stored()
    assert viewer_api.post(f"/api/runs/{run.pk}/cancel/").status_code == 403
    assert anonymous.post(f"/api/runs/{run.pk}/cancel/").status_code == 401
    assert api.post("/api/runs/987654/cancel/").status_code == 404
    assert api.post(f"/api/runs/{2**80}/cancel/").status_code == 404
    bad = api.post(f"/api/runs/{run.pk}/cancel/", {"reason": "a\x00b"}, format="json")
    assert bad.status_code == 400 and "reason" in bad.json()
    listed = api.post(f"/api/runs/{run.pk}/cancel/", ["reason"], format="json")
    assert listed.status_code == 400 and "expected a JSON object" in listed.json()["detail"]
    assert stored() == before


@pytest.mark.time_sensitive
def test_an_operator_retries_the_failed_tasks_of_a_run(api, viewer_api, workflow):
    dead = dead_task_run(workflow)
    assert viewer_api.post(f"/api/runs/{dead.run_id}/retry/").status_code == 403
    response = api.post(f"/api/runs/{dead.run_id}/retry/")
    assert response.status_code == 200, response.json()
    assert response.json()["retried"] == 1 and response.json()["run"]["state"] == "running"
    assert TaskRun.objects.get(pk=dead.pk).state == TaskState.SCHEDULED
    assert api.post("/api/runs/424242/retry/").status_code == 404


# --- task runs and logs ---------------------------------------------------------------------------


@pytest.fixture
def log_storage(settings, tmp_path):
    settings.ORCHESTRATOR_LOG_STORAGE_OPTIONS = {"location": str(tmp_path / "logs")}


@pytest.mark.time_sensitive
def test_it_shows_attempts_and_pages_through_a_log(api, viewer_api, workflow, log_storage):
    from orchestrator import logs

    dead = dead_task_run(workflow)
    attempt = Attempt.objects.get(task_run=dead)
    log = logs.AttemptLog(logs.attempt_log_name(attempt))
    log.write("".join(f"line {i}\n" for i in range(100)))
    Attempt.objects.filter(pk=attempt.pk).update(log_path=log.finish())

    detail = viewer_api.get(f"/api/task-runs/{dead.pk}/").json()
    [listed] = detail["attempt_list"]
    assert (listed["number"], listed["outcome"], listed["error"]) == (1, "failed", "ValueError: boom")

    text, offset, pages = "", 0, 0
    while pages < 20:
        page = viewer_api.get(f"{listed['log_url']}?offset={offset}&limit=100").json()
        text, offset, pages = text + page["text"], page["next_offset"], pages + 1
        if page["eof"]:
            break
    assert text.splitlines() == [f"line {i}" for i in range(100)]
    assert pages == 8  # 790 bytes in pages of 100


@pytest.mark.time_sensitive
@pytest.mark.parametrize("query, field", [("offset=-1", "offset"), ("limit=0", "limit"),
                                          ("limit=99999999", "limit"), ("offset=lots", "offset"),
                                          (f"offset={2**80}", "offset")])
def test_a_bad_log_page_request_is_a_400(api, workflow, query, field):
    dead = dead_task_run(workflow)
    response = api.get(f"/api/task-runs/{dead.pk}/attempts/1/log/?{query}")
    assert response.status_code == 400 and field in response.json()


@pytest.mark.time_sensitive
def test_an_unknown_attempt_log_is_a_404(api, anonymous, workflow):
    dead = dead_task_run(workflow)
    assert api.get(f"/api/task-runs/{dead.pk}/attempts/9/log/").status_code == 404
    assert anonymous.get(f"/api/task-runs/{dead.pk}/attempts/1/log/").status_code == 401


# --- the dead-letter queue ------------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_it_lists_the_dead_letter_queue_and_filters_it(api, workflow):
    first, second = dead_task_run(workflow), dead_task_run(workflow)
    a_run(workflow)  # healthy work is not listed
    listed = api.get("/api/dlq/").json()["results"]
    assert {row["id"] for row in listed} == {first.pk, second.pk}
    assert listed[0]["workflow"] == "reports" and listed[0]["error"] == "ValueError: boom"
    assert api.get("/api/dlq/?workflow=other").status_code == 404  # no such workflow
    assert len(api.get("/api/dlq/?queue=default").json()["results"]) == 2


@pytest.mark.time_sensitive
def test_an_operator_retries_many_dead_task_runs_at_once(api, workflow):
    first, second = dead_task_run(workflow), dead_task_run(workflow)
    response = api.post("/api/dlq/retry/", {"ids": [first.pk, second.pk, first.pk, 999999]}, format="json")
    assert response.status_code == 200
    assert response.json() == {"requested": 3, "retried": 2}
    assert set(TaskRun.objects.filter(pk__in=[first.pk, second.pk]).values_list("state", flat=True)) == {"scheduled"}
    assert api.get("/api/dlq/").json()["results"] == []


@pytest.mark.time_sensitive
def test_an_operator_discards_a_dead_task_run(api, workflow):
    dead = dead_task_run(workflow)
    response = api.post("/api/dlq/discard/", {"ids": [dead.pk]}, format="json")
    assert response.status_code == 200 and response.json() == {"requested": 1, "discarded": 1}
    assert TaskRun.objects.get(pk=dead.pk).state == TaskState.FAILED
    assert api.get("/api/dlq/").json()["results"] == []


@pytest.mark.time_sensitive
@pytest.mark.parametrize("data", [{"ids": []}, {"ids": ["x"]}, {"ids": [0]}, {"ids": [2**70]}, {"ids": 5},
                                  {"ids": [1.5]}, {}, ["ids"], {"ids": list(range(1, 1003))}])
@pytest.mark.parametrize("action", ["retry", "discard"])
def test_bad_dead_letter_requests_are_400s_that_change_nothing(api, workflow, data, action):
    dead_task_run(workflow)
    before = stored()
    response = api.post(f"/api/dlq/{action}/", data, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["detail"]
    assert stored() == before


@pytest.mark.time_sensitive
def test_the_dead_letter_queue_is_read_by_viewers_and_changed_by_operators(viewer_api, anonymous, workflow):
    dead = dead_task_run(workflow)
    assert viewer_api.get("/api/dlq/").status_code == 200
    before = stored()
    for action in ("retry", "discard"):
        assert viewer_api.post(f"/api/dlq/{action}/", {"ids": [dead.pk]}, format="json").status_code == 403
        assert anonymous.post(f"/api/dlq/{action}/", {"ids": [dead.pk]}, format="json").status_code == 401
    assert anonymous.get("/api/dlq/").status_code == 401
    assert stored() == before
