"""wf.test(): a whole workflow in the calling process, with the real retry rule, trigger rules
and results passed downstream; and manage.py run_task."""

from datetime import UTC, datetime

import pytest

from orchestrator.dsl import Param, Workflow
from orchestrator.localrun import LocalRunError
from orchestrator.models import Run, TaskRun
from orchestrator.runs import create_run
from orchestrator.states import TaskState, Trigger

pytestmark = pytest.mark.django_db

CALLS = []


def test_a_local_run_passes_results_downstream_and_returns_each_tasks_state():
    wf = Workflow("local_etl", params={"n": Param(int, default=2)})

    @wf.task
    def extract(ctx):
        return {"rows": ctx.params["n"], "day": ctx.logical_date.date().isoformat()}

    @wf.task
    def load(ctx):
        return ctx.upstream["extract"]["rows"] * 10

    extract >> load
    result = wf.test(params={"n": 4}, logical_date=datetime(2026, 3, 1, tzinfo=UTC))
    assert result.state == "succeeded"
    assert result["extract"].result == {"rows": 4, "day": "2026-03-01"}
    assert result["load"].result == 40
    assert result["load"].attempts == 1
    # Nothing stays behind: the run was written in a transaction that is rolled back.
    assert not Run.objects.filter(pk=result.run_id).exists()


def test_a_local_run_retries_with_the_real_rule_without_waiting_and_applies_trigger_rules():
    wf = Workflow("local_flaky")

    @wf.task(retries=2, retry_delay=3600)
    def flaky(ctx):
        print(f"attempt {ctx.attempt}")
        if ctx.attempt < 3:
            raise RuntimeError(f"boom {ctx.attempt}")
        return "third time"

    @wf.task(retries=1, retry_delay=60)
    def broken(ctx):
        raise ValueError("always")

    @wf.task
    def needs_both(ctx):
        return "never"

    @wf.task(trigger_rule="all_done")
    def report(ctx):
        return sorted(ctx.upstream)

    [flaky, broken] >> needs_both
    [flaky, broken] >> report
    result = wf.test()
    assert result["flaky"].state == "succeeded" and result["flaky"].attempts == 3
    assert "attempt 1" in result["flaky"].log and "attempt 3" in result["flaky"].log
    assert result["broken"].state == "dead" and result["broken"].attempts == 2
    assert "ValueError: always" in result["broken"].error
    assert result["needs_both"].state == "upstream_failed"
    assert result["report"].state == "succeeded" and result["report"].result == ["broken", "flaky"]
    assert result.state == "failed"


def test_a_local_run_refuses_bad_params_and_bad_definitions_with_the_field_named():
    wf = Workflow("local_params", params={"n": Param(int)})

    @wf.task
    def only(ctx):
        return 1

    with pytest.raises(LocalRunError, match="n"):
        wf.test(params={"n": "many"})
    bad = Workflow("local_bad")

    @bad.task(retries=-1)
    def t(ctx):
        return 1

    with pytest.raises(LocalRunError, match="retries"):
        bad.test()


def run_task(*args):
    import subprocess
    import sys

    from tests.conftest import ROOT, process_env

    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "run_task", *args], cwd=ROOT,
                          env=process_env(), capture_output=True, text=True, timeout=120)


def test_run_task_runs_one_task_in_the_terminal_with_its_log_on_stdout():
    done = run_task("nightly_etl", "extract", "--param", "orders=2", "--logical-date", "2026-03-01T00:00:00+00:00")
    assert done.returncode == 0, done.stderr
    assert "extracted 6 orders for 2026-03-01" in done.stdout
    assert '"day": "2026-03-01"' in done.stdout.splitlines()[-1]
    # Parents' results are given on the command line; a failure exits 1 with the error.
    ok = run_task("nightly_etl", "transform_emea", "--upstream", 'extract={"orders": {"emea": [1, 2.5]}}')
    assert ok.returncode == 0 and '"total": 3.5' in ok.stdout
    failed = run_task("nightly_etl", "load")
    assert failed.returncode == 1 and "KeyError" in failed.stdout and "nightly_etl.load failed" in failed.stderr


def test_run_task_names_what_is_wrong_with_its_input():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="has no task 'nope'.*extract"):
        call_command("run_task", "nightly_etl", "nope")
    with pytest.raises(CommandError, match="orders.*integer"):
        call_command("run_task", "nightly_etl", "extract", "--param", "orders=many")
    with pytest.raises(CommandError, match="--param orders: expected NAME=VALUE|expected NAME=VALUE"):
        call_command("run_task", "nightly_etl", "extract", "--param", "orders")
    with pytest.raises(CommandError, match="no workflow 'ghost'"):
        call_command("run_task", "ghost", "x")
    with pytest.raises(CommandError, match="add a timezone"):
        call_command("run_task", "nightly_etl", "extract", "--logical-date", "2026-03-01T00:00:00")


def test_a_local_run_maps_branches_and_waits_for_a_sensor_without_sleeping():
    wf = Workflow("local_dynamic")
    checks = []

    @wf.task
    def listing(ctx):
        return ["a", "bb", "ccc"]

    @wf.task
    def measure(ctx):
        return {"item": ctx.item, "index": ctx.map_index, "length": len(ctx.item)}

    measure.map(over=listing, max_parallel=2)

    @wf.branch
    def route(ctx):
        return "long" if sum(part["length"] for part in ctx.upstream["measure"]) > 5 else "short"

    @wf.task
    def long(ctx):
        return "long"

    @wf.task
    def short(ctx):
        return "short"

    @wf.sensor(every=600, timeout=7200)
    def ready(ctx):
        checks.append(ctx.attempt)
        return len(checks) >= 3 and "ready"

    measure >> route >> [long, short]
    result = wf.test()
    assert result.state == "succeeded"
    assert result["measure"].result == [{"item": "a", "index": 0, "length": 1}, {"item": "bb", "index": 1, "length": 2},
                                        {"item": "ccc", "index": 2, "length": 3}]
    assert [i.state for i in result["measure"].instances] == ["succeeded"] * 3
    assert (result["long"].state, result["short"].state) == ("succeeded", "skipped")
    # Two "not yet" answers, twenty minutes of the runner's clock, no real waiting; the three
    # checks are one attempt.
    assert result["ready"].result == "ready" and checks == [1, 1, 1] and result["ready"].attempts == 1


def test_a_local_run_of_a_sensor_without_timeout_that_never_answers_gives_up_with_a_message():
    wf = Workflow("local_forever")

    @wf.sensor(every=1, timeout=None)
    def never(ctx):
        return False

    with pytest.raises(LocalRunError, match="gave up after too many attempts"):
        wf.test(max_attempts_total=50)


def test_a_local_run_goes_through_the_workers_claim_and_takes_no_other_work():
    # Work of another run is due in the same queue; a local run claims only its own.
    other, _ = create_run(None, trigger=Trigger.JOB, tasks={"tests.support.tasks_for_tests:add": {
        "kind": "python", "ref": "tests.support.tasks_for_tests:add", "call": "job", "args": [1], "kwargs": {}}})
    wf = Workflow("claimed_like_a_worker")

    @wf.task(queue="batch")
    def first(ctx):
        return 1

    @wf.task
    def second(ctx):
        return ctx.upstream["first"] + 1

    first >> second
    result = wf.test(keep=True)
    assert (result.state, result["second"].result) == ("succeeded", 2)
    run = Run.objects.get(pk=result.run_id)
    # The worker's claim starts the run (its start and schedule delay) and stamps each task run
    # as admitted and claimed at once (queued_at); the task runs keep the queues they declare.
    assert run.started_at is not None and run.schedule_delay is not None
    task_runs = {t.task: t for t in TaskRun.objects.filter(run=run)}
    assert all(t.queued_at == t.started_at for t in task_runs.values())
    assert (task_runs["first"].queue, task_runs["second"].queue) == ("batch", "default")
    assert TaskRun.objects.get(run=other).state == TaskState.SCHEDULED
