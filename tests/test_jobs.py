"""One-off and delayed jobs: a run of one task by reference, validated input, and idempotency
keys decided by the database even under concurrent requests."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from orchestrator.jobs import JobError, enqueue
from orchestrator.models import Run, RunState, TaskRun, TaskState
from orchestrator.runs import IdempotencyConflict

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
REF = "workflows.jobs:send_welcome_email"


def test_a_delayed_job_is_a_run_of_one_task_due_at_run_after():
    later = NOW + timedelta(minutes=10)
    run, created = enqueue(REF, args=[42], kwargs={"template": "vip"}, run_after=later, queue="batch",
                           priority=5, max_attempts=3, timeout=30, tenant="acme",
                           spec_extra={"retry_delay": 1}, now=NOW)
    assert created is True
    assert (run.trigger, run.workflow, run.state, run.logical_date) == ("job", None, RunState.RUNNING, later)
    [task] = TaskRun.objects.filter(run=run)
    assert task.task == REF
    assert (task.state, task.due_at, task.queue, task.priority, task.max_attempts, task.timeout, task.tenant) == (
        TaskState.SCHEDULED, later, "batch", 5, 3, 30, "acme")
    assert task.spec == {
        "kind": "python", "ref": REF, "call": "job", "args": [42], "kwargs": {"template": "vip"}, "timeout": 30,
        "retry_delay": 1, "retry_backoff": 2.0, "retry_max_delay": 3600.0, "upstream": [], "queue": "batch",
        "max_attempts": 3,
    }


def test_spec_extra_adds_to_a_jobs_spec_but_never_replaces_what_enqueue_checked():
    run, _ = enqueue(REF, args=[1], queue="batch", now=NOW, spec_extra={
        "ref": "os:system", "call": "workflow", "args": ["rm -rf /"], "queue": "default", "note": "kept"})
    spec = run.task_runs.get().spec
    assert (spec["ref"], spec["call"], spec["args"], spec["queue"], spec["note"]) == (REF, "job", [1], "batch", "kept")
    assert run.task_runs.get().queue == "batch"


def test_a_job_without_run_after_is_due_now():
    run, _ = enqueue("workflows.jobs:noop", now=NOW)
    assert run.task_runs.get().due_at == NOW


@pytest.mark.parametrize(("call", "field", "message"), [
    (dict(ref="workflows.jobs.noop"), "ref", "must look like 'package.module:function'"),
    (dict(ref="workflows.nothing_here:run"), "ref", "unknown job 'workflows.nothing_here:run'"),
    (dict(ref="workflows.jobs:missing"), "ref", "unknown job 'workflows.jobs:missing'"),
    (dict(ref="workflows.jobs:log"), "ref", "unknown job 'workflows.jobs:log'"),
    (dict(run_after=datetime(2026, 3, 2, 10, 0)), "run_after", "must be timezone-aware"),
    (dict(priority=101), "priority", "from -100 to 100"),
    (dict(priority=True), "priority", "from -100 to 100"),
    (dict(max_attempts=0), "max_attempts", "at least 1"),
    (dict(queue="no spaces"), "queue", "queue must be"),
    (dict(timeout=-1), "timeout", "positive number"),
    (dict(args="abc"), "args", "list or tuple"),
    (dict(args=[object()]), "args", "JSON-serialisable"),
    (dict(kwargs={1: "x"}), "kwargs", "string keys"),
    (dict(idempotency_key=""), "idempotency_key", "non-empty"),
])
def test_bad_input_is_refused_with_the_field_named_and_nothing_written(call, field, message):
    options = {"ref": "workflows.jobs:noop", **call}
    with pytest.raises(JobError) as caught:
        enqueue(options.pop("ref"), now=NOW, **options)
    assert caught.value.field == field
    assert message in str(caught.value)
    assert Run.objects.count() == 0 and TaskRun.objects.count() == 0


def test_the_same_key_and_payload_returns_the_existing_job():
    first, created = enqueue(REF, kwargs={"user_id": 1}, idempotency_key="welcome-1", now=NOW)
    # A client retrying a little later computes a new run_after: still the same job.
    again, created_again = enqueue(REF, kwargs={"user_id": 1}, idempotency_key="welcome-1",
                                   run_after=NOW + timedelta(minutes=1), now=NOW + timedelta(seconds=5))
    assert (created, created_again) == (True, False)
    assert again.pk == first.pk
    assert Run.objects.count() == 1 and TaskRun.objects.count() == 1


def test_the_same_key_with_a_different_payload_is_refused():
    first, _ = enqueue(REF, kwargs={"user_id": 1}, idempotency_key="welcome-1", now=NOW)
    with pytest.raises(IdempotencyConflict) as caught:
        enqueue(REF, kwargs={"user_id": 2}, idempotency_key="welcome-1", now=NOW)
    assert caught.value.field == "idempotency_key"
    assert f"already used for a different request (run {first.pk})" in str(caught.value)
    assert Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_with_one_key_create_one_job():
    threads_count = 8
    barrier = threading.Barrier(threads_count)
    results, errors = [], []

    def request(user_id):
        try:
            barrier.wait(5)
            results.append(enqueue(REF, kwargs={"user_id": user_id}, idempotency_key="race", now=NOW))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            connection.close()  # each thread has its own connection

    # Six identical requests and two with another payload, all at once.
    threads = [threading.Thread(target=request, args=(1 if i < 6 else 2,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert Run.objects.filter(idempotency_key="race").count() == 1
    assert TaskRun.objects.count() == 1
    winner = Run.objects.get(idempotency_key="race")
    assert sum(created for _, created in results) == 1
    assert {run.pk for run, _ in results} == {winner.pk}
    # Whoever lost with a payload different from the winner's was refused, never given a job.
    winning_user = TaskRun.objects.get().spec["kwargs"]["user_id"]
    assert len(errors) == (2 if winning_user == 1 else 6)
    assert all(isinstance(error, IdempotencyConflict) for error in errors)
