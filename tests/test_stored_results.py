"""Results too large for a row (over ORCHESTRATOR_MAX_RESULT_BYTES) on real workers: kept in the
log storage, read back by the child that needs them, a mapped task's children, the API's result
endpoint (the API's other answers link to it), the results tab and django.tasks' get_result;
masked like any result; deleted by retention with their run; refused, naming both limits, over
ORCHESTRATOR_MAX_STORED_RESULT_BYTES."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from orchestrator import access, clock, conf, control, executor, results, retention, secretstore
from orchestrator.jobs import enqueue
from orchestrator.models import Run, TaskRun, Workflow, WorkflowVersion
from orchestrator.runs import create_run
from tests.conftest import process_env, wait_for
from tests.support import big_results
from tests.support.api_support import client_for, make_user
from tests.test_execution_rules import execute_claimed, job_spec, make_run, worker_loop
from tests.test_secrets import KEY, STRIPE, leaks
from tests.test_secrets_workers import data_dir, finished  # noqa: F401 - data_dir is a fixture

REF = "tests.support.big_results"
INLINE = 256 * 1024


def start_worker(processes, data_dir):  # noqa: F811 - the fixture's value
    env = process_env(ORCHESTRATOR_DATA_DIR=str(data_dir), ORCHESTRATOR_SECRETS_KEYS=KEY,
                      ORCHESTRATOR_POLL_SECONDS="0.5", ORCHESTRATOR_JOB_MODULES=REF,
                      ORCHESTRATOR_MAX_STORED_RESULT_BYTES=str(2 * 1024 * 1024))
    worker = processes.start("worker", "--queues", "default", "--concurrency", "2", "--inprocess", "2", env=env)
    wait_for(lambda: "in-process executor ready" in processes.output(worker), 30, message="the worker")
    return worker


def big_run() -> Run:
    workflow = Workflow.objects.create(name="big-results")
    spec = big_results.big.to_spec()
    tasks = {name: {**task, "retries": 0, "max_attempts": 1} for name, task in spec["tasks"].items()}
    version = WorkflowVersion.objects.create(workflow=workflow, number=1, hash="big-results", spec={"tasks": tasks})
    run, _ = create_run(workflow, trigger="manual", tasks=tasks, version=version)
    return finished(run)


def sent(api, url: str):
    """The value ``GET /api/task-runs/{id}/result/`` streams."""
    answer = api.get(url)
    assert answer.status_code == 200, answer.content
    return json.loads(b"".join(answer.streaming_content))


def stored_name(task_run: TaskRun) -> str:
    marker = results.marker_of(task_run.result)
    assert marker is not None, task_run.result
    return marker["name"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_result_too_large_for_a_row_reaches_its_children_the_api_the_page_and_retention(processes, data_dir):  # noqa: F811
    secretstore.put("secret", "stripe", {"value": STRIPE})
    start_worker(processes, data_dir)
    run = big_run()
    task_runs = {(t.task, t.map_index): t for t in TaskRun.objects.filter(run=run)}
    produce = task_runs["produce", -1]
    assert produce.state == "succeeded", produce.error
    # The row keeps a marker; the value, masked, is in the log storage beside the logs.
    name = stored_name(produce)
    assert name == f"runs/{run.pk}/{produce.pk}-1.result.json"
    assert results.marker_of(produce.result)["bytes"] > 4 * INLINE
    with conf.log_storage().open(name, "rb") as handle:
        stored = handle.read().decode()
    assert leaks(stored) == [] and json.loads(stored)["key"] == "***"
    # The child read it whole through ctx.upstream.
    assert task_runs["consume", -1].result == {"rows": big_results.ROWS, "last": f"{big_results.ROWS - 1:06d}",
                                               "key": "***"}
    # A mapped task's instances: two stored, one in its row; the child gets the whole list in order.
    assert results.marker_of(task_runs["piece", 0].result) and results.marker_of(task_runs["piece", 2].result)
    assert task_runs["piece", 1].result == {"index": 1, "filler": "p" * 10}
    assert task_runs["gather", -1].state == "succeeded", task_runs["gather", -1].error
    assert task_runs["gather", -1].result == [[0, 300 * 1024], [1, 10], [2, 300 * 1024]]
    # Over the hard limit: the attempt fails naming both limits, and nothing is stored.
    huge = task_runs["huge", -1]
    assert huge.state == "dead" and huge.result is None
    assert ("over the limit of 2097152 bytes (ORCHESTRATOR_MAX_STORED_RESULT_BYTES" in huge.error
            and "ORCHESTRATOR_MAX_RESULT_BYTES" in huge.error), huge.error

    # The API's answers show it by its size and URL; that URL sends the value itself, streamed.
    api = client_for(make_user("vera", access.VIEWERS))
    answer = api.get(f"/api/task-runs/{produce.pk}/")
    assert answer.status_code == 200
    assert answer.json()["result"] == {results.KEY: {"bytes": results.marker_of(produce.result)["bytes"],
                                                     "url": f"/api/task-runs/{produce.pk}/result/"}}
    whole = json.loads(b"".join(api.get(answer.json()["result"][results.KEY]["url"]).streaming_content))
    assert len(whole["rows"]) == big_results.ROWS and whole["key"] == "***"
    listed = api.get(f"/api/runs/{run.pk}/task-runs/?task=piece").json()["results"]
    instances = [t["result"] for t in listed if t["map_index"] >= 0]
    assert instances[1] == {"index": 1, "filler": "p" * 10}
    assert [sent(api, r[results.KEY]["url"])["filler"] for r in (instances[0], instances[2])] == ["p" * 300 * 1024] * 2
    assert [len(r["filler"]) for r in sent(api, f"/api/task-runs/{task_runs['piece', -1].pk}/result/")] == [
        300 * 1024, 10, 300 * 1024]

    # The results tab shows it in parts, saying where it is kept; the mapped task's list says so too.
    web = Client()
    web.force_login(make_user("walt", access.VIEWERS))
    page = web.get(reverse("orchestrator:web:task_run_result", args=[produce.pk])).content.decode()
    assert "kept in the log storage" in page and "&quot;000000rrrr" in page
    mapped = web.get(reverse("orchestrator:web:task_run_result", args=[task_runs["piece", -1].pk])).content.decode()
    assert mapped.count("kept in the log storage (") == 2

    # Retention deletes the stored results with their run.
    names = [name, stored_name(task_runs["piece", 0]), stored_name(task_runs["piece", 2])]
    assert all(conf.log_storage().exists(n) for n in names)
    assert control.discard_task_runs([huge.pk]) == 1  # out of the dead-letter queue, which retention keeps
    Run.objects.filter(pk=run.pk).update(finished_at=clock.now() - timedelta(days=40))
    report = retention.prune(timedelta(days=30))
    assert report.runs == 1 and report.log_errors == []
    assert not any(conf.log_storage().exists(n) for n in names)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_in_process_executors_store_a_large_result_too(processes, data_dir):  # noqa: F811
    secretstore.put("secret", "stripe", {"value": STRIPE})
    start_worker(processes, data_dir)
    runs = {name: enqueue(f"{REF}:{name}", max_attempts=1)[0] for name in ("big_thread_job", "big_async_job")}
    for run in runs.values():
        finished(run)
    thread = TaskRun.objects.get(run=runs["big_thread_job"])
    assert thread.state == "succeeded", thread.error
    with conf.log_storage().open(stored_name(thread), "rb") as handle:
        assert json.loads(handle.read()) == {"key": "***", "blob": "t" * (400 * 1024)}
    async_job = TaskRun.objects.get(run=runs["big_async_job"])
    assert results.load(async_job.result) == ["a" * 1024] * 400 and results.marker_of(async_job.result)
    api = client_for(make_user("vera", access.VIEWERS))
    shown = api.get(f"/api/jobs/{runs['big_thread_job'].pk}/").json()["result"]
    assert shown == {results.KEY: {"bytes": results.marker_of(thread.result)["bytes"],
                                   "url": f"/api/task-runs/{thread.pk}/result/"}}
    assert sent(api, shown[results.KEY]["url"])["key"] == "***"


def test_a_result_shaped_like_a_marker_is_refused():
    with pytest.raises(executor.TaskFailure, match="marks a result kept in the log storage"):
        executor.encode_result({results.KEY: {"name": "runs/1/2-1.result.json", "bytes": 3}})
    with pytest.raises(executor.TaskFailure, match="marks a result kept in the log storage"):
        executor.encode_result([1, {results.KEY: {}}])
    assert executor.encode_result({"other": {results.KEY: 1}}) is not None  # only the shape a reader follows


def test_a_mapped_over_list_stays_in_its_row_under_the_row_limit():
    message = {"spec": {"mapped_by": ["piece"]}, "map_index": -1}
    with pytest.raises(executor.TaskFailure, match=r"MAX_RESULT_BYTES\) for a result kept in the database "
                                                   r"\(piece is mapped over it\)"):
        executor.encode_result(["x" * 1000] * 300, in_row=executor._kept_in_row(message))


def test_a_marker_naming_anything_but_a_stored_result_is_not_read():
    with pytest.raises(results.StoredResultError, match="not the name of a stored result"):
        results.load({results.KEY: {"name": "runs/1/2-1.log"}})
    assert "error" in results.shown({results.KEY: {"name": "runs/1/2-1.result.json"}})[results.KEY]


@pytest.mark.django_db
def test_wf_test_reads_a_stored_result_back_and_deletes_it_with_its_rolled_back_run(data_dir):  # noqa: F811
    kept = big_results.local.test(keep=True)
    assert kept.state == "succeeded"
    assert kept["make"].result == ["m" * 1024] * 300 and kept["count"].result == 300
    name = stored_name(TaskRun.objects.get(run_id=kept.run_id, task="make"))
    assert conf.log_storage().exists(name)
    # Without keep, the run's rows are rolled back and its stored result deleted.
    rolled_back = big_results.local.test()
    assert rolled_back["make"].result == ["m" * 1024] * 300 and rolled_back["count"].result == 300
    folder = Path(conf.log_storage().path(f"runs/{rolled_back.run_id}"))
    assert folder.is_dir()  # the result was written there, then deleted
    assert [path.name for path in folder.iterdir()] == []


@pytest.mark.django_db
def test_clearing_a_task_run_deletes_its_stored_result(clock, data_dir, django_capture_on_commit_callbacks):  # noqa: F811
    run = make_run({"a": job_spec("too_big", ())}, clock)  # returns 1 MiB of JSON
    execute_claimed(worker_loop(), 1, clock)
    task_run = TaskRun.objects.get(run=run)
    assert task_run.state == "succeeded", task_run.error
    name = stored_name(task_run)
    assert len(results.load(task_run.result)) == 1024 * 1024 and conf.log_storage().exists(name)
    with django_capture_on_commit_callbacks(execute=True):
        assert control.clear_task_runs([task_run.pk]) == [task_run.pk]
    task_run.refresh_from_db()
    assert task_run.state == "scheduled" and task_run.result is None
    assert not conf.log_storage().exists(name)
