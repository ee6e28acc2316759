"""Callbacks: on_failure, on_success and on_retry of tasks and workflows become jobs in the
transaction of the state change, once per change, and run on the workers like any job."""

import json

import pytest

from orchestrator.models import Run, TaskRun
from orchestrator.runs import trigger_workflow
from tests.support.features_support import run_to_end, sync_module, worker_loop

pytestmark = pytest.mark.django_db


@pytest.fixture
def loop(db):
    return worker_loop()

MODULE = '''
import json

from orchestrator.dsl import Param, Workflow


def record(context):
    with open({path!r}, "a") as handle:
        handle.write(json.dumps(context) + "\\n")
    return context["event"]


def failing_callback(context):
    raise RuntimeError("the pager is down")


wf = Workflow("called", on_success=record, on_failure=[record, failing_callback],
              params={{"fail": Param(bool, default=False)}})

@wf.task(retries=1, retry_delay=0, on_retry=record, on_failure=record)
def flaky(ctx):
    if ctx.params["fail"] or ctx.attempt == 1:
        raise ValueError(f"attempt {{ctx.attempt}} failed")
    return "ok"

@wf.task(on_success=record)
def after(ctx):
    return "after"

flaky >> after
'''


@pytest.fixture
def called(tmp_path):
    path = tmp_path / "calls.jsonl"
    return sync_module(tmp_path, MODULE.format(path=str(path)))["called"], path


def calls(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_jobs(clock, loop):
    jobs = list(Run.objects.filter(trigger="job"))
    for job in jobs:
        run_to_end(job, clock, loop)
    return jobs


def test_task_and_run_callbacks_are_jobs_called_once_per_change_with_their_context(called, clock, loop):
    workflow, path = called
    run, _ = trigger_workflow(workflow, now=clock.now())
    run_to_end(run, clock, loop)
    assert run.state == "succeeded"
    run_jobs(clock, loop)
    seen = sorted((c["event"], c["task"] or "", c["state"], c["attempt"] or 0) for c in calls(path))
    assert seen == [
        ("on_retry", "flaky", "scheduled", 1),
        ("on_success", "", "succeeded", 0),
        ("on_success", "after", "succeeded", 1),
    ]
    retry = next(c for c in calls(path) if c["event"] == "on_retry")
    assert (retry["run_id"], retry["workflow"], retry["error"]) == (run.pk, "called", "ValueError: attempt 1 failed")
    # Each callback is a job with its own task run, retries and log, as the UI shows them.
    assert TaskRun.objects.filter(spec__callback__isnull=False).count() == 3


def test_a_failing_callback_is_retried_as_a_job_and_ends_in_the_dead_letter_queue(called, clock, loop):
    workflow, path = called
    run, _ = trigger_workflow(workflow, {"fail": True}, now=clock.now())
    run_to_end(run, clock, loop)
    assert run.state == "failed"
    for _ in range(5):
        run_jobs(clock, loop)
        clock.advance(seconds=3600)  # past every retry delay
    events = sorted((c["event"], c["task"] or "") for c in calls(path))
    assert events == [("on_failure", ""), ("on_failure", "flaky"), ("on_retry", "flaky")]
    pager = TaskRun.objects.get(task__endswith=":failing_callback")
    assert pager.state == "dead" and pager.attempts == 3
    assert "the pager is down" in pager.error


def test_wf_test_runs_the_callbacks_in_process_and_reports_them():
    from orchestrator.dsl import Workflow as Dsl

    seen = []

    def remember(context):
        seen.append(context)

    wf = Dsl("local_called", on_failure=remember)

    @wf.task(retries=1, on_retry=remember)
    def always(ctx):
        raise RuntimeError("no")

    result = wf.test()
    assert result.state == "failed"
    assert [(c["event"], c["task"], c["outcome"]) for c in result.callbacks] == [
        ("on_retry", "always", "succeeded"), ("on_failure", None, "succeeded")]
    assert [context["event"] for context in seen] == ["on_retry", "on_failure"]
