# ruff: noqa: F811 - pytest fixtures imported from tests.support.api_support
"""The retry policy is stated once (orchestrator.retries): every maker of task runs writes the
policy it states, one cap on attempts holds at every door, and the SQL that grants attempts and
computes the backoff is generated from the policy, never spelled out again."""

import ast
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest
from django.db import connection, transaction

from orchestrator import (
    backfill,
    callbacks,
    control,
    executor,
    jobs,
    limits,
    mapping,
    notifier,
    resolver,
    retries,
)
from orchestrator.dsl import Workflow
from orchestrator.models import TaskRun, Trigger
from orchestrator.resolver import Ending
from orchestrator.retries import RetryPolicy
from orchestrator.runs import create_run
from orchestrator.validation import validate
from orchestrator.worker import Worker as WorkerLoop
from tests.support.api_support import api, operator  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

PRODUCT = Path(__file__).resolve().parent.parent / "orchestrator"
FAILS = "tests.support.tasks_for_tests:always_fails"


def retry_values(spec: dict) -> dict:
    return {key: spec[key] for key in retries.SPEC_KEYS.values()}


def noop(ctx):
    return None


def test_every_maker_of_task_runs_writes_the_policy_it_states(settings):
    wf = Workflow("policy")
    wf.task(noop)
    assert retry_values(wf.to_spec()["tasks"]["noop"]) == retries.DEFAULT.spec()

    run, _ = jobs.enqueue("tests.support.tasks_for_tests:add", args=[1])
    spec = run.task_runs.get().spec
    assert retry_values(spec) == retries.DEFAULT.spec()
    run, _ = jobs.enqueue("tests.support.tasks_for_tests:add", args=[2], max_attempts=4,
                          retry=RetryPolicy(delay=1.0, backoff=3.0, max_delay=30.0))
    assert retry_values(run.task_runs.get().spec) == RetryPolicy(4, 1.0, 3.0, 30.0).spec()
    assert run.task_runs.get().max_attempts == 4

    context = {"event": "on_failure", "run_id": 1}
    assert retry_values(callbacks.job_spec("workflows.jobs:noop", context)) == retries.CALLBACKS.spec()

    settings.ORCHESTRATOR_WEBHOOK_RETRY_SECONDS = 7.0
    notifier._enqueue(notifier.WebhookDelivery.objects.create(run=run, url="http://example.invalid/", event="x"))
    delivery = TaskRun.objects.get(task=notifier.DELIVER_REF)
    assert retry_values(delivery.spec) == RetryPolicy(5, 7.0, 2.0, 600.0).spec()
    assert delivery.max_attempts == retries.webhooks().max_attempts == 5


def test_one_cap_on_attempts_holds_for_the_dsl_jobs_and_the_api(api):
    cap = limits.MAX_ATTEMPTS
    wf = Workflow("capped")
    wf.task(noop, retries=cap)
    [error] = validate(wf)
    assert (error.field, error.value) == ("tasks.noop.retries", cap)
    assert f"from 0 to {cap - 1}" in error.message
    wf = Workflow("at_cap")
    wf.task(noop, retries=cap - 1)
    assert validate(wf) == []

    with pytest.raises(jobs.JobError, match=f"max_attempts must be a whole number of at least 1 and at most {cap}"):
        jobs.enqueue("tests.support.tasks_for_tests:add", max_attempts=cap + 1)
    run, _ = jobs.enqueue("tests.support.tasks_for_tests:add", max_attempts=cap)
    assert run.task_runs.get().max_attempts == cap

    refused = api.post("/api/jobs/", {"ref": "tests.support.tasks_for_tests:add", "max_attempts": cap + 1}, format="json")
    assert refused.status_code == 400 and "max_attempts" in refused.json()
    accepted = api.post("/api/jobs/", {"ref": "tests.support.tasks_for_tests:add", "max_attempts": cap}, format="json")
    assert accepted.status_code == 201, accepted.json()
    assert accepted.json()["max_attempts"] == cap


@pytest.mark.parametrize(("extra", "field", "message"), [
    ({"retry_delay": "soon"}, "retry_delay", "must be a number of seconds"),
    ({"retry_backoff": 0.5}, "retry_backoff", "must be a number, 1 or more"),
    ({"retry_max_delay": -5}, "retry_max_delay", "must be a number of seconds"),
    ({"max_attempts": 0}, "max_attempts", "at least 1"),
])
def test_a_jobs_retry_values_are_checked_wherever_they_come_from(extra, field, message):
    # Unchecked, such a value reaches the SQL of the retry rule and fails the worker's whole batch.
    with pytest.raises(jobs.JobError, match=message) as caught:
        jobs.enqueue("tests.support.tasks_for_tests:add", spec_extra=extra)
    assert caught.value.field == field
    assert not TaskRun.objects.exists()


def test_no_statement_spells_the_allowance_or_the_backoff_itself():
    spelled = []
    for path in sorted(PRODUCT.rglob("*.py")):
        if path.name == "retries.py" or "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            texts = [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else []
            if isinstance(node, ast.JoinedStr):
                texts = [part.value for part in node.values if isinstance(part, ast.Constant)]
            if any(re.search(r"->>\s*'(max_attempts|retry_\w+)'", text) for text in texts):
                spelled.append(f"{path.relative_to(PRODUCT)}:{node.lineno}")
    assert spelled == []
    # And the statements that grant a fresh allowance or compute the backoff use the generated SQL.
    for statement in (backfill._RESET_TASK_RUNS, control.RETRY_TASK_RUNS, control.CLEAR_TASK_RUNS, mapping.EXPAND):
        assert retries.allowance_sql() in statement or retries.allowance_sql("t") in statement
    assert retries.delay_sql("t", "t.attempts") in resolver.END_TASK_RUNS


@pytest.mark.parametrize("spec", [
    {}, {"max_attempts": 0}, {"max_attempts": 7}, {"max_attempts": 5000},
])
def test_the_sql_allowance_is_the_python_one(spec):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {retries.allowance_sql('x')} FROM (SELECT %s::jsonb AS spec) x", [json.dumps(spec)])
        assert cursor.fetchone()[0] == retries.allowance(spec)


@pytest.mark.parametrize(("spec", "attempt"), [
    ({}, 1), ({}, 3), ({}, 40),
    ({"retry_delay": 10, "retry_backoff": 3, "retry_max_delay": 20}, 2),
    ({"retry_delay": 0, "retry_backoff": 2, "retry_max_delay": 60}, 5),
    ({"retry_delay": 5, "retry_backoff": 1, "retry_max_delay": 60}, 500),
    ({"retry_delay": 1, "retry_backoff": 2, "retry_max_delay": 900}, 1100),
    ({"retry_delay": 1, "retry_backoff": limits.MAX_INT, "retry_max_delay": 60}, 40),
])
def test_the_sql_backoff_is_the_rule_with_jitter(spec, attempt):
    wait = RetryPolicy.of(spec).wait(attempt)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {retries.delay_sql('x', '%s')} FROM generate_series(1, 50), "
                       "(SELECT %s::jsonb AS spec) x", [attempt, json.dumps(spec)])
        delays = [row[0] for row in cursor.fetchall()]
    assert all(wait * retries.JITTER_LOW - 1e-9 <= delay <= wait + 1e-9 for delay in delays), (wait, delays)
    policy = RetryPolicy.of(spec)  # the rule, in exact arithmetic
    exact = min(Fraction(policy.max_delay), Fraction(policy.delay) * Fraction(policy.backoff) ** (attempt - 1))
    assert wait == pytest.approx(float(exact), rel=1e-9)


def test_a_task_run_with_a_long_history_still_backs_off_instead_of_failing_its_batch(clock):
    # Clears and retries add up: 1,100 attempts made, 100 more allowed. The backoff of such an
    # attempt once overflowed a float8 in SQL, failing the worker's batch at every try.
    spec = {"kind": "python", "ref": FAILS, "upstream": [],
            **RetryPolicy(max_attempts=3, delay=1.0, backoff=2.0, max_delay=900.0).spec()}
    run, _ = create_run(None, trigger=Trigger.JOB, tasks={"a": spec}, now=clock.now())
    TaskRun.objects.filter(run=run).update(attempts=1099, max_attempts=1200)
    loop = WorkerLoop(["default"], concurrency=1)
    loop.register()
    [message] = loop.claim(1, clock.now())
    assert message["number"] == 1100
    with transaction.atomic():
        resolver.end_attempts([Ending(*executor.run(message))], worker_id=loop.id, now=clock.now())
    task_run = TaskRun.objects.get(run=run)
    assert task_run.state == "scheduled"
    assert 450 <= (task_run.due_at - clock.now()).total_seconds() <= 900
