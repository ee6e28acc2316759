"""Conformance of the django.tasks backend with what Django 6.1 and django-tasks-db expect of a
backend, run against a live dispatcher and worker: results and their states, times, errors and
workers; the three signals; arguments JSON cannot hold; .using() options; queues, priorities and
run_after; transactions; one consistent snapshot per get_result(). The task functions are in
tests/support/conformance_tasks.py, which the workers import."""

import asyncio
import json
import math
import pickle
import signal
import threading
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections, transaction
from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued
from django.test import override_settings

from orchestrator import clock
from orchestrator.models import Run, TaskRun, Worker
from orchestrator.runs import create_run
from orchestrator.tasks_backend import OrchestratorBackend
from tests.conftest import process_env, wait_for
from tests.support import conformance_tasks as t

FAST = {"ORCHESTRATOR_HEARTBEAT_SECONDS": "0.5", "ORCHESTRATOR_POLL_SECONDS": "0.2"}
BACKEND = "orchestrator.tasks_backend.OrchestratorBackend"


def live_env(tmp_path, **extra):
    return process_env(ORCHESTRATOR_DATA_DIR=str(tmp_path / "data"), **FAST,
                       ORCHESTRATOR_JOB_MODULES="workflows.jobs,tests.support.conformance_tasks",
                       CONFORMANCE_SIGNALS=str(tmp_path / "signals.jsonl"), **extra)


def start_services(processes, env, queues="default", concurrency=4, name="worker"):
    processes.start("dispatcher", env=env)
    return processes.start("worker", "--queues", queues, "--concurrency", str(concurrency), env=env, name=name)


def finished(result):
    current = default_task_backend.get_result(result.id)
    return current if current.is_finished else None


def wait_finished(result, timeout=60):
    return wait_for(lambda: finished(result), timeout, message=f"task result {result.id} to finish")


def signals_of(tmp_path) -> list[dict]:
    path = tmp_path / "signals.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Received:
    """Signals received in this process."""

    def __init__(self, signal_):
        self.signal, self.calls = signal_, []

    def __enter__(self):
        self.signal.connect(self.receive, dispatch_uid=id(self))
        return self.calls

    def __exit__(self, *exc):
        self.signal.disconnect(dispatch_uid=id(self))

    def receive(self, sender, task_result, **kwargs):
        self.calls.append((sender, task_result))


# --- the backend and enqueue -----------------------------------------------------------------------


def test_the_backend_declares_what_it_supports_and_passes_its_checks():
    backend = task_backends["default"]
    assert isinstance(backend, OrchestratorBackend) and default_task_backend == backend
    assert backend.alias == "default" and backend.options == {}
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)
    assert list(backend.check()) == []


@pytest.mark.django_db
@pytest.mark.parametrize("the_task", [t.noop, t.noop_async], ids=["sync", "async"])
def test_enqueue_answers_the_result_as_of_the_enqueue(the_task):
    with Received(task_enqueued) as received:
        result = the_task.enqueue(1, two=3)
    assert result.status == TaskResultStatus.READY and result.is_finished is False
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None, None, None)
    assert result.enqueued_at is not None and result.enqueued_at <= clock.now()
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == the_task and result.args == [1] and result.kwargs == {"two": 3}
    assert result.attempts == 0 and result.worker_ids == [] and result.errors == []
    assert result.backend == "default" and isinstance(result.id, str)
    # task_enqueued: the backend's class as sender and the result enqueue() returned.
    assert received == [(OrchestratorBackend, result)]


@pytest.mark.django_db(transaction=True)
def test_aenqueue_and_aget_result_work_from_async_code():
    async def scenario():
        result = await t.noop.aenqueue()
        again = await t.noop.aget_result(result.id)
        with pytest.raises(TaskResultDoesNotExist):
            await default_task_backend.aget_result("999999999")
        return result, again

    result, again = asyncio.run(scenario())
    assert result.status == TaskResultStatus.READY and again == result


@pytest.mark.django_db
def test_enqueue_is_logged_with_the_result_id(caplog):
    with caplog.at_level("DEBUG", logger="django.tasks"):
        result = t.noop.enqueue()
    [record] = [r for r in caplog.records if r.name == "django.tasks"]
    assert "enqueued" in record.getMessage() and result.id in record.getMessage()


@pytest.mark.django_db
def test_get_result_right_after_enqueue_equals_what_enqueue_answered():
    result = t.noop.enqueue()
    assert default_task_backend.get_result(result.id) == result
    assert t.noop.get_result(result.id) == result
    # get_result through another task is refused, as Django's Task.get_result does.
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        t.noop_async.get_result(result.id)


@pytest.mark.django_db
def test_the_options_of_using_come_back_in_get_result():
    when = clock.now() + timedelta(hours=3)
    chosen = t.noop.using(priority=-7, queue_name="nightly", run_after=when)
    result = chosen.enqueue("x")
    back = default_task_backend.get_result(result.id)
    assert back.task == chosen and back.task is not t.noop
    assert (back.task.priority, back.task.queue_name, back.task.run_after) == (-7, "nightly", when)
    assert back == result
    stored = TaskRun.objects.get(pk=result.id)
    assert (stored.queue, stored.priority, stored.due_at) == ("nightly", -7, when)


@pytest.mark.django_db
def test_a_result_pickles_and_compares_equal():
    result = t.echo.enqueue([1, 2], key="value")
    assert pickle.loads(pickle.dumps(result)) == result


@pytest.mark.django_db
@pytest.mark.parametrize("result_id", ["999999999", "123", "abc", "", "-1", "1" * 30, "0",
                                       "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"])
def test_an_unknown_or_malformed_id_is_task_result_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        t.noop.get_result(result_id)


@pytest.mark.django_db
def test_the_id_of_a_workflow_task_run_is_not_a_task_result():
    run, _ = create_run(None, trigger="manual", tasks={"a": {"kind": "python", "ref": "workflows.jobs:noop"}})
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(run.task_runs.get().pk))


# --- arguments --------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "kwargs", "error", "message"), [
    ([datetime(2026, 1, 1)], {}, TypeError, "Unsupported type"),
    ([object()], {}, TypeError, "Unsupported type"),
    ([], {"when": {1, 2}}, TypeError, "Unsupported type"),
    ([b"\xff\xfe"], {}, ValueError, "Unsupported value"),
    ([math.nan], {}, ValueError, "Unsupported value: nan"),
    ([], {"limit": math.inf}, ValueError, "Unsupported value: inf"),
    ([[1, {"deep": -math.inf}]], {}, ValueError, "Unsupported value: -inf"),
])
def test_arguments_json_cannot_hold_are_refused_before_anything_is_written(args, kwargs, error, message):
    with transaction.atomic():
        with pytest.raises(error, match=message):
            t.noop.enqueue(*args, **kwargs)
        # The caller's transaction is still usable: nothing reached the database.
        assert not Run.objects.exists()


@pytest.mark.django_db
def test_arguments_are_normalized_to_json_as_django_does():
    result = t.echo.enqueue((1, 2), "utf-8 bytes ✓".encode(), nested={"t": (3,)})
    assert result.args == [[1, 2], "utf-8 bytes ✓"] and result.kwargs == {"nested": {"t": [3]}}
    assert default_task_backend.get_result(result.id).args == result.args


# --- what the backend validates ---------------------------------------------------------------------


def test_tasks_are_validated_as_django_validates_them():
    with pytest.raises(InvalidTask, match="Task function must be defined at a module level."):
        task()(lambda: None)
    with pytest.raises(InvalidTask, match="Task takes context but does not have a first argument of 'context'."):
        task(takes_context=True)(t.meaning_of_life.func)
    for bad in (-101, 101, 3.1):
        with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100."):
            t.noop.using(priority=bad)
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime."):
        t.noop.using(run_after=datetime(2030, 1, 1))
    assert t.noop.using(priority=100).priority == 100 and t.noop.using(priority=-100).priority == -100


def test_any_queue_name_is_accepted_unless_queues_are_listed():
    assert t.noop.using(queue_name="reports-eu.1").queue_name == "reports-eu.1"
    assert t.noop.queue_name == DEFAULT_TASK_QUEUE_NAME
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["default", "mail"]}}):
        assert t.noop.using(queue_name="mail").queue_name == "mail"
        with pytest.raises(InvalidTask, match="Queue 'other' is not valid for backend."):
            t.noop.using(queue_name="other")


@pytest.mark.django_db
def test_a_task_validated_under_other_queues_is_checked_again_at_enqueue():
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["unknown_queue"]}}):
        elsewhere = t.noop.using(queue_name="unknown_queue")
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}):
        with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
            elsewhere.enqueue()
        with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
            asyncio.run(elsewhere.aenqueue())
    assert not Run.objects.exists()


# --- transactions -----------------------------------------------------------------------------------


def jobs_seen_by_another_connection() -> int:
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM orchestrator_run WHERE trigger = 'job'")
            return cursor.fetchone()[0]
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_enqueue_joins_the_callers_transaction():
    with transaction.atomic():
        result = t.noop.enqueue()
        assert result.enqueued_at is not None
        assert Run.objects.count() == 1 and jobs_seen_by_another_connection() == 0
    assert jobs_seen_by_another_connection() == 1
    with pytest.raises(RuntimeError), transaction.atomic():
        t.noop.enqueue()
        raise RuntimeError("rolled back")
    assert jobs_seen_by_another_connection() == 1


# --- on a live worker --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_live_worker_reports_results_errors_and_signals_as_django_defines_them(processes, tmp_path):
    env = live_env(tmp_path)
    cases = {
        "noop": t.noop.enqueue(1, two=3),
        "noop_async": t.noop_async.enqueue(),
        "meaning": t.meaning_of_life.enqueue(),
        "value_error": t.raises_value_error.enqueue(),
        "nested": t.raises_nested.enqueue(),
        "multiline": t.raises_multiline.enqueue(),
        "constraint": t.violates_a_constraint.enqueue(),
        "system_exit": t.raises_system_exit.enqueue(),
        "keyboard_interrupt": t.raises_keyboard_interrupt.enqueue(),
        "exit": t.calls_exit.enqueue(),
        "not_json": t.returns_a_function.enqueue(),
        "nan": t.returns_nan.enqueue(),
        "context": t.about_itself.enqueue(),
    }
    worker = start_services(processes, env)
    done = {name: wait_finished(result) for name, result in cases.items()}
    worker_name = Worker.objects.get(pid=worker.pid).name

    for name, result in done.items():
        assert result.is_finished and result.attempts == 1 and result.worker_ids == [worker_name], name
        assert result.enqueued_at <= result.started_at <= result.finished_at, name
        assert result.last_attempted_at == result.started_at, name
        assert result.task == cases[name].task and result.args == cases[name].args, name

    assert done["noop"].status == TaskResultStatus.SUCCESSFUL and done["noop"].return_value is None
    assert done["noop_async"].status == TaskResultStatus.SUCCESSFUL
    assert done["meaning"].return_value == 42 and done["meaning"].errors == []
    context = done["context"].return_value
    assert context == {"id": cases["context"].id, "attempt": 1, "status": "RUNNING", "workers": [worker_name],
                       "started": True}

    def only_error(name) -> TaskError:
        result = done[name]
        assert result.status == TaskResultStatus.FAILED, name
        with pytest.raises(ValueError, match="Task failed"):
            result.return_value  # noqa: B018
        [error] = result.errors
        return error

    error = only_error("value_error")
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: This task failed due to ValueError\n"), error.traceback
    assert only_error("nested").exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in only_error("nested").traceback
    # The class comes from the exception object, not from the text of its message.
    multiline = only_error("multiline")
    assert multiline.exception_class is t.ShopError
    assert multiline.exception_class_path == "tests.support.conformance_tasks.ShopError"
    assert multiline.traceback.endswith("DETAIL: not a class name\n")
    from django.db import IntegrityError

    constraint = only_error("constraint")
    assert constraint.exception_class is IntegrityError and "DETAIL:" in constraint.traceback
    assert only_error("system_exit").exception_class is SystemExit
    assert only_error("keyboard_interrupt").exception_class is KeyboardInterrupt
    assert only_error("exit").exception_class is SystemExit
    # Failures the product detects carry the exception behind them, with its traceback.
    not_json = only_error("not_json")
    assert not_json.exception_class is TypeError and "is not JSON serializable" in not_json.traceback
    nan = only_error("nan")
    assert nan.exception_class is ValueError and "Out of range float values are not JSON compliant" in nan.traceback

    # refresh() brings the enqueue() result up to date, in place; arefresh() too.
    original = cases["meaning"]
    assert original.status == TaskResultStatus.READY
    original.refresh()
    assert original.status == TaskResultStatus.SUCCESSFUL and original.return_value == 42
    assert original.attempts == 1 and original.finished_at is not None
    stale = cases["value_error"]
    asyncio.run(stale.arefresh())
    assert stale.status == TaskResultStatus.FAILED and stale.errors[0].exception_class is ValueError

    # The worker survived every failure (SystemExit, KeyboardInterrupt, exit()) and runs more.
    assert worker.poll() is None
    assert wait_finished(t.meaning_of_life.enqueue()).return_value == 42

    # task_started and task_finished, sent in the process that ran the task, with the backend's
    # class as sender: started RUNNING with this worker, finished SUCCESSFUL or FAILED (then while
    # the exception is handled, so Django's logger records its traceback).
    sent = signals_of(tmp_path)
    backend = "orchestrator.tasks_backend.OrchestratorBackend"
    for name, result in cases.items():
        mine = [s for s in sent if s["id"] == result.id]
        assert [s["signal"] for s in mine] == ["started", "finished"], (name, mine)
        started, ended = mine
        assert started["sender"] == ended["sender"] == backend
        assert started["status"] == "RUNNING" and started["workers"] == [worker_name]
        assert started["started_at"] is not None and started["finished_at"] is None
        assert started["pid"] == ended["pid"] != worker.pid  # the worker's child, not the worker
        if done[name].status == TaskResultStatus.SUCCESSFUL:
            assert ended["status"] == "SUCCESSFUL" and ended["errors"] == [] and ended["handling"] is None
        else:
            assert ended["status"] == "FAILED" and ended["errors"] == [done[name].errors[0].exception_class_path]
            assert ended["handling"] is not None, name
        assert ended["finished_at"] is not None
    # Django's own receivers log each start and end into the attempt's log.
    from orchestrator import logs
    from orchestrator.models import Attempt

    attempt = Attempt.objects.get(task_run_id=cases["value_error"].id)
    with override_settings(ORCHESTRATOR_DATA_DIR=tmp_path / "data"):  # where the worker wrote it
        text = logs.read(attempt)[0]
    assert f"Task id={cases['value_error'].id} path=tests.support.conformance_tasks.raises_value_error state=RUNNING" in text
    assert "state=FAILED" in text and "ValueError: This task failed due to ValueError" in text


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_serves_its_queues_by_name_and_any_name_works(processes, tmp_path):
    env = live_env(tmp_path)
    mail = t.echo.using(queue_name="mail.eu-1").enqueue("to mail")
    default = t.echo.enqueue("to default")
    start_services(processes, env, queues="default")
    assert wait_finished(default).return_value == {"args": ["to default"], "kwargs": {}}
    assert default_task_backend.get_result(mail.id).status == TaskResultStatus.READY
    processes.start("worker", "--queues", "mail.eu-1", "--concurrency", "1", env=env, name="mail-worker")
    assert wait_finished(mail).return_value == {"args": ["to mail"], "kwargs": {}}
    assert wait_finished(mail).task.queue_name == "mail.eu-1"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_after_holds_a_task_back_and_priority_orders_the_rest(processes, tmp_path):
    env = live_env(tmp_path)
    marker = tmp_path / "order.txt"
    now = clock.now()
    later = t.ready_marker.using(run_after=now + timedelta(hours=10)).enqueue(str(marker))
    low = t.echo.using(priority=-2).enqueue("low")
    high = t.echo.using(priority=20).enqueue("high")
    old_and_high = t.echo.using(priority=20, run_after=now - timedelta(hours=2)).enqueue("old high")
    middle = t.echo.using(priority=2).enqueue("middle")
    start_services(processes, env, concurrency=1)
    results = [wait_finished(r) for r in (old_and_high, high, middle, low)]
    # One child runs them one after the other, higher priority first: the order it sent
    # task_started in. started_at is when a claim took the task, and a claim may take the next
    # task too while the child runs one (a local queue): two taken together share it.
    started = [s["id"] for s in signals_of(tmp_path) if s["signal"] == "started"]
    assert set(started[:2]) == {old_and_high.id, high.id} and started[2:] == [middle.id, low.id]
    assert max(results[0].started_at, results[1].started_at) <= results[2].started_at <= results[3].started_at
    current = default_task_backend.get_result(later.id)
    assert current.status == TaskResultStatus.READY and current.task.run_after == now + timedelta(hours=10)
    assert not marker.exists()
    # Once due, it runs.
    TaskRun.objects.filter(pk=later.id).update(due_at=clock.now())
    assert wait_finished(later).status == TaskResultStatus.SUCCESSFUL and marker.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_locked_row_is_skipped_and_the_others_run(processes, tmp_path):
    env = live_env(tmp_path)
    first = t.noop.enqueue()
    locker = connections.create_connection("default")
    try:
        with locker.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT id FROM orchestrator_taskrun WHERE id = %s FOR UPDATE", [int(first.id)])
        second = t.noop.enqueue()
        start_services(processes, env)
        assert wait_finished(second).status == TaskResultStatus.SUCCESSFUL
        assert default_task_backend.get_result(first.id).status == TaskResultStatus.READY
    finally:
        locker.close()  # ends the transaction: the row is free
    assert wait_finished(first).status == TaskResultStatus.SUCCESSFUL


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_workers_run_each_task_once(processes, tmp_path):
    from orchestrator.models import Worker

    env = live_env(tmp_path)
    start_services(processes, env, concurrency=3)
    processes.start("worker", "--queues", "default", "--concurrency", "3", env=env, name="second-worker")
    # Both listen before the work arrives: a worker started later could find it all done already.
    wait_for(lambda: Worker.objects.filter(state="running").count() == 2, 60, message="both workers to start")
    results = [t.echo.enqueue(i) for i in range(40)]
    done = [wait_finished(r) for r in results]
    assert [r.return_value["args"] for r in done] == [[i] for i in range(40)]
    assert all(r.attempts == 1 for r in done)
    assert len({r.worker_ids[0] for r in done}) == 2, "both workers took part"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_attempts_that_end_without_an_exception_say_why_in_their_class(processes, tmp_path, settings):
    """A task killed for its timeout fails with TimeoutError; one whose worker died stays RUNNING
    until the reaper declares it lost, then fails with AttemptLost (one attempt allowed)."""
    from orchestrator import reaper

    env = live_env(tmp_path)
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": {"timeout": 1}}}):
        too_slow = t.sleep_for.enqueue(60)
    result = t.sleep_for.using(priority=-1).enqueue(60)
    worker = start_services(processes, env, concurrency=1)
    timed_out = wait_finished(too_slow)
    assert timed_out.status == TaskResultStatus.FAILED and timed_out.errors[0].exception_class is TimeoutError
    assert "timed out after 1s" in timed_out.errors[0].traceback

    running = wait_for(lambda: (r := default_task_backend.get_result(result.id)).status == TaskResultStatus.RUNNING
                       and r, 60, message="the second task to start")
    assert running.started_at is not None and running.finished_at is None and len(running.worker_ids) == 1
    processes.stop(worker, signal.SIGKILL)
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.RUNNING
    settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS = 0.1
    wait_for(lambda: reaper.reap_once(), 30, message="the reaper to end the attempt")
    failed = default_task_backend.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.finished_at is not None
    assert failed.errors[0].exception_class_path == "orchestrator.executor.AttemptLost"
    assert "heartbeat" in failed.errors[0].traceback


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_result_is_one_consistent_snapshot_under_load(processes, tmp_path):
    """enqueue() never answers a later state, and get_result() never mixes two moments: READY
    has no start and no worker, RUNNING has a start and one worker and no end, SUCCESSFUL has all."""
    env = live_env(tmp_path)
    start_services(processes, env, concurrency=4)
    results, seen, stop = [], [], threading.Event()

    def poll():
        try:
            while not stop.is_set():
                for result in list(results[-20:]):
                    seen.append(default_task_backend.get_result(result.id))
        finally:
            connection.close()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for _ in range(300):
            result = t.noop.enqueue()
            assert result.status == TaskResultStatus.READY and result.worker_ids == [] and result.started_at is None
            results.append(result)
        for result in results:
            seen.append(wait_finished(result))
    finally:
        stop.set()
        poller.join(60)
    assert len(seen) > 300
    for snapshot in seen:
        if snapshot.status == TaskResultStatus.READY:
            assert snapshot.started_at is None and snapshot.worker_ids == [] and snapshot.finished_at is None
        elif snapshot.status == TaskResultStatus.RUNNING:
            assert snapshot.started_at is not None and len(snapshot.worker_ids) == 1 and snapshot.finished_at is None
        else:
            assert snapshot.status == TaskResultStatus.SUCCESSFUL, snapshot
            assert snapshot.started_at and snapshot.finished_at and len(snapshot.worker_ids) == 1
