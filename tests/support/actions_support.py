"""Fixtures of the clear and mark tests: a workflow of a chain and tasks beside it, and finished
runs of it on given days."""

import textwrap
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator import clock
from orchestrator.models import Attempt, AttemptOutcome, Run, RunState, TaskRun, TaskState, Workflow
from orchestrator.runs import trigger_workflow
from orchestrator.sync import sync_workflows

# a >> b >> c, and d beside them (no edge to the chain); e is a root feeding c.
CHAIN = '''
from orchestrator.dsl import Workflow

wf = Workflow("chain", description="A chain and a task beside it.")

@wf.task
def a(ctx):
    return 1

@wf.task
def b(ctx):
    return 2

@wf.task
def c(ctx):
    return 3

@wf.task
def d(ctx):
    return 4

@wf.task
def e(ctx):
    return 5

a >> b >> c
e >> c
'''

DAY = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def chain(tmp_path) -> Workflow:
    package = f"clearwf_{uuid.uuid4().hex[:10]}"
    folder = tmp_path / package
    folder.mkdir()
    (folder / "chain.py").write_text(textwrap.dedent(CHAIN))
    report = sync_workflows(folder, package)
    assert report.created == ["chain"], report
    return Workflow.objects.get(name="chain")


def finished_run(workflow, day: int, states: dict | None = None, run_state=RunState.SUCCEEDED) -> Run:
    """A finished run of ``workflow`` on 2026-03-<day>: every task succeeded but those named."""
    run, _ = trigger_workflow(workflow, {}, logical_date=DAY + timedelta(days=day - 1))
    now = clock.now()
    for tr in TaskRun.objects.filter(run=run):
        state = (states or {}).get(tr.task, TaskState.SUCCEEDED)
        tried = state not in (TaskState.UPSTREAM_FAILED, TaskState.SKIPPED, TaskState.CANCELLED)
        TaskRun.objects.filter(pk=tr.pk).update(state=state, attempts=int(tried), started_at=now if tried else None,
                                                finished_at=now)
        if tried:
            Attempt.objects.create(task_run=tr, number=1, started_at=now, finished_at=now,
                                   outcome=AttemptOutcome.SUCCEEDED if state == TaskState.SUCCEEDED
                                   else AttemptOutcome.FAILED)
    Run.objects.filter(pk=run.pk).update(state=run_state, finished_at=now)
    return run


def task_run(run, task) -> TaskRun:
    return TaskRun.objects.select_related("run").get(run=run, task=task, map_index=-1)


def listed(plan) -> list[tuple[int, str]]:
    """(run id, task) of each task run a plan lists, in its order."""
    return [(row["run"], row["task"]) for row in plan.rows]


def states(run) -> dict:
    return dict(TaskRun.objects.filter(run=run, map_index=-1).values_list("task", "state"))


# A task mapped over a list: split >> part (mapped) >> join.
MAPPED = '''
from orchestrator.dsl import Workflow

fan = Workflow("fan")

@fan.task
def split(ctx):
    return [1, 2, 3]

@fan.task
def part(ctx):
    return ctx.item

part.map(over=split)

@fan.task
def join(ctx):
    return 0

part >> join
'''


@pytest.fixture
def fan(tmp_path) -> Workflow:
    package = f"fanwf_{uuid.uuid4().hex[:10]}"
    folder = tmp_path / package
    folder.mkdir()
    (folder / "fan.py").write_text(textwrap.dedent(MAPPED))
    report = sync_workflows(folder, package)
    assert report.created == ["fan"], report
    return Workflow.objects.get(name="fan")


def mapped_run(workflow, day: int, instances: list[str]) -> Run:
    """A finished run of ``fan`` whose mapped task had one instance per state in ``instances``;
    the map and join failed when any instance did."""
    bad = any(state != TaskState.SUCCEEDED for state in instances)
    run = finished_run(workflow, day, {"part": TaskState.FAILED if bad else TaskState.SUCCEEDED,
                                       "join": TaskState.UPSTREAM_FAILED if bad else TaskState.SUCCEEDED},
                       run_state=RunState.FAILED if bad else RunState.SUCCEEDED)
    mapped = TaskRun.objects.get(run=run, task="part", map_index=-1)
    now = clock.now()
    for index, state in enumerate(instances):
        TaskRun.objects.create(run=run, task="part", map_index=index, state=state, spec=mapped.spec,
                               upstream=mapped.upstream, attempts=1, started_at=now, finished_at=now, item=index)
    return run
