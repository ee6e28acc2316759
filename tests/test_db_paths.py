"""The rule of orchestrator/db.py: the statements every turn of the throughput loops runs (a
worker's batch, a dispatcher's tick) are declared prepared and run with db.execute; every other
statement runs on Django's cursor. Each path refuses the other's statements."""

import ast
import importlib
from pathlib import Path

import pytest
from django.db import connection

from orchestrator import db, dispatcher, executor
from orchestrator.due import load_limits
from orchestrator.models import QueueLimit, TaskRun
from orchestrator.resolver import Ending
from orchestrator.runs import create_run
from orchestrator.states import TaskState, Trigger
from tests.support.features_support import worker_loop
from tests.support.state_check import module_name, product_files

pytestmark = pytest.mark.django_db


def job(queue="default"):
    return {"tests.support.tasks_for_tests:add": {"kind": "python", "ref": "tests.support.tasks_for_tests:add", "call": "job",
                                          "args": [1, 2], "kwargs": {}, "queue": queue}}


class DjangosCursor:
    """The statements that go through Django's cursor, but the wake-ups (channels.py's NOTIFYs:
    one per transaction at most, a statement with no plan to keep) and the savepoints of the test's
    own transaction."""

    def __init__(self):
        self.statements = []

    def __call__(self, execute, sql, params, many, context):
        if "pg_notify" not in sql and not sql.startswith(("SAVEPOINT", "RELEASE SAVEPOINT")):
            self.statements.append(sql)
        return execute(sql, params, many, context)


def test_execute_runs_only_declared_statements():
    with db.cursor() as cursor:
        with pytest.raises(TypeError, match="declared with db.prepared"):
            db.execute(cursor, "SELECT 1")
        db.execute(cursor, db.prepared("SELECT %(one)s::int"), {"one": 1})
        assert cursor.fetchone() == (1,)


def test_no_declared_statement_is_run_on_djangos_cursor():
    found = []
    for path in product_files():
        module = importlib.import_module(module_name(path))
        declared = {name for name, value in vars(module).items() if isinstance(value, db.Prepared)}
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("execute", "executemany")
                    and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "db")
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in declared):
                found.append(f"{path.relative_to(Path(__file__).resolve().parent.parent)}:{node.lineno}")
    assert found == []
    # What is declared: the statements of the worker's batch and of the dispatcher's tick.
    assert isinstance(dispatcher.CANDIDATES, db.Prepared) and isinstance(dispatcher.BUSY_QUEUES, db.Prepared)


def test_a_workers_batch_and_a_dispatchers_tick_send_nothing_through_djangos_cursor(clock):
    QueueLimit.objects.create(queue="limited", max_running=5)
    for _ in range(3):
        create_run(None, trigger=Trigger.JOB, tasks=job(), now=clock.now())
        create_run(None, trigger=Trigger.JOB, tasks=job("limited"), now=clock.now())
    loop = worker_loop()
    loop.batch.current_limits()  # read once per poll interval, not per batch
    limits = load_limits()
    recorded = DjangosCursor()
    with connection.execute_wrapper(recorded):
        # A dispatcher's tick that admits work under a limit.
        assert dispatcher.tick(now=clock.now(), limits=limits) == 3
        # A worker's batch that claims, then one that records the outcomes and claims again.
        claimed = loop.batch.flush(claim=2)
        for message in claimed:
            # As the worker records a job's outcome (worker.role).
            loop.batch.add(Ending(*executor.run(message), job=True, run_id=message["run_id"]))
        claimed += loop.batch.flush(claim=2)
    assert len(claimed) == 3
    assert TaskRun.objects.filter(state=TaskState.SUCCEEDED).count() == 2
    assert recorded.statements == [], "\n".join(recorded.statements)
