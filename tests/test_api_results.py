# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""Results kept in the log storage in the API: every answer shows such a result by its size and
the URL of ``GET /api/task-runs/{id}/result/`` and never reads the storage; that endpoint alone
sends the value, streamed from its file (a mapped task's own: every instance's, as one array)."""

from __future__ import annotations

import json

import pytest
from django.core.files.base import ContentFile

import tests.support.tasks_for_tests  # noqa: F401 - registers the job enqueued here
from orchestrator import access, clock, conf, jobs, results
from orchestrator.models import Run, TaskRun, TaskState, TenantGrant
from orchestrator.runs import trigger_workflow
from tests.support.api_support import api, client_for, make_user, operator, workflow  # noqa: F401 - fixtures
from tests.test_secrets_workers import data_dir  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db

BIG = {"rows": ["r" * 1000] * 300, "key": "value"}  # about 300 KB of JSON, over the row's 256 KiB


def store(task_run: TaskRun, value, number: int = 1) -> dict:
    """Keep ``value`` in the log storage as a worker does, and the marker in the task run's row."""
    data = json.dumps(value).encode()
    name = conf.log_storage().save(results.name_for(task_run.run_id, task_run.pk, number), ContentFile(data))
    marker = {results.KEY: {"name": name, "bytes": len(data)}}
    TaskRun.objects.filter(pk=task_run.pk).update(state=TaskState.SUCCEEDED, result=marker, attempts=number)
    return marker


def url(task_run: TaskRun) -> str:
    return f"/api/task-runs/{task_run.pk}/result/"


def pointer(task_run: TaskRun, marker: dict) -> dict:
    return {results.KEY: {"bytes": marker[results.KEY]["bytes"], "url": url(task_run)}}


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def mapped_run(workflow, items: list) -> tuple[Run, TaskRun, list[TaskRun]]:
    """A run with a mapped task ``piece`` that ended: its own task run (its result the list of its
    instances' results, as the map's end writes it) and one instance per item, whose result is the
    item (a ``(stored)`` item is kept in the log storage)."""
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    own = TaskRun.objects.create(run=run, task="piece", map_index=-1, state=TaskState.SUCCEEDED,
                                 spec={"kind": "python", "ref": "x:piece", "map_over": "extract"})
    instances, listed = [], []
    for index, item in enumerate(items):
        instance = TaskRun.objects.create(run=run, task="piece", map_index=index, state=TaskState.SUCCEEDED,
                                          spec={"kind": "python", "ref": "x:piece"}, result=item)
        if isinstance(item, dict) and "stored" in item:
            listed.append(store(instance, {"index": index, **BIG}))
        else:
            listed.append(item)
        instances.append(instance)
    TaskRun.objects.filter(pk=own.pk).update(result=listed)
    return run, own, instances


def test_no_list_or_detail_reads_the_log_storage_and_each_shows_a_stored_result_by_its_size_and_url(
        api, workflow, data_dir):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    extract, load = TaskRun.objects.get(run=run, task="extract"), TaskRun.objects.get(run=run, task="load")
    marker = store(extract, BIG)
    TaskRun.objects.filter(pk=load.pk).update(state=TaskState.SUCCEEDED, result={"small": 1})
    _run, own, instances = mapped_run(workflow, [{"stored": 1}, {"small": 2}, {"stored": 1}])
    # In the dead-letter queue too.
    TaskRun.objects.filter(pk=extract.pk).update(state=TaskState.DEAD, finished_at=clock.now())
    job, _ = jobs.enqueue("tests.support.tasks_for_tests:record_job", kwargs={"path": "/nowhere"})
    job_task_run = TaskRun.objects.get(run=job)
    job_marker = store(job_task_run, BIG)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conf.log_storage(), "open", lambda *a, **k: pytest.fail(f"the log storage was read: {a}"))
        page = api.get(f"/api/runs/{run.pk}/task-runs/")
        assert page.status_code == 200
        shown = {t["task"]: t["result"] for t in page.json()["results"]}
        assert shown == {"extract": pointer(extract, marker), "load": {"small": 1}}
        assert api.get(f"/api/task-runs/{extract.pk}/").json()["result"] == pointer(extract, marker)
        # A mapped task's instances, a page of them; its own task run points to its whole list.
        pieces = api.get(f"/api/runs/{own.run_id}/task-runs/?task=piece").json()["results"]
        markers = [TaskRun.objects.get(pk=i.pk).result for i in instances]
        assert [t["result"] for t in pieces] == [None, pointer(instances[0], markers[0]), {"small": 2},
                                                 pointer(instances[2], markers[2])]
        detail = api.get(f"/api/task-runs/{own.pk}/").json()
        assert detail["result"] is None and detail["mapped"]["result_url"] == url(own)
        dead = api.get("/api/dlq/").json()["results"]
        assert [t["result"] for t in dead] == [pointer(extract, marker)]
        assert api.get(f"/api/jobs/{job.pk}/").json()["result"] == pointer(job_task_run, job_marker)
        assert [j["result"] for j in api.get("/api/jobs/").json()["results"]] == [pointer(job_task_run, job_marker)]
        # An action's answer shows the task run as its detail does.
        marked = api.post(f"/api/task-runs/{extract.pk}/retry/", {}, format="json")
        assert marked.status_code == 200, marked.json()


def test_the_result_endpoint_sends_the_whole_value_kept_in_the_row_or_streamed_from_the_storage(
        api, workflow, data_dir):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    extract, load = TaskRun.objects.get(run=run, task="extract"), TaskRun.objects.get(run=run, task="load")
    store(extract, BIG)
    stored = api.get(url(extract))
    assert stored.status_code == 200 and stored["Content-Type"] == "application/json"
    assert stored.streaming and json.loads(body(stored)) == BIG
    TaskRun.objects.filter(pk=load.pk).update(state=TaskState.SUCCEEDED, result={"in": ["the", "row"], "n": 1.5})
    in_row = api.get(url(load))
    assert in_row.status_code == 200 and in_row["Content-Type"] == "application/json"
    assert json.loads(body(in_row)) == {"in": ["the", "row"], "n": 1.5}
    # A task that returned nothing: its result is null, not missing.
    TaskRun.objects.filter(pk=load.pk).update(result=None)
    assert body(api.get(url(load))) == b"null"


def test_a_mapped_task_s_result_is_every_instance_s_streamed_in_map_index_order(api, workflow, data_dir,
                                                                                  monkeypatch):
    from orchestrator.api import task_results

    monkeypatch.setattr(task_results, "PAGE", 2)  # pages of two instances: three pages and an empty one
    items = [{"stored": 1}, {"small": 1}, None, [1, 2], {"stored": 1}, "text"]
    _run, own, _instances = mapped_run(workflow, items)
    answer = api.get(url(own))
    assert answer.status_code == 200 and answer.streaming and answer["Content-Type"] == "application/json"
    sent = json.loads(body(answer))
    assert sent == results.load(TaskRun.objects.get(pk=own.pk).result)
    assert sent == [{"index": 0, **BIG}, {"small": 1}, None, [1, 2], {"index": 4, **BIG}, "text"]
    # A stored instance result gone from the storage once the array has begun: the answer stops
    # there, short of its closing bracket (no client takes it for the whole list).
    conf.log_storage().delete(results.marker_of(TaskRun.objects.get(task="piece", map_index=4).result)["name"])
    cut = api.get(url(own))
    assert cut.status_code == 200
    chunks = []
    with pytest.raises(results.StoredResultError, match="it is not in the log storage"):
        chunks.extend(cut.streaming_content)
    assert b"".join(chunks).startswith(b'[{"index": 0') and not b"".join(chunks).endswith(b"]")
    # No instances: an empty list.
    TaskRun.objects.filter(task="piece", map_index__gte=0).delete()
    assert json.loads(body(api.get(url(own)))) == []


def test_a_task_run_without_a_result_another_tenant_s_and_an_unknown_one_are_404s(api, workflow, data_dir):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    extract = TaskRun.objects.get(run=run, task="extract")
    for state in (TaskState.SCHEDULED, TaskState.RUNNING, TaskState.DEAD):
        TaskRun.objects.filter(pk=extract.pk).update(state=state)
        answer = api.get(url(extract))
        assert answer.status_code == 404 and answer["Content-Type"] == "application/json"
        assert answer.json() == {"detail": f"task run {extract.pk} has no result: it is {state}"}
    _run, own, _instances = mapped_run(workflow, [1, 2])
    TaskRun.objects.filter(pk=own.pk).update(state=TaskState.MAPPED, result=None)
    assert api.get(url(own)).json() == {"detail": f"task run {own.pk} has no result: it is mapped"}

    store(extract, BIG)
    other = make_user("tenant_b_viewer", None)
    TenantGrant.objects.create(user=other, role=TenantGrant.Role.VIEWER, tenant="tenant_b")
    refused = client_for(other).get(url(extract))
    assert refused.status_code == 404 and refused.json() == {"detail": f"no task run {extract.pk}"}
    assert client_for(make_user("global_viewer", access.VIEWERS)).get(url(extract)).status_code == 200
    assert client_for(None).get(url(extract)).status_code == 401
    assert api.get("/api/task-runs/999999999/result/").status_code == 404


def test_a_stored_result_whose_file_is_gone_or_unreachable_is_a_json_error_naming_why(api, workflow, data_dir,
                                                                                        monkeypatch):
    run, _ = trigger_workflow(workflow, {"day": "2026-03-01"})
    extract = TaskRun.objects.get(run=run, task="extract")
    name = store(extract, BIG)[results.KEY]["name"]
    conf.log_storage().delete(name)
    gone = api.get(url(extract))
    assert gone.status_code == 502 and gone["Content-Type"] == "application/json"
    assert gone.json()["detail"].startswith(f"the stored result {name} cannot be read: it is not in the log storage")

    def unreachable(name, mode="rb"):
        raise ConnectionError("the bucket did not answer")

    monkeypatch.setattr(conf.log_storage(), "open", unreachable)
    down = api.get(url(extract))
    assert down.status_code == 503 and "Traceback" not in down.content.decode()
    assert down.json() == {"detail": f"the stored result {name} cannot be read: ConnectionError: "
                                     "the bucket did not answer"}
    # The task run's own answer still shows it, by its size and URL: it does not read the file.
    assert api.get(f"/api/task-runs/{extract.pk}/").json()["result"][results.KEY]["url"] == url(extract)


def test_the_schema_describes_the_result_endpoint():
    from orchestrator.api import schema

    operation = schema.generate()["paths"]["/api/task-runs/{id}/result/"]["get"]
    assert set(operation["responses"]) == {"200", "401", "403", "404", "502", "503"}
    assert "application/json" in operation["responses"]["200"]["content"]
    assert "$stored_result" in operation["description"]


def test_an_id_beyond_any_bigint_is_a_404(api):
    answer = api.get(f"/api/task-runs/{2**80}/result/")
    assert answer.status_code == 404 and answer.json()["detail"] == f"no task run {2**80}"
