"""Dynamic mapping, branches and sensors through the real resolver, with an injected clock: a
mapped task is one row plus an instance per item, each instance a task run of its own (retried,
dead, retried from the dead-letter queue on its own), created in the transaction that records its
parent's success; a branch skips the children it did not choose; a sensor's "not yet" frees its
slot until its next check."""

from datetime import timedelta

import pytest
from django.test.utils import override_settings

from orchestrator import control, dispatcher
from orchestrator.models import Attempt, Run, TaskRun
from orchestrator.runs import trigger_workflow
from tests.support.features_support import run_to_end, sync_module, worker_loop
from tests.test_execution_rules import execute_claimed

pytestmark = pytest.mark.django_db

MODULE = '''
import os

from orchestrator.dsl import Param, Workflow

mapped = Workflow("mapped", params={{"items": Param(list, default=[1, 2, 3]), "heal": Param(str, default=""),
                                     "fail_on": Param(int, default=-1)}})

@mapped.task
def listing(ctx):
    return ctx.params["items"]

@mapped.task(retries={retries}, retry_delay=0)
def double(ctx):
    if ctx.item == ctx.params["fail_on"] and not os.path.exists(ctx.params["heal"]):
        raise ValueError(f"item {{ctx.item}} fails")
    return {{"index": ctx.map_index, "double": ctx.item * 2, "upstream": sorted(ctx.upstream)}}

double.map(over=listing{max_parallel})

@mapped.task
def total(ctx):
    return [part["double"] for part in ctx.upstream["double"]]

@mapped.task(trigger_rule="all_done")
def report(ctx):
    return "done"

double >> total >> report

branching = Workflow("branching", params={{"choose": Param(list, default=["small"])}})

@branching.branch
def size(ctx):
    return ctx.params["choose"]

@branching.task
def small(ctx):
    return "small"

@branching.task
def large(ctx):
    return "large"

@branching.task
def after_large(ctx):
    return "after large"

@branching.task(trigger_rule="none_failed")
def join(ctx):
    return sorted(ctx.upstream)

@branching.task
def pieces(ctx):
    return ctx.item

pieces.map(over=large)
size >> [small, large]
large >> after_large
[small, after_large] >> join

sensing = Workflow("sensing", params={{"flag": Param(str, default="")}})

def retried(context):
    return context

@sensing.sensor(every=30, timeout=100, on_retry=retried)
def arrived(ctx):
    if os.path.exists(ctx.params["flag"]):
        return {{"found": ctx.params["flag"]}}
    return False

@sensing.task
def process(ctx):
    return ctx.upstream["arrived"]

arrived >> process
'''


@pytest.fixture
def workflows(tmp_path):
    return lambda retries=0, max_parallel="": sync_module(
        tmp_path, MODULE.format(retries=retries, max_parallel=max_parallel))


@pytest.fixture
def loop(db):
    return worker_loop()


def rows(run, task):
    return list(TaskRun.objects.filter(run=run, task=task).order_by("map_index"))


def test_a_mapped_task_runs_once_per_item_and_its_child_gets_the_results_in_order(workflows, clock, loop):
    wfs = workflows()
    run, _ = trigger_workflow(wfs["mapped"], {"items": [5, 6, 7]}, now=clock.now())
    assert run.dynamic
    run_to_end(run, clock, loop)
    assert run.state == "succeeded"
    own, *instances = rows(run, "double")
    assert own.map_index == -1 and own.state == "succeeded"
    assert [(i.map_index, i.state, i.attempts) for i in instances] == [(0, "succeeded", 1), (1, "succeeded", 1),
                                                                        (2, "succeeded", 1)]
    # Each instance got its item and index, and the parents of the mapped task.
    assert own.result == [{"index": 0, "double": 10, "upstream": ["listing"]},
                          {"index": 1, "double": 12, "upstream": ["listing"]},
                          {"index": 2, "double": 14, "upstream": ["listing"]}]
    assert rows(run, "total")[0].result == [10, 12, 14]


def test_mapping_over_an_empty_list_runs_nothing_and_the_child_gets_an_empty_list(workflows, clock, loop):
    wfs = workflows()
    run, _ = trigger_workflow(wfs["mapped"], {"items": []}, now=clock.now())
    run_to_end(run, clock, loop)
    assert run.state == "succeeded"
    assert [(r.map_index, r.state, r.result) for r in rows(run, "double")] == [(-1, "succeeded", [])]
    assert rows(run, "total")[0].result == []


def test_max_parallel_caps_the_instances_due_or_running_at_once(workflows, clock, loop):
    wfs = workflows(max_parallel=", max_parallel=2")
    run, _ = trigger_workflow(wfs["mapped"], {"items": [1, 2, 3, 4, 5]}, now=clock.now())
    dispatcher.tick(now=clock.now())
    execute_claimed(loop, 10, clock)  # listing: the instances are created with its success
    states = [i.state for i in rows(run, "double")[1:]]
    assert states == ["scheduled", "scheduled", "waiting", "waiting", "waiting"]
    peak = 0
    for _ in range(20):
        dispatcher.tick(now=clock.now())
        active = TaskRun.objects.filter(run=run, task="double", map_index__gte=0,
                                        state__in=["scheduled", "queued", "running"]).count()
        peak = max(peak, active)
        if not execute_claimed(loop, 1, clock):  # one at a time, so each end releases the next
            break
    run.refresh_from_db()
    assert run.state == "succeeded" and peak == 2
    starts = [i.started_at for i in rows(run, "double")[1:]]
    assert starts == sorted(starts)  # released lowest index first


def test_an_instance_retries_dies_and_is_retried_from_the_dead_letter_queue_on_its_own(workflows, clock, loop, tmp_path):
    wfs = workflows(retries=1)
    heal = tmp_path / "heal"
    run, _ = trigger_workflow(wfs["mapped"], {"items": [1, 2, 3], "fail_on": 2, "heal": str(heal)}, now=clock.now())
    for _ in range(5):
        run_to_end(run, clock, loop)
        clock.advance(seconds=60)  # past the retry delay
    run.refresh_from_db()
    own, first, second, third = rows(run, "double")
    assert (first.attempts, second.attempts, third.attempts) == (1, 2, 1)  # only item 2 was retried
    assert second.state == "dead" and "item 2 fails" in second.error
    assert own.state == "failed" and own.error == "1 of 3 mapped instances did not succeed"
    assert rows(run, "total")[0].state == "upstream_failed"
    assert rows(run, "report")[0].state == "succeeded"  # all_done still runs
    assert run.state == "failed"
    # From the dead-letter queue: only that instance runs again; the mapped task, its child and
    # the run resume.
    heal.touch()
    assert control.retry_task_runs([second.pk], now=clock.now()) == 1
    own.refresh_from_db()
    assert own.state == "mapped"
    run_to_end(run, clock, loop)
    assert run.state == "succeeded"
    own, first, second, third = rows(run, "double")
    assert (first.attempts, second.attempts, third.attempts) == (1, 3, 1)
    assert rows(run, "total")[0].result == [2, 4, 6]
    # Retrying the run never runs the mapped task's own row as a task.
    assert not Attempt.objects.filter(task_run=own).exists()


@override_settings(ORCHESTRATOR_MAX_MAP_ITEMS=3)
def test_a_list_over_the_item_limit_fails_the_parent_with_a_clear_error(workflows, clock, loop):
    wfs = workflows()
    run, _ = trigger_workflow(wfs["mapped"], {"items": [1, 2, 3, 4]}, now=clock.now())
    run_to_end(run, clock, loop)
    listing = rows(run, "listing")[0]
    assert listing.state == "dead"
    assert listing.error == ("double is mapped over this task's result of 4 items, over the limit of 3 "
                             "(ORCHESTRATOR_MAX_MAP_ITEMS): return fewer, larger items")
    assert [(r.map_index, r.state) for r in rows(run, "double")] == [(-1, "upstream_failed")]


def test_a_branch_follows_the_children_it_names_and_the_others_are_skipped_downstream(workflows, clock, loop):
    wfs = workflows()
    run, _ = trigger_workflow(wfs["branching"], now=clock.now())
    run_to_end(run, clock, loop)
    states = dict(TaskRun.objects.filter(run=run).values_list("task", "state"))
    assert states == {"size": "succeeded", "small": "succeeded", "large": "skipped", "after_large": "skipped",
                      "pieces": "skipped", "join": "succeeded"}
    assert TaskRun.objects.get(run=run, task="large").error == "not chosen by the branch size"
    assert run.state == "succeeded"


def test_a_branch_naming_a_task_that_is_not_its_child_fails(workflows, clock, loop):
    wfs = workflows()
    run, _ = trigger_workflow(wfs["branching"], {"choose": ["join"]}, now=clock.now())
    run_to_end(run, clock, loop)
    size = TaskRun.objects.get(run=run, task="size")
    assert size.state == "dead" and "the branch chose 'join', not among its children (large, small)" in size.error
    assert run.state == "failed"


def test_a_sensor_holds_no_slot_between_checks_and_goes_on_when_it_answers_yes(workflows, clock, loop, tmp_path):
    wfs = workflows()
    flag = tmp_path / "flag"
    run, _ = trigger_workflow(wfs["sensing"], {"flag": str(flag)}, now=clock.now())
    for _ in range(2):
        run_to_end(run, clock, loop)
        sensor = rows(run, "arrived")[0]
        # Not yet: sensing, its next check due after its interval, holding nothing meanwhile.
        assert sensor.state == "sensing" and sensor.due_at == clock.now() + timedelta(seconds=30)
        assert sensor.last_answer == "false"
        assert dispatcher.tick(now=clock.now()) == 0
        clock.advance(seconds=30)
    flag.touch()
    run_to_end(run, clock, loop)
    assert run.state == "succeeded"
    assert rows(run, "process")[0].result == {"found": str(flag)}
    sensor = rows(run, "arrived")[0]
    outcomes = list(Attempt.objects.filter(task_run=sensor).order_by("number").values_list("outcome", flat=True))
    # A check is not an attempt: three checks, one attempt (the try), no retry (on_retry was not called).
    assert outcomes == ["succeeded"] and sensor.checks == 3 and sensor.attempts == 1
    assert sensor.max_attempts == 1 and not Run.objects.filter(trigger="job").exists()


def test_a_sensor_that_never_answers_yes_times_out_through_the_retry_rule(workflows, clock, loop, tmp_path):
    wfs = workflows()
    run, _ = trigger_workflow(wfs["sensing"], {"flag": str(tmp_path / "never")}, now=clock.now())
    for _ in range(6):
        run_to_end(run, clock, loop)
        clock.advance(seconds=30)
    sensor = rows(run, "arrived")[0]
    assert sensor.state == "dead" and sensor.error == "sensor timed out: no true answer in 100s"
    outcomes = list(Attempt.objects.filter(task_run=sensor).order_by("number").values_list("outcome", flat=True))
    assert outcomes == ["timed_out"] and sensor.checks == 5  # checks at 0, 30, 60, 90; at 120 it is over
    run.refresh_from_db()
    assert run.state == "failed" and rows(run, "process")[0].state == "upstream_failed"
