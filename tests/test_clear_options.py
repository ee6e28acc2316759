# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""Clear with options and whole-run marks (orchestrator.clearing): the dry run lists exactly the
task runs the clear then touches, at the edges of each option (upstream, downstream, only failed,
past and future runs), mapped tasks, held-back runs; a run marked succeeded or failed; the bound
on how many task runs one action touches."""

import textwrap
from datetime import timedelta

import pytest

from orchestrator import clearing, clock, notes, retention
from orchestrator.models import Attempt, AttemptOutcome, Run, RunState, TaskRun, TaskState, Workflow
from orchestrator.runs import trigger_workflow
from orchestrator.sync import sync_workflows
from tests.support.actions_support import (  # noqa: F401 - fixtures
    CHAIN,
    chain,
    fan,
    finished_run,
    listed,
    mapped_run,
    states,
    task_run,
)

pytestmark = pytest.mark.django_db


# --- the task set: upstream and downstream ---------------------------------------------------------


def test_the_task_alone_downstream_and_upstream_are_what_the_graph_says(chain):
    run = finished_run(chain, 1)
    b = task_run(run, "b")
    alone = clearing.plan_task_clear(b, clearing.ClearScope(downstream=False))
    assert listed(alone) == [(run.pk, "b")] and alone.count == 1 and alone.runs == 1
    # Downstream: c (and nothing beside the chain: d, e, a stay).
    assert listed(clearing.plan_task_clear(b, clearing.ClearScope())) == [(run.pk, "b"), (run.pk, "c")]
    # Upstream: a only (e feeds c, not b).
    assert listed(clearing.plan_task_clear(b, clearing.ClearScope(upstream=True, downstream=False))) == [
        (run.pk, "a"), (run.pk, "b")]
    # Both: the chain; c's other parent e is not upstream of b, so it stays.
    both = clearing.plan_task_clear(b, clearing.ClearScope(upstream=True, downstream=True))
    assert listed(both) == [(run.pk, "a"), (run.pk, "b"), (run.pk, "c")]
    # Upstream of the leaf: every ancestor, transitively (a through b, and e).
    leaf = clearing.plan_task_clear(task_run(run, "c"), clearing.ClearScope(upstream=True))
    assert listed(leaf) == [(run.pk, "a"), (run.pk, "b"), (run.pk, "c"), (run.pk, "e")]


def test_only_failed_keeps_the_failed_dead_and_upstream_failed_ones(chain):
    run = finished_run(chain, 1, {"b": TaskState.DEAD, "c": TaskState.UPSTREAM_FAILED, "a": TaskState.SUCCEEDED},
                       run_state=RunState.FAILED)
    plan = clearing.plan_task_clear(task_run(run, "a"), clearing.ClearScope(only_failed=True))
    # a itself succeeded: not listed; b (dead) and c (upstream failed) are.
    assert listed(plan) == [(run.pk, "b"), (run.pk, "c")]


def test_active_task_runs_and_held_back_runs_are_never_listed(chain):
    run = finished_run(chain, 1)
    TaskRun.objects.filter(run=run, task="c").update(state=TaskState.RUNNING, finished_at=None)
    assert listed(clearing.plan_task_clear(task_run(run, "b"), clearing.ClearScope())) == [(run.pk, "b")]
    held = finished_run(chain, 2)
    Run.objects.filter(pk=held.pk).update(state=RunState.PENDING)
    assert clearing.plan_task_clear(task_run(held, "b"), clearing.ClearScope()).count == 0


# --- past and future runs ------------------------------------------------------------------------------


def test_past_and_future_take_the_same_tasks_in_earlier_and_later_runs_only(chain):
    first, second, third = (finished_run(chain, day) for day in (1, 2, 3))
    # Another run on the same logical date as the picked one is neither past nor future.
    twin = finished_run(chain, 2)
    b = task_run(second, "b")
    scope = clearing.ClearScope(downstream=False)
    assert listed(clearing.plan_task_clear(b, scope)) == [(second.pk, "b")]
    past = clearing.plan_task_clear(b, clearing.ClearScope(downstream=False, past=True))
    assert listed(past) == [(first.pk, "b"), (second.pk, "b")] and past.runs == 2
    future = clearing.plan_task_clear(b, clearing.ClearScope(downstream=False, future=True))
    assert listed(future) == [(second.pk, "b"), (third.pk, "b")]
    both = clearing.plan_task_clear(b, clearing.ClearScope(past=True, future=True))
    assert listed(both) == [(first.pk, "b"), (first.pk, "c"), (second.pk, "b"), (second.pk, "c"),
                            (third.pk, "b"), (third.pk, "c")]
    assert twin.pk not in {row["run"] for row in both.rows}


def test_the_first_run_has_no_past_and_the_last_no_future(chain):
    first, last = finished_run(chain, 1), finished_run(chain, 2)
    assert listed(clearing.plan_task_clear(task_run(first, "d"), clearing.ClearScope(past=True))) == [(first.pk, "d")]
    assert listed(clearing.plan_task_clear(task_run(last, "d"), clearing.ClearScope(future=True))) == [(last.pk, "d")]


def test_past_runs_of_another_workflow_are_never_taken(chain, tmp_path):
    run = finished_run(chain, 2)
    folder = tmp_path / "otherpkg"
    folder.mkdir()
    (folder / "other.py").write_text(textwrap.dedent(CHAIN.replace('"chain"', '"other"')))
    sync_workflows(folder, "otherpkg")
    other = finished_run(Workflow.objects.get(name="other"), 1)
    plan = clearing.plan_task_clear(task_run(run, "d"), clearing.ClearScope(past=True))
    assert listed(plan) == [(run.pk, "d")] and other.pk not in {row["run"] for row in plan.rows}


def test_only_failed_in_past_runs_lists_just_the_failures(chain):
    bad = finished_run(chain, 1, {"d": TaskState.FAILED}, run_state=RunState.FAILED)
    finished_run(chain, 2)
    picked = finished_run(chain, 3, {"d": TaskState.DEAD}, run_state=RunState.FAILED)
    plan = clearing.plan_task_clear(task_run(picked, "d"), clearing.ClearScope(only_failed=True, past=True))
    assert listed(plan) == [(bad.pk, "d"), (picked.pk, "d")]


# --- what the clear does is what the dry run said ----------------------------------------------------


@pytest.mark.time_sensitive
def test_the_clear_touches_exactly_what_the_dry_run_listed(chain):
    first = finished_run(chain, 1)
    second = finished_run(chain, 2)
    plan = clearing.plan_task_clear(task_run(second, "b"), clearing.ClearScope(past=True))
    cleared = clearing.clear(plan)
    assert cleared == plan.ids == sorted(row["id"] for row in plan.rows)
    # b is not a root: it waits for a again (a stays succeeded); c waits for b.
    assert states(first) == {"a": "succeeded", "b": "scheduled", "c": "waiting", "d": "succeeded", "e": "succeeded"}
    assert states(second) == states(first)
    for run in (first, second):
        run.refresh_from_db()
        assert run.state == RunState.RUNNING


def test_a_plan_over_the_bound_counts_and_lists_but_refuses_to_clear(chain, monkeypatch):
    runs = [finished_run(chain, day) for day in (1, 2, 3)]
    monkeypatch.setattr(clearing, "MOST", 4)
    plan = clearing.plan_task_clear(task_run(runs[2], "b"), clearing.ClearScope(past=True))
    # b and c in three runs: six, past the bound of four; counted to the bound + 1 only.
    assert (plan.too_many, plan.count, plan.ids) == (True, 5, [])
    with pytest.raises(clearing.ClearError, match="more than 4 task runs"):
        clearing.clear(plan)
    assert all(states(run)["b"] == "succeeded" for run in runs)


def test_the_digest_changes_when_the_selection_does(chain):
    run = finished_run(chain, 1)
    before = clearing.plan_task_clear(task_run(run, "b"), clearing.ClearScope())
    TaskRun.objects.filter(run=run, task="c").update(state=TaskState.RUNNING)
    after = clearing.plan_task_clear(task_run(run, "b"), clearing.ClearScope())
    assert before.digest != after.digest


# --- whole runs --------------------------------------------------------------------------------------


def test_a_run_clear_takes_every_finished_task_or_only_the_failed_ones(chain):
    run = finished_run(chain, 1, {"b": TaskState.DEAD, "c": TaskState.UPSTREAM_FAILED}, run_state=RunState.FAILED)
    every = clearing.plan_run_clear([run.pk])
    assert sorted(task for _, task in listed(every)) == ["a", "b", "c", "d", "e"]
    failed = clearing.plan_run_clear([run.pk], only_failed=True)
    assert listed(failed) == [(run.pk, "b"), (run.pk, "c")]


@pytest.mark.time_sensitive
def test_marking_a_failed_run_succeeded_marks_what_did_not_end_well(chain):
    run = finished_run(chain, 1, {"b": TaskState.DEAD, "c": TaskState.UPSTREAM_FAILED}, run_state=RunState.FAILED)
    result = clearing.mark_runs([run.pk], TaskState.SUCCEEDED, by="olga")
    assert sorted(TaskRun.objects.filter(pk__in=result["task_runs"]).values_list("task", flat=True)) == ["b", "c"]
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and result["runs"] == [run.pk]
    assert set(states(run).values()) == {"succeeded"}


@pytest.mark.time_sensitive
def test_marking_a_running_run_failed_stops_its_running_attempt(chain):
    run, _ = trigger_workflow(chain, {})
    now = clock.now()
    a = task_run(run, "a")
    TaskRun.objects.filter(pk=a.pk).update(state=TaskState.RUNNING, attempts=1, started_at=now)
    Attempt.objects.create(task_run=a, number=1, started_at=now, outcome=AttemptOutcome.RUNNING)
    clearing.mark_runs([run.pk], TaskState.FAILED, by="olga")
    run.refresh_from_db()
    assert run.state == RunState.FAILED
    attempt = Attempt.objects.get(task_run=a)
    assert (attempt.outcome, attempt.error) == (AttemptOutcome.CANCELLED, "marked failed by olga")
    # Nothing of the run is left unfinished.
    assert not TaskRun.objects.filter(run=run, state__in=clearing.UNFINISHED).exists()


@pytest.mark.time_sensitive
def test_marking_a_succeeded_run_failed_fails_the_run_itself_with_the_reason(chain):
    run = finished_run(chain, 1)
    result = clearing.mark_runs([run.pk], TaskState.FAILED, by="olga")
    run.refresh_from_db()
    assert (run.state, run.reason, result["task_runs"]) == (RunState.FAILED, "marked failed by olga", [])
    assert set(states(run).values()) == {"succeeded"}


@pytest.mark.time_sensitive
def test_marking_a_cancelled_run_succeeded_ends_it_succeeded(chain):
    run = finished_run(chain, 1, {"c": TaskState.CANCELLED}, run_state=RunState.CANCELLED)
    clearing.mark_runs([run.pk], TaskState.SUCCEEDED)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED


def test_a_run_cannot_be_marked_anything_else(chain):
    run = finished_run(chain, 1)
    with pytest.raises(ValueError, match="succeeded or failed"):
        clearing.mark_runs([run.pk], "skipped")


@pytest.mark.time_sensitive
def test_a_run_marked_failed_by_hand_is_marked_succeeded_again(chain):
    run = finished_run(chain, 1)
    clearing.mark_runs([run.pk], TaskState.FAILED)
    result = clearing.mark_runs([run.pk], TaskState.SUCCEEDED)
    run.refresh_from_db()
    assert (run.state, run.reason, result["runs"]) == (RunState.SUCCEEDED, "", [run.pk])


# --- mapped tasks ------------------------------------------------------------------------------------


def indexed(plan) -> list[tuple[str, int]]:
    return [(row["task"], row["map_index"]) for row in plan.rows]


def test_a_mapped_task_is_cleared_as_its_own_row_or_by_its_failed_instances(fan):
    run = mapped_run(fan, 1, [TaskState.SUCCEEDED, TaskState.DEAD, TaskState.SUCCEEDED])
    mapped = TaskRun.objects.select_related("run").get(run=run, task="part", map_index=-1)
    # Clearing the map maps it again (every instance runs again): its own row, and join below it.
    assert indexed(clearing.plan_task_clear(mapped, clearing.ClearScope())) == [("join", -1), ("part", -1)]
    # Only failed: the failed instance, not the map (its good instances keep their results).
    assert indexed(clearing.plan_run_clear([run.pk], only_failed=True)) == [("join", -1), ("part", 1)]
    assert indexed(clearing.plan_task_clear(mapped, clearing.ClearScope(only_failed=True))) == [
        ("join", -1), ("part", 1)]


def test_an_instance_picked_by_hand_is_cleared_alone_and_its_index_in_past_runs(fan):
    old = mapped_run(fan, 1, [TaskState.SUCCEEDED, TaskState.SUCCEEDED])
    new = mapped_run(fan, 2, [TaskState.SUCCEEDED, TaskState.DEAD])
    instance = TaskRun.objects.select_related("run").get(run=new, task="part", map_index=1)
    plan = clearing.plan_task_clear(instance, clearing.ClearScope(downstream=False, past=True))
    assert [(row["run"], row["task"], row["map_index"]) for row in plan.rows] == [(old.pk, "part", 1),
                                                                                    (new.pk, "part", 1)]


@pytest.mark.time_sensitive
def test_clearing_a_failed_instance_reopens_its_map(fan):
    run = mapped_run(fan, 1, [TaskState.SUCCEEDED, TaskState.DEAD])
    cleared = clearing.clear(clearing.plan_run_clear([run.pk], only_failed=True))
    assert len(cleared) == 2
    found = dict(TaskRun.objects.filter(run=run, task="part").values_list("map_index", "state"))
    assert found == {-1: TaskState.MAPPED, 0: TaskState.SUCCEEDED, 1: TaskState.SCHEDULED}
    assert states(run)["join"] == TaskState.WAITING


# --- notes go with their runs ----------------------------------------------------------------------


@pytest.mark.time_sensitive
def test_retention_deletes_a_runs_notes_with_it(chain, clock):
    run = finished_run(chain, 1)
    notes.set_note(run, "kept for a while")
    notes.set_note(run, "slow", task_run=task_run(run, "b"))
    Run.objects.filter(pk=run.pk).update(finished_at=clock.now() - timedelta(days=40))
    report = retention.prune(timedelta(days=30), clock=clock)
    assert report.runs == 1 and not Run.objects.filter(pk=run.pk).exists()
    assert not notes.Note.objects.exists()
