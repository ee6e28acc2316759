# ruff: noqa: F811 - pytest fixtures imported from tests.support
"""The API's operator actions with options: a task run's clear with upstream, downstream, only
failed, past and future runs (dry_run lists exactly what it would clear), a run's clear and mark,
many runs at once, and notes; each audited with the workflow's and the tasks' names, none open to
viewers, bad input a 400 that changes nothing."""

import pytest

from orchestrator.models import AuditEvent, Note, Run, RunState, TaskState
from tests.support.actions_support import chain, finished_run, states, task_run  # noqa: F401 - fixture
from tests.support.api_support import anonymous, api, operator, stored, viewer, viewer_api  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


def pairs(answer) -> list[tuple[int, str]]:
    return [(row["run"], row["task"]) for row in answer["task_runs"]]


@pytest.mark.time_sensitive
def test_a_dry_run_lists_the_clear_and_the_clear_does_exactly_that(api, chain):
    first, second, third = (finished_run(chain, day) for day in (1, 2, 3))
    b = task_run(second, "b")
    url = f"/api/task-runs/{b.pk}/clear/"
    dry = api.post(url, {"future": True, "upstream": True, "downstream": False, "dry_run": True}, format="json")
    assert dry.status_code == 200, dry.content
    body = dry.json()
    assert (body["dry_run"], body["count"], body["runs"], body["too_many"], body["changed"]) == (True, 4, 2, False, [])
    assert pairs(body) == [(second.pk, "a"), (second.pk, "b"), (third.pk, "a"), (third.pk, "b")]
    assert body["task_runs"][0]["state"] == "succeeded" and body["task_runs"][0]["logical_date"].startswith("2026-03-02")
    assert states(second)["a"] == "succeeded" and not AuditEvent.objects.exists()

    done = api.post(url, {"future": True, "upstream": True, "downstream": False}, format="json").json()
    assert done["dry_run"] is False and sorted(done["changed"]) == sorted(row["id"] for row in body["task_runs"])
    assert states(second)["a"] == states(third)["a"] == "scheduled" and states(first)["a"] == "succeeded"
    event = AuditEvent.objects.get(action="clear")
    assert (event.source, event.target_type, event.target_id) == ("api", "taskrun", str(b.pk))
    assert (event.detail["workflow"], event.detail["task"], event.detail["changed_tasks"], event.detail["count"]) == (
        "chain", "b", ["a", "b"], 4)
    assert event.detail["options"]["future"] is True and event.detail["options"]["past"] is False


@pytest.mark.time_sensitive
def test_the_clear_keeps_its_old_default_of_downstream(api, chain):
    run = finished_run(chain, 1)
    b = task_run(run, "b")
    answer = api.post(f"/api/task-runs/{b.pk}/clear/", {"dry_run": True}, format="json").json()
    assert pairs(answer) == [(run.pk, "b"), (run.pk, "c")]


@pytest.mark.time_sensitive
def test_a_run_is_cleared_and_marked_through_the_api(api, chain):
    run = finished_run(chain, 1, {"b": TaskState.DEAD, "c": TaskState.UPSTREAM_FAILED}, run_state=RunState.FAILED)
    dry = api.post(f"/api/runs/{run.pk}/clear/", {"only_failed": True, "dry_run": True}, format="json").json()
    assert pairs(dry) == [(run.pk, "b"), (run.pk, "c")]
    mark_dry = api.post(f"/api/runs/{run.pk}/mark/", {"state": "succeeded", "dry_run": True}, format="json").json()
    assert mark_dry["count"] == 2 and Run.objects.get(pk=run.pk).state == RunState.FAILED
    marked = api.post(f"/api/runs/{run.pk}/mark/", {"state": "succeeded"}, format="json")
    assert marked.status_code == 200 and marked.json()["runs"] == [run.pk]
    assert Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED
    cleared = api.post(f"/api/runs/{run.pk}/clear/", {}, format="json").json()
    assert cleared["count"] == 5 and Run.objects.get(pk=run.pk).state == RunState.RUNNING
    events = list(AuditEvent.objects.order_by("id"))
    assert [(e.action, e.target_type, e.detail["workflow"]) for e in events] == [
        ("mark", "run", "chain"), ("clear", "run", "chain")]
    assert events[0].detail["changed_tasks"] == ["b", "c"]


@pytest.mark.time_sensitive
def test_many_runs_at_once(api, chain):
    one = finished_run(chain, 1, {"d": TaskState.DEAD}, run_state=RunState.FAILED)
    two = finished_run(chain, 2, {"d": TaskState.FAILED}, run_state=RunState.FAILED)
    dry = api.post("/api/runs/bulk/", {"action": "clear-failed", "ids": [one.pk, two.pk], "dry_run": True},
                   format="json").json()
    assert (dry["count"], dry["dry_run"]) == (2, True) and states(one)["d"] == "dead"
    done = api.post("/api/runs/bulk/", {"action": "mark-failed", "ids": [two.pk, one.pk]}, format="json")
    assert done.status_code == 200 and done.json()["runs"] == [one.pk, two.pk]
    cleared = api.post("/api/runs/bulk/", {"action": "clear-failed", "ids": [one.pk, two.pk]}, format="json").json()
    assert cleared["count"] == 2 and states(one)["d"] == states(two)["d"] == "scheduled"
    assert AuditEvent.objects.filter(action="clear", target_type="run").count() == 2


@pytest.mark.time_sensitive
def test_notes_through_the_api(api, viewer_api, chain):
    run = finished_run(chain, 1)
    b = task_run(run, "b")
    assert api.get(f"/api/runs/{run.pk}/note/").json()["text"] == ""
    written = api.put(f"/api/task-runs/{b.pk}/note/", {"text": "slow vendor"}, format="json")
    assert written.status_code == 200 and written.json()["text"] == "slow vendor" and written.json()["author"] == "olga"
    api.put(f"/api/runs/{run.pk}/note/", {"text": "checked"}, format="json")
    # Shown in the run and the task run, to viewers too.
    assert viewer_api.get(f"/api/runs/{run.pk}/").json()["note"]["text"] == "checked"
    assert viewer_api.get(f"/api/task-runs/{b.pk}/").json()["note"]["text"] == "slow vendor"
    assert viewer_api.get(f"/api/task-runs/{task_run(run, 'c').pk}/").json()["note"]["text"] == ""
    api.put(f"/api/runs/{run.pk}/note/", {"text": ""}, format="json")
    assert list(Note.objects.values_list("text", flat=True)) == ["slow vendor"]
    assert [e.detail["text"] for e in AuditEvent.objects.filter(action="note").order_by("id")] == [
        "slow vendor", "checked", ""]


@pytest.mark.time_sensitive
def test_the_task_mark_and_retry_records_name_the_workflow_and_task(api, chain):
    run = finished_run(chain, 1, {"b": TaskState.DEAD}, run_state=RunState.FAILED)
    b = task_run(run, "b")
    api.post(f"/api/task-runs/{b.pk}/retry/")
    api.post(f"/api/task-runs/{b.pk}/mark/", {"state": "failed"}, format="json")
    for event in AuditEvent.objects.all():
        assert (event.detail["workflow"], event.detail["task"], event.detail["run"]) == ("chain", "b", run.pk), event


@pytest.mark.parametrize("path, data, field", [
    ("/api/task-runs/{tr}/clear/", {"past": "sometimes"}, "past"),
    ("/api/task-runs/{tr}/clear/", {"dry_run": 3}, "dry_run"),
    ("/api/runs/{run}/mark/", {"state": "skipped"}, "state"),
    ("/api/runs/{run}/clear/", {"only_failed": "x"}, "only_failed"),
    ("/api/runs/bulk/", {"action": "explode", "ids": [1]}, "action"),
    ("/api/runs/bulk/", {"action": "clear", "ids": []}, "ids"),
    ("/api/runs/bulk/", {"action": "clear", "ids": list(range(1, 102))}, "ids"),
    ("/api/runs/bulk/", {"action": "clear", "ids": [999999]}, "ids"),
    ("/api/runs/{run}/note/", {"text": "x" * 1001}, "text"),
    ("/api/runs/{run}/note/", {"text": "a\x00b"}, "text"),
    ("/api/runs/{run}/note/", {"text": 0}, "text"),
    ("/api/runs/{run}/note/", {}, "text"),
])
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(api, chain, path, data, field):
    run = finished_run(chain, 1)
    url = path.format(tr=task_run(run, "b").pk, run=run.pk)
    before = stored()
    response = api.put(url, data, format="json") if url.endswith("/note/") else api.post(url, data, format="json")
    assert response.status_code == 400 and field in response.json(), response.content
    assert stored() == before and not Note.objects.exists() and not AuditEvent.objects.exists()


def test_viewers_and_strangers_are_refused_every_action(viewer_api, anonymous, api, chain):
    run = finished_run(chain, 1)
    b = task_run(run, "b")
    before = stored()
    for url, data in [(f"/api/task-runs/{b.pk}/clear/", {}), (f"/api/runs/{run.pk}/clear/", {}),
                      (f"/api/runs/{run.pk}/mark/", {"state": "failed"}),
                      ("/api/runs/bulk/", {"action": "clear", "ids": [run.pk]})]:
        assert viewer_api.post(url, data, format="json").status_code == 403, url
        assert anonymous.post(url, data, format="json").status_code == 401, url
    for url in (f"/api/runs/{run.pk}/note/", f"/api/task-runs/{b.pk}/note/"):
        assert viewer_api.put(url, {"text": "hi"}, format="json").status_code == 403
        assert viewer_api.get(url).status_code == 200
    assert api.post("/api/task-runs/999999/clear/", {}, format="json").status_code == 404
    assert api.post("/api/runs/999999/mark/", {"state": "failed"}, format="json").status_code == 404
    assert stored() == before and not Note.objects.exists() and not AuditEvent.objects.exists()
