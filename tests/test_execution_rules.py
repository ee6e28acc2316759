"""The execution rules without processes: dispatcher ticks, worker claims and completions,
trigger rules, the retry rule, the dead-letter queue, cancel, and the reaper, on a real
PostgreSQL with an injected clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test.utils import override_settings

from orchestrator import control, dispatcher, executor, logs, reaper, resolver
from orchestrator.conf import app_settings
from orchestrator.models import Attempt, QueueLimit, Run, TaskRun, TenantLimit, Worker
from orchestrator.resolver import Ending
from orchestrator.runs import create_run
from orchestrator.worker import Worker as WorkerLoop

pytestmark = pytest.mark.django_db

REF = "tests.support.tasks_for_tests"


def job_spec(fn="add", args=(1, 2), **extra):
    return {"kind": "python", "ref": f"{REF}:{fn}", "call": "job", "args": list(args), "kwargs": {}, **extra}


def task_spec(fn="context_echo", upstream=(), **extra):
    return {"kind": "python", "ref": f"{REF}:{fn}", "upstream": list(upstream), **extra}


def make_run(tasks, clock, **kwargs):
    run, _ = create_run(None, trigger="job", tasks=tasks, now=clock.now(), **kwargs)
    return run


def states(run):
    return dict(TaskRun.objects.filter(run=run).values_list("task", "state"))


def worker_loop(queues=("default",)):
    loop = WorkerLoop(list(queues), concurrency=4)
    loop.register()
    return loop


def execute_claimed(loop, n, clock):
    """Claim like the worker does, run the tasks in this process, record like the worker does."""
    messages = loop.claim(n, clock.now())
    endings = [Ending(*executor.run(m), check=m.get("check")) for m in messages]
    from django.db import transaction

    with transaction.atomic():
        resolver.end_attempts(endings, worker_id=loop.id, now=clock.now())
    return messages


# --- dispatch order: the workers' own claims, and the dispatcher under limits ---------------

def claimed_runs(loop, n, clock):
    """The run ids of what one claim of n takes, in claim order."""
    return [m["run_id"] for m in loop.claim(n, clock.now())]


def test_a_worker_claims_only_due_work_live_lane_before_backfill(clock):
    later = make_run({"a": job_spec()}, clock, due_at=clock.now() + timedelta(minutes=5))
    backfill = make_run({"a": job_spec()}, clock, lane=1, priority=100)
    live = make_run({"a": job_spec()}, clock)
    loop = worker_loop()
    # The live run goes first despite the backfill's higher priority; the delayed one waits.
    assert claimed_runs(loop, 1, clock) == [live.pk]
    assert states(backfill) == {"a": "scheduled"}
    assert claimed_runs(loop, 8, clock) == [backfill.pk]
    assert states(later) == {"a": "scheduled"}
    clock.advance(minutes=5)
    assert claimed_runs(loop, 8, clock) == [later.pk]
    # Claimed straight from scheduled: no dispatcher was involved, and the claim is its admission.
    task_run = TaskRun.objects.get(run=later)
    assert task_run.state == "running" and task_run.queued_at == task_run.started_at == clock.now()


def test_the_dispatcher_leaves_work_without_a_limit_to_the_workers(clock):
    run = make_run({"a": job_spec()}, clock)
    assert dispatcher.tick(now=clock.now()) == 0
    assert dispatcher.next_due() is None  # nothing of its own to wake for
    assert states(run) == {"a": "scheduled"}


def test_a_busy_tenant_does_not_starve_a_small_one(clock):
    for _ in range(30):
        make_run({"a": job_spec()}, clock, tenant="big")
    clock.advance(seconds=1)  # the small tenant's task is the newest of all
    small = make_run({"a": job_spec()}, clock, tenant="small")
    assert small.pk in claimed_runs(worker_loop(), 4, clock)


def test_the_dispatcher_takes_turns_between_tenants_under_a_limit(clock):
    QueueLimit.objects.create(queue="default", max_running=100)
    for _ in range(30):
        make_run({"a": job_spec()}, clock, tenant="big")
    clock.advance(seconds=1)
    small = make_run({"a": job_spec()}, clock, tenant="small")
    assert dispatcher.tick(now=clock.now(), batch=4) == 4
    assert states(small) == {"a": "queued"}


def test_queue_and_tenant_limits_count_queued_and_running(clock):
    QueueLimit.objects.create(queue="default", max_running=3)
    TenantLimit.objects.create(tenant="acme", max_running=1)
    runs = [make_run({"a": job_spec()}, clock) for _ in range(5)]
    acme = [make_run({"a": job_spec()}, clock, tenant="acme") for _ in range(3)]
    assert dispatcher.tick(now=clock.now()) == 3
    queued = TaskRun.objects.filter(state="queued")
    assert queued.count() == 3
    assert queued.filter(tenant="acme").count() == 1
    loop = worker_loop()
    execute_claimed(loop, 1, clock)  # one finishes: one place frees up
    assert dispatcher.tick(now=clock.now()) == 1
    assert TaskRun.objects.filter(state__in=["queued", "running"]).count() == 3
    assert TaskRun.objects.filter(run__in=runs + acme, state="succeeded").count() == 1


def test_a_worker_claims_admitted_work_and_unlimited_work_but_never_past_a_limit(clock):
    # The batch queue is limited: its work waits for the dispatcher, whatever the worker's room.
    # A tenant limit holds back that tenant's work in any queue.
    QueueLimit.objects.create(queue="batch", max_running=1)
    TenantLimit.objects.create(tenant="acme", max_running=1)
    limited = [make_run({"a": job_spec(queue="batch")}, clock) for _ in range(3)]
    acme = make_run({"a": job_spec()}, clock, tenant="acme")
    free = make_run({"a": job_spec()}, clock)
    loop = worker_loop(("default", "batch"))
    assert claimed_runs(loop, 8, clock) == [free.pk]
    assert dispatcher.tick(now=clock.now()) == 2  # one of the batch queue, acme's one
    assert sorted(claimed_runs(loop, 8, clock)) == sorted([limited[0].pk, acme.pk])
    assert claimed_runs(loop, 8, clock) == []
    assert dispatcher.tick(now=clock.now()) == 0  # both at their limit


def test_work_of_a_full_queue_does_not_hold_back_other_queues(clock):
    # The batch queue has more urgent due work than one tick reads. Once it is full, its rows
    # must not keep filling the ticks: the default queue's single task is queued next.
    QueueLimit.objects.create(queue="batch", max_running=1)
    QueueLimit.objects.create(queue="default", max_running=10)
    for _ in range(5):
        make_run({"a": job_spec(queue="batch", priority=50)}, clock)
    small = make_run({"a": job_spec()}, clock)
    assert dispatcher.tick(now=clock.now(), batch=2) == 1
    assert TaskRun.objects.filter(queue="batch", state="queued").count() == 1
    assert dispatcher.tick(now=clock.now(), batch=2) == 1
    assert states(small) == {"a": "queued"}
    assert dispatcher.tick(now=clock.now(), batch=2) == 0  # batch is full, nothing else is due
    assert TaskRun.objects.filter(queue="batch", state="queued").count() == 1


def test_a_claim_takes_a_tenants_work_by_priority_then_due_time_across_its_queues(clock):
    # Each (queue, lane, tenant, priority) is read apart and merged: the order within a tenant is
    # still priority first, then due time, whatever queue the work is in; work of a higher
    # priority that is not due yet holds nothing back.
    low = make_run({"a": job_spec()}, clock)
    clock.advance(seconds=1)
    urgent_batch = make_run({"a": job_spec(queue="batch", priority=5)}, clock)
    tomorrow = make_run({"a": job_spec(priority=9)}, clock, due_at=clock.now() + timedelta(days=1))
    clock.advance(seconds=1)
    urgent_default = make_run({"a": job_spec(priority=5)}, clock)
    loop = worker_loop(("default", "batch"))
    order = [run_id for _ in range(3) for run_id in claimed_runs(loop, 1, clock)]
    assert order == [urgent_batch.pk, urgent_default.pk, low.pk]
    assert claimed_runs(loop, 8, clock) == []
    assert states(tomorrow) == {"a": "scheduled"}


@override_settings(ORCHESTRATOR_DEFAULT_QUEUE_LIMIT=2)
def test_the_default_queue_limit_applies_without_a_limit_row(clock):
    for _ in range(4):
        make_run({"a": job_spec()}, clock)
    assert claimed_runs(worker_loop(), 8, clock) == []  # every queue is limited: the dispatcher admits
    assert dispatcher.tick(now=clock.now()) == 2
    assert dispatcher.tick(now=clock.now()) == 0


@pytest.mark.django_db(transaction=True)
def test_two_claims_at_once_take_different_work(clock):
    # Two workers claiming at the same moment: the second passes over the rows the first holds
    # and takes the next ones in dispatch order, instead of coming back empty.
    import threading

    from django.db import connections, transaction

    for _ in range(6):
        make_run({"a": job_spec()}, clock)
    first, second = worker_loop(), worker_loop()
    theirs = []

    def claim_beside():
        try:
            with transaction.atomic():
                theirs.extend(m["id"] for m in second.claim(2, clock.now()))
        finally:
            connections.close_all()

    with transaction.atomic():
        mine = [m["id"] for m in first.claim(2, clock.now())]  # held until this block commits
        beside = threading.Thread(target=claim_beside)
        beside.start()
        beside.join(timeout=30)
    assert len(mine) == 2 and len(theirs) == 2 and not set(mine) & set(theirs)
    assert TaskRun.objects.filter(state="running").count() == 4


def test_due_work_announced_during_a_tick_is_looked_at_at_once_held_back_work_after_a_pause(clock):
    # Work held back by a limit waits out a short pause between ticks. Work committed after a
    # tick's snapshot is announced by its NOTIFY, which ends the pause at once.
    QueueLimit.objects.create(queue="batch", max_running=1)
    QueueLimit.objects.create(queue="default", max_running=10)
    role = dispatcher.Dispatcher(poll=1.0, clock=clock)
    assert role.tick() is False and role.next_wait() is None  # nothing at all
    for _ in range(2):
        make_run({"a": job_spec(queue="batch")}, clock)
    assert role.tick() is True  # the limit's room
    assert role.tick() is False
    pause = role.next_wait()
    assert role.held_back and 0 < pause <= dispatcher.HELD_BACK_PAUSE
    assert role.tick() is False  # within the pause: not even a look
    new = make_run({"a": job_spec()}, clock)
    role.notified([object()])  # its NOTIFY
    assert role.next_wait() == 0.0
    assert role.tick() is True
    assert states(new) == {"a": "queued"}
    assert role.tick() is False
    assert 0 < role.next_wait() <= dispatcher.HELD_BACK_PAUSE


# --- worker claim and completion ------------------------------------------------------------

def test_a_claim_creates_the_attempt_and_starts_the_run(clock):
    run = make_run({"a": job_spec("add", (2, 3))}, clock, logical_date=clock.now() - timedelta(seconds=4))
    dispatcher.tick(now=clock.now())
    loop = worker_loop()
    clock.advance(seconds=1)
    messages = execute_claimed(loop, 8, clock)
    assert len(messages) == 1
    task_run = TaskRun.objects.get(run=run)
    assert (task_run.state, task_run.result, task_run.attempts) == ("succeeded", 5, 1)
    attempt = Attempt.objects.get(task_run=task_run)
    assert (attempt.number, attempt.outcome, attempt.worker_id) == (1, "succeeded", loop.id)
    run.refresh_from_db()
    assert run.state == "succeeded" and run.finished_at == clock.now()
    assert run.schedule_delay == pytest.approx(5.0)


def test_workflow_tasks_get_their_context_with_parent_results(clock):
    run = make_run({"a": task_spec(), "b": task_spec(upstream=["a"])}, clock, logical_date=clock.now())
    Run.objects.filter(pk=run.pk).update(params={"region": "eu"})
    loop = worker_loop()
    dispatcher.tick(now=clock.now())
    execute_claimed(loop, 8, clock)
    assert states(run) == {"a": "succeeded", "b": "scheduled"}
    dispatcher.tick(now=clock.now())
    execute_claimed(loop, 8, clock)
    b = TaskRun.objects.get(run=run, task="b")
    assert b.result["params"] == {"region": "eu"}
    assert b.result["upstream"]["a"]["task"] == "a"
    assert b.result["attempt"] == 1 and b.result["run_id"] == run.pk


def test_a_late_write_from_a_reaped_worker_changes_nothing(clock):
    run = make_run({"a": job_spec(max_attempts=2, retry_delay=0)}, clock)
    dispatcher.tick(now=clock.now())
    slow = worker_loop()
    [message] = slow.claim(1, clock.now())
    Worker.objects.filter(pk=slow.id).update(heartbeat_at=clock.db_now() - timedelta(minutes=5))
    assert reaper.reap_once(clock) == 1
    assert Attempt.objects.get(task_run_id=message["id"], number=1).outcome == "lost"
    assert Worker.objects.get(pk=slow.id).state == "lost"
    # Attempt 2 starts on another worker; then the first worker reports success for attempt 1.
    dispatcher.tick(now=clock.now() + timedelta(seconds=1))
    other = worker_loop()
    [second] = other.claim(1, clock.now())
    assert second["number"] == 2
    late = resolver.end_attempts([Ending(message["id"], 1, "succeeded", "1")], worker_id=slow.id, now=clock.now())
    assert late == []
    task_run = TaskRun.objects.get(run=run)
    assert (task_run.state, task_run.attempts, task_run.worker_id) == ("running", 2, other.id)
    assert Attempt.objects.get(task_run=task_run, number=1).outcome == "lost"


def test_after_a_database_restart_a_workers_silence_counts_from_the_servers_start(clock):
    # Nobody could send a heartbeat while the server was down: a worker silent for five minutes,
    # four of them an outage, is not lost until the timeout has passed since the server started.
    make_run({"a": job_spec(max_attempts=2)}, clock)
    dispatcher.tick(now=clock.now())
    loop = worker_loop()
    loop.claim(1, clock.now())
    Worker.objects.filter(pk=loop.id).update(heartbeat_at=clock.db_now() - timedelta(minutes=5))
    timeout = app_settings.HEARTBEAT_TIMEOUT_SECONDS
    clock.server_started = clock.db_now() - timedelta(seconds=timeout / 2)
    assert reaper.reap_once(clock) == 0
    assert Worker.objects.get(pk=loop.id).state == "running"
    clock.server_started = clock.db_now() - timedelta(seconds=timeout + 1)
    assert reaper.reap_once(clock) == 1
    assert Worker.objects.get(pk=loop.id).state == "lost"


def test_the_reaper_times_out_an_attempt_its_worker_did_not_kill(clock):
    make_run({"a": job_spec(timeout=10, max_attempts=1)}, clock)
    dispatcher.tick(now=clock.now())
    loop = worker_loop()
    loop.claim(1, clock.now())
    Worker.objects.filter(pk=loop.id).update(heartbeat_at=clock.now())
    clock.advance(seconds=20)
    assert reaper.reap_once(clock) == 0  # within timeout + margin
    clock.advance(seconds=30)
    Worker.objects.filter(pk=loop.id).update(heartbeat_at=clock.now())
    assert reaper.reap_once(clock) == 1
    task_run = TaskRun.objects.get()
    assert task_run.state == "dead"
    assert Attempt.objects.get().outcome == "timed_out"


# --- retries and the dead-letter queue ------------------------------------------------------

def test_failures_back_off_and_end_dead_after_max_attempts(clock):
    spec = task_spec("always_fails", max_attempts=3, retry_delay=10, retry_backoff=3, retry_max_delay=20)
    run = make_run({"a": spec, "b": task_spec(upstream=["a"])}, clock)
    loop = worker_loop()
    delays = []
    for attempt in (1, 2, 3):
        assert len(execute_claimed(loop, 1, clock)) == 1
        task_run = TaskRun.objects.get(run=run, task="a")
        if attempt < 3:
            assert task_run.state == "scheduled"
            delays.append((task_run.due_at - clock.now()).total_seconds())
            clock.set(task_run.due_at)
    # delay = min(cap, 10 * 3**(n-1)) * jitter in [0.5, 1]: 5..10 s, then 10..20 s (capped at 20).
    assert 5 <= delays[0] <= 10 and 10 <= delays[1] <= 20
    assert task_run.state == "dead" and task_run.attempts == 3
    assert "boom on attempt 3" in task_run.error
    last = Attempt.objects.get(task_run=task_run, number=3)
    assert last.outcome == "failed" and "RuntimeError" in last.traceback
    assert states(run)["b"] == "upstream_failed"
    run.refresh_from_db()
    assert run.state == "failed"


def test_a_retry_from_the_dead_letter_queue_lets_the_run_finish(clock, tmp_path):
    heal = tmp_path / "healed"
    run = make_run({"a": task_spec("always_fails", max_attempts=2, retry_delay=0),
                    "b": task_spec(upstream=["a"]), "c": task_spec(upstream=["b"])}, clock)
    Run.objects.filter(pk=run.pk).update(params={"heal_file": str(heal)})
    loop = worker_loop()
    for _ in range(2):
        dispatcher.tick(now=clock.now() + timedelta(seconds=1))
        execute_claimed(loop, 1, clock)
    assert states(run) == {"a": "dead", "b": "upstream_failed", "c": "upstream_failed"}
    heal.write_text("ok")
    a = TaskRun.objects.get(run=run, task="a")
    assert control.retry_task_runs([a.pk], now=clock.now()) == 1
    assert control.retry_task_runs([a.pk], now=clock.now()) == 0  # guarded: it is no longer dead
    run.refresh_from_db()
    assert run.state == "running" and run.finished_at is None
    assert states(run) == {"a": "scheduled", "b": "waiting", "c": "waiting"}
    a.refresh_from_db()
    assert a.max_attempts == 4  # a fresh allowance of two, counted from now
    for _ in range(3):
        dispatcher.tick(now=clock.now() + timedelta(seconds=1))
        execute_claimed(loop, 4, clock)
    run.refresh_from_db()
    assert run.state == "succeeded", states(run)


def test_discard_takes_a_task_run_out_of_the_dead_letter_queue(clock):
    run = make_run({"a": job_spec("always_fails")}, clock)
    dispatcher.tick(now=clock.now())
    execute_claimed(worker_loop(), 1, clock)
    task_run = TaskRun.objects.get(run=run)
    assert task_run.state == "dead"
    assert control.discard_task_runs([task_run.pk, task_run.pk]) == 1
    assert control.discard_task_runs([task_run.pk]) == 0
    task_run.refresh_from_db()
    assert task_run.state == "failed"
    assert control.retry_run(run) == 1  # a discarded task can still be retried with its run


@override_settings(ORCHESTRATOR_MAX_STORED_RESULT_BYTES=512 * 1024)
def test_result_too_large_or_not_json_fails_the_attempt_clearly(clock):
    big = make_run({"a": job_spec("too_big", ())}, clock)
    odd = make_run({"a": job_spec("not_json", ())}, clock)
    dispatcher.tick(now=clock.now())
    execute_claimed(worker_loop(), 4, clock)
    big_run = TaskRun.objects.get(run=big)
    assert big_run.state == "dead" and big_run.result is None
    assert "over the limit of 524288 bytes (ORCHESTRATOR_MAX_STORED_RESULT_BYTES" in big_run.error
    assert "MAX_RESULT_BYTES" in big_run.error
    assert "not JSON-serialisable" in TaskRun.objects.get(run=odd).error


def test_calling_conventions(clock):
    run = make_run({
        "job": job_spec("coroutine_job", (21,)),
        "bare": task_spec("no_argument"),
        "missing": job_spec("does_not_exist", ()),
    }, clock)
    dispatcher.tick(now=clock.now())
    execute_claimed(worker_loop(), 4, clock)
    rows = {t.task: t for t in TaskRun.objects.filter(run=run)}
    assert rows["job"].result == 42
    assert rows["bare"].result == "no argument"
    assert rows["missing"].state == "dead" and "unknown job 'tests.support.tasks_for_tests:does_not_exist'" in rows["missing"].error


# --- trigger rules --------------------------------------------------------------------------

RULES = [
    # rule, parent states, expected child state (None: still waiting)
    ("all_success", ["succeeded", "succeeded"], "scheduled"),
    ("all_success", ["succeeded", "running"], "waiting"),
    ("all_success", ["dead", "running"], "upstream_failed"),
    ("all_success", ["skipped", "succeeded"], "skipped"),
    ("all_done", ["dead", "succeeded"], "scheduled"),
    ("all_done", ["dead", "running"], "waiting"),
    ("one_success", ["succeeded", "running"], "scheduled"),
    ("one_success", ["dead", "upstream_failed"], "upstream_failed"),
    ("one_success", ["skipped", "skipped"], "skipped"),
    ("one_failed", ["dead", "running"], "scheduled"),
    ("one_failed", ["succeeded", "skipped"], "skipped"),
    ("one_failed", ["succeeded", "running"], "waiting"),
    ("all_failed", ["dead", "upstream_failed"], "scheduled"),
    ("all_failed", ["succeeded", "running"], "skipped"),
    ("all_failed", ["dead", "running"], "waiting"),
    ("none_failed", ["succeeded", "skipped"], "scheduled"),
    ("none_failed", ["failed", "running"], "upstream_failed"),
    ("none_failed", ["succeeded", "running"], "waiting"),
]


@pytest.mark.parametrize(("rule", "parents", "expected"), RULES)
def test_trigger_rules(clock, rule, parents, expected):
    run = make_run({"p1": task_spec(), "p2": task_spec(),
                    "child": task_spec(upstream=["p1", "p2"], trigger_rule=rule),
                    "grandchild": task_spec(upstream=["child"])}, clock)
    for name, state in zip(["p1", "p2"], parents, strict=True):
        TaskRun.objects.filter(run=run, task=name).update(state=state)
    resolver.resolve_runs([run.pk], now=clock.now())
    result = states(run)
    assert result["child"] == expected
    # A child that gave up settles its own children in the same call.
    if expected == "upstream_failed":
        assert result["grandchild"] == "upstream_failed"
    elif expected == "skipped":
        assert result["grandchild"] == "skipped"
    else:
        assert result["grandchild"] == "waiting"


def test_a_run_succeeds_only_when_every_task_ended_well(clock):
    run = make_run({"a": task_spec(), "b": task_spec(upstream=["a"], trigger_rule="one_failed")}, clock)
    TaskRun.objects.filter(run=run, task="a").update(state="succeeded")
    resolver.resolve_runs([run.pk], now=clock.now())
    run.refresh_from_db()
    assert states(run) == {"a": "succeeded", "b": "skipped"}
    assert run.state == "succeeded"


# --- cancel ---------------------------------------------------------------------------------

def test_cancel_ends_every_unfinished_task_and_notifies_workers(clock):
    run = make_run({"a": job_spec(), "b": job_spec(), "c": task_spec(upstream=["a"])}, clock)
    dispatcher.tick(now=clock.now())
    loop = worker_loop()
    [message, _] = loop.claim(2, clock.now())
    assert control.cancel_run(run, reason="no longer needed") is True
    assert control.cancel_run(run) is False
    assert set(states(run).values()) == {"cancelled"}
    assert Attempt.objects.filter(outcome="cancelled").count() == 2
    run.refresh_from_db()
    assert run.state == "cancelled" and run.reason == "no longer needed"
    # The worker's report of the killed task changes nothing.
    assert resolver.end_attempts([Ending(message["id"], 1, "failed", error="killed")], worker_id=loop.id) == []


def test_a_long_queue_name_gets_a_valid_notify_channel(clock):
    queue = "q" * 90
    QueueLimit.objects.create(queue=queue, max_running=1)
    make_run({"a": job_spec(queue=queue)}, clock)
    assert dispatcher.tick(now=clock.now()) == 1  # pg_notify would reject a channel over 63 bytes


# --- logs -----------------------------------------------------------------------------------

def test_logs_are_paged_without_splitting_a_character(clock, tmp_path, settings):
    settings.ORCHESTRATOR_LOG_STORAGE_OPTIONS = {"location": str(tmp_path)}
    run = make_run({"a": job_spec()}, clock)
    task_run = TaskRun.objects.get(run=run)
    attempt = Attempt.objects.create(task_run=task_run, number=1, started_at=clock.now())
    log = logs.AttemptLog(logs.name_for(run.pk, task_run.pk, 1))
    assert log.finish() == ""  # nothing written: no file
    log = logs.AttemptLog(logs.name_for(run.pk, task_run.pk, 1))
    log.write("é" * 5 + "\nend\n")
    text, offset, eof = logs.read(attempt, 0, 3)
    assert (text, offset, eof) == ("é", 2, False)  # 3 bytes asked; the 2nd "é" is not split
    pages, offset = [text], 2
    for _ in range(10):
        text, offset, eof = logs.read(attempt, offset, 3)
        pages.append(text)
        if not text:
            break
    assert "".join(pages) == "é" * 5 + "\nend\n"
    assert eof is False  # the attempt is still running: the log may grow
    attempt.outcome = "succeeded"
    assert logs.read(attempt, offset)[2] is True
    assert logs.open_for_download(attempt).read().decode() == "é" * 5 + "\nend\n"


@pytest.mark.django_db(transaction=True)
def test_a_tick_notifies_each_queue_once_whatever_the_number_of_rows(clock):
    from orchestrator.channels import listen_connection, queue_channel

    QueueLimit.objects.create(queue="default", max_running=100)
    QueueLimit.objects.create(queue="batch", max_running=100)
    for _ in range(5):
        make_run({"a": job_spec(), "b": job_spec(queue="batch")}, clock)
    listener = listen_connection(queue_channel("default"), queue_channel("batch"))  # after the runs' own
    try:
        assert dispatcher.tick(now=clock.now()) == 10
        notes = [note.channel for note in listener.notifies(timeout=0.3, stop_after=3)]
    finally:
        listener.close()
    assert sorted(notes) == ["orchestrator_queue_batch", "orchestrator_queue_default"]


@pytest.mark.django_db(transaction=True)
def test_new_work_wakes_the_workers_of_its_own_queue_and_the_dispatchers_only_under_a_limit(clock):
    # A job of the batch queue: the batch workers claim it themselves; the workers of other queues
    # sleep on, and so do the dispatchers while no limit holds that work (nothing for them to admit).
    from orchestrator.channels import DISPATCH_CHANNEL, DUE_CHANNEL, listen_connection, queue_channel

    listener = listen_connection(DISPATCH_CHANNEL, DUE_CHANNEL, queue_channel("default"), queue_channel("batch"))
    try:
        make_run({"a": job_spec(queue="batch")}, clock)
        make_run({"a": job_spec(queue="batch")}, clock, due_at=clock.now() + timedelta(hours=1))
        QueueLimit.objects.create(queue="batch", max_running=5)
        make_run({"a": job_spec(queue="batch")}, clock)
        TenantLimit.objects.create(tenant="acme", max_running=5)
        make_run({"a": job_spec(queue="default")}, clock, tenant="acme")
        notes = [note.channel for note in listener.notifies(timeout=0.5, stop_after=6)]
    finally:
        listener.close()
    # One NOTIFY per channel and transaction; the delayed job wakes them too, so a worker learns
    # when it is due. The dispatchers hear of the work of a limited queue and of a limited tenant.
    assert notes[:2] == ["orchestrator_queue_batch"] * 2
    assert sorted(notes[2:4]) == sorted([DISPATCH_CHANNEL, "orchestrator_queue_batch"])
    assert sorted(notes[4:]) == sorted([DISPATCH_CHANNEL, "orchestrator_queue_default"])


@pytest.mark.django_db(transaction=True)
def test_two_workers_ending_the_last_parents_at_once_still_release_the_join(clock):
    """Each transaction alone sees the other parent still running; the run lock makes the second
    one wait for the first and then see both parents done."""
    import threading

    from django.db import connections, transaction

    run = make_run({"p1": task_spec(), "p2": task_spec(), "join": task_spec(upstream=["p1", "p2"])}, clock)
    dispatcher.tick(now=clock.now())
    first, second = worker_loop(), worker_loop()
    [m1] = first.claim(1, clock.now())
    [m2] = second.claim(1, clock.now())
    a_recorded, a_may_commit, b_done = threading.Event(), threading.Event(), threading.Event()
    errors = []

    def end(loop, message, before_commit=None, after=None):
        try:
            with transaction.atomic():
                resolver.end_attempts([Ending(message["id"], 1, "succeeded", "1")], worker_id=loop.id,
                                      now=clock.now())
                if before_commit:
                    before_commit()
            if after:
                after.set()
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    def hold():
        a_recorded.set()
        a_may_commit.wait(10)

    a = threading.Thread(target=end, args=(first, m1, hold))
    a.start()
    assert a_recorded.wait(10)
    b = threading.Thread(target=end, args=(second, m2, None, b_done))
    b.start()
    assert not b_done.wait(0.3)  # waits for the run lock held by the first transaction
    a_may_commit.set()
    a.join(10)
    b.join(10)
    assert not errors
    assert states(run) == {"p1": "succeeded", "p2": "succeeded", "join": "scheduled"}
