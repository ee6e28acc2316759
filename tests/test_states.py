"""The state table of orchestrator.states is the only one: the models, the DSL and the resolver take
their names from it, and no statement of the product names a state or makes a transition it does
not list (read from the source and the formatted SQL here; enforced at run time by the trigger
that conftest installs in the test database for the whole suite)."""

from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction

from orchestrator import dsl, release, runs, states
from orchestrator.models import Attempt, Run, Schedule, TaskRun, Worker
from tests.support import state_check


def test_no_statement_of_the_product_names_a_state_or_a_transition_the_table_does_not_allow():
    problems = state_check.all_problems()
    assert not problems, "\n".join(str(p) for p in problems)
    # The check read the statements that matter (and so would have seen a bad one).
    read = {where for where, _ in state_check.module_statements()}
    assert {"orchestrator.resolver.END_TASK_RUNS", "orchestrator.dispatcher.MARK_QUEUED",
            "orchestrator.worker.batch.CLAIM", "orchestrator.control.CANCEL_TASK_RUNS"} <= read


def test_the_check_reads_each_transition_a_statement_makes():
    made = {
        where.rsplit(".", 1)[1]: (machine.table, sorted(sources or []), sorted(targets))
        for where, text in state_check.module_statements()
        for machine, sources, targets in state_check.transitions_of(text)
    }
    assert made["MARK_QUEUED"] == ("orchestrator_taskrun", ["scheduled"], ["queued"])
    assert made["RELEASE_CHILDREN"] == ("orchestrator_taskrun", ["waiting"], ["scheduled", "skipped", "upstream_failed"])
    assert made["FINISH_RUNS"] == ("orchestrator_run", ["running"], ["failed", "succeeded"])
    assert made["CANCEL_TASK_RUNS"][2] == ["cancelled"]
    assert made["CANCEL_TASK_RUNS"][1] == sorted(states.ACTIVE_TASK_STATES)


@pytest.mark.parametrize(("sql", "complaint"), [
    # A transition the table does not list.
    ("UPDATE orchestrator_taskrun SET state = 'queued' WHERE id = %s AND state = 'waiting'",
     "waiting -> queued is not in the state table"),
    # No guard: the update would take a row from any state.
    ("UPDATE orchestrator_run SET state = 'succeeded' WHERE id = %s", "the update has no state guard"),
    # A name that is no state of the table.
    ("SELECT id FROM orchestrator_taskrun WHERE state = 'finished'", "'finished' is compared with state"),
    ("UPDATE orchestrator_attempt SET outcome = 'dead' WHERE outcome = 'running'", "'dead' is not a outcome"),
    # A row that starts in a state no row may start in.
    ("INSERT INTO orchestrator_taskrun (run_id, task, state) VALUES (%s, %s, 'running')",
     "a row cannot start in 'running'"),
    # A CASE computed in a CTE and then set.
    ("WITH d AS (SELECT id, CASE WHEN x THEN 'running' END AS next FROM orchestrator_taskrun) "
     "UPDATE orchestrator_taskrun t SET state = d.next FROM d WHERE t.id = d.id AND t.state = 'waiting'",
     "waiting -> running is not in the state table"),
])
def test_the_check_finds_a_bad_statement(sql, complaint):
    problems = [str(p) for p in state_check.statement_problems("example", sql)]
    assert any(complaint in p for p in problems), problems


@pytest.mark.parametrize(("source", "complaint"), [
    ('cursor.execute("UPDATE orchestrator_run SET reason = %s WHERE state = \'failed\'")',
     "SQL names the state 'failed' itself"),
    ("Run.objects.filter(pk=1, state=RunState.RUNNING).update(state=RunState.PENDING)",
     "running -> pending is not in the state table"),
    ("TaskRun.objects.filter(pk=1).update(state=TaskState.QUEUED)", "the update has no state guard"),
    ('TaskRun.objects.filter(state="dead").update(state=TaskState.SCHEDULED)', "state= names a state itself"),
    ("Run.objects.filter(pk=1, state__in=mine).update(state=RunState.RUNNING)", "cannot be told from the source"),
    # Trigger and lane names are held to the rule of states.
    ('cursor.execute("SELECT id FROM orchestrator_run WHERE trigger = \'backfill\'")',
     "SQL names the trigger 'backfill' itself"),
    ('SQL = "SELECT 1 FROM orchestrator_run r WHERE r.trigger IN (\'schedule\', \'job\') AND r.lane = 0"',
     "SQL names the trigger 'job' itself"),
    ('SQL = "SELECT 1 FROM orchestrator_taskrun WHERE lane = 1"', "SQL names the lane 1 itself"),
    ('trigger_workflow(wf, {}, trigger="manual")', "trigger 'manual' is written out"),
    ('Run.objects.filter(trigger__in=["api", "job"])', "trigger 'api' is written out"),
    ("Run.objects.filter(lane=1)", "lane 1 is written out"),
    ('def start(workflow, trigger: str = "api"): pass', "trigger 'api' is written out"),
    ('if run.trigger != "backfill": pass', "trigger 'backfill' is written out"),
    ("if task_run.lane == 0: pass", "lane 0 is written out"),
    # States come from one module.
    ("from orchestrator.models import Run, RunState", "RunState is imported from orchestrator.models"),
    ("from orchestrator.models import Trigger", "Trigger is imported from orchestrator.models"),
])
def test_the_check_finds_a_bad_line_of_source(source, complaint):
    problems = [str(p) for p in state_check.source_problems(Path("example.py"), source)]
    assert any(complaint in p for p in problems), problems


def test_the_models_the_dsl_and_the_resolver_take_their_names_from_the_state_module():
    assert Run._meta.get_field("state").choices == states.RunState.choices
    assert TaskRun._meta.get_field("state").choices == states.TaskState.choices
    assert Attempt._meta.get_field("outcome").choices == states.AttemptOutcome.choices
    assert Worker._meta.get_field("state").choices == states.WorkerState.choices
    assert Schedule._meta.get_field("overlap").choices == states.Overlap.choices
    assert Schedule._meta.get_field("catchup").choices == states.Catchup.choices
    assert dsl.TRIGGER_RULES == tuple(states.TriggerRule.values)
    assert dsl.OVERLAP_POLICIES == tuple(states.Overlap.values)
    assert dsl.CATCHUP_POLICIES == tuple(states.Catchup.values)
    # Every rule has its decisions, and the resolver's CASE has a branch for each.
    assert set(states.TRIGGER_RULE_DECISIONS) == set(states.TriggerRule.values)
    for rule in states.TriggerRule.values:
        if rule != states.DEFAULT_TRIGGER_RULE:
            assert f"WHEN '{rule}' THEN" in release.RELEASE_CHILDREN
    assert f"-- {states.DEFAULT_TRIGGER_RULE}" in release.RELEASE_CHILDREN


@pytest.mark.django_db
def test_the_test_database_rejects_a_transition_outside_the_table_whoever_makes_it():
    run, _ = runs.create_run(None, trigger="job", tasks={"t": {"kind": "python", "ref": "a:b"}})
    task_run = TaskRun.objects.get(run=run)
    assert task_run.state == states.TaskState.SCHEDULED
    # Straight from a product-like statement (not the tests' own set-up): scheduled -> dead skips
    # the attempts, which the table does not allow.
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal state change of orchestrator_taskrun: scheduled -> dead"):
        with transaction.atomic(), connection.connection.cursor() as cursor:
            cursor.execute("UPDATE orchestrator_taskrun SET state = 'dead' WHERE id = %s", [task_run.pk])
    # A transition the table lists goes through.
    with transaction.atomic(), connection.connection.cursor() as cursor:
        cursor.execute("UPDATE orchestrator_taskrun SET state = 'queued' WHERE id = %s", [task_run.pk])
    task_run.refresh_from_db()
    assert task_run.state == states.TaskState.QUEUED
