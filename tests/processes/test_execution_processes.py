"""Execution with real processes: workers, dispatchers and the reaper as OS processes on the
test database, crashes by real signals, times recorded by the tasks themselves."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from django.test.utils import override_settings

from orchestrator import conf, control, logs
from orchestrator.models import (
    Attempt,
    QueueLimit,
    Run,
    TaskRun,
    TenantLimit,
    Worker,
    Workflow,
    WorkflowVersion,
)
from orchestrator.runs import create_run
from tests.conftest import process_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REF = "tests.support.tasks_for_tests"
FAST = {
    "ORCHESTRATOR_HEARTBEAT_SECONDS": "0.5",
    "ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS": "3",
    "ORCHESTRATOR_POLL_SECONDS": "0.5",
}


@pytest.fixture
def data_dir(tmp_path):
    """Logs of the worker processes and of this process in one temporary storage."""
    with override_settings(ORCHESTRATOR_DATA_DIR=tmp_path / "data"):
        yield tmp_path / "data"


@pytest.fixture
def env(data_dir):
    return process_env(ORCHESTRATOR_DATA_DIR=str(data_dir), **FAST)


def task(fn, upstream=(), **extra):
    return {"kind": "python", "ref": f"{REF}:{fn}", "upstream": list(upstream), **extra}


def job(fn, *args, **extra):
    kwargs = extra.pop("kwargs", {})
    return {"kind": "python", "ref": f"{REF}:{fn}", "call": "job", "args": list(args), "kwargs": kwargs, **extra}


def start_run(tasks, params=None, **kwargs):
    run, _ = create_run(None, trigger="job", tasks=tasks, params=params or {}, **kwargs)
    return run


def run_state(run):
    return Run.objects.values_list("state", flat=True).get(pk=run.pk)


def wait_finished(run, timeout=20.0):
    return wait_for(lambda: run_state(run) not in ("pending", "running"), timeout, message=f"run {run.pk} to finish")


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_worker(processes, env, *, queues="default", concurrency=2, grace=None, name=None):
    args = ["worker", "--queues", queues, "--concurrency", str(concurrency)]
    if grace is not None:
        args += ["--grace", str(grace)]
    proc = processes.start(*args, env=env, name=name)
    wait_for(lambda: Worker.objects.filter(pid=proc.pid, state="running").exists(), 20, message="the worker to register")
    return proc


def test_a_fan_out_fan_in_dag_runs_each_task_after_all_its_parents(processes, env, tmp_path):
    record = tmp_path / "times.jsonl"
    processes.start("dispatcher", env=env)
    start_worker(processes, env, concurrency=3)
    start_worker(processes, env, concurrency=3)
    graph = {"extract": []}
    graph.update({f"transform_{i}": ["extract"] for i in range(4)})
    graph["join"] = [f"transform_{i}" for i in range(4)]
    graph.update({f"publish_{i}": ["join"] for i in range(3)})
    graph["report"] = [f"publish_{i}" for i in range(3)]
    run = start_run({name: task("record", parents) for name, parents in graph.items()},
                    params={"record": str(record), "sleep": 0.2, "together": [f"transform_{i}" for i in range(4)]})
    # Five levels of 0.2 s, the four transforms waiting (up to 30 s) until all four have started:
    # more than the default 20 s on a machine the rest of the suite is loading.
    assert wait_finished(run, timeout=60.0) and run_state(run) == "succeeded"
    events = records(record)
    start = {e["task"]: e["at"] for e in events if e["event"] == "start"}
    end = {e["task"]: e["at"] for e in events if e["event"] == "end"}
    assert set(start) == set(graph)
    for name, parents in graph.items():
        for parent in parents:
            assert start[name] >= end[parent], f"{name} started before its parent {parent} ended"
    # The fan-out really ran in parallel on the two workers: each transform saw all four started
    # before it went on.
    met = {e["task"]: e["met"] for e in events if e["event"] == "met"}
    assert met == {f"transform_{i}": True for i in range(4)}
    join = TaskRun.objects.get(run=run, task="join")
    assert sorted(join.result["upstream"]) == [f"transform_{i}" for i in range(4)]


@pytest.mark.slow
def test_a_worker_killed_mid_task_is_reaped_and_another_worker_finishes(processes, env, tmp_path):
    record = tmp_path / "times.jsonl"
    processes.start("dispatcher", env=env)
    doomed = start_worker(processes, env, concurrency=1, name="doomed")
    run = start_run({"work": task("crash_first_attempt", max_attempts=3, retry_delay=0)},
                    params={"record": str(record)})
    wait_for(lambda: any(e["event"] == "start" for e in records(record)), 20, message="attempt 1 to start")
    processes.stop(doomed, signal.SIGKILL)
    killed_at = time.time()
    first_pid = records(record)[0]["pid"]
    # The child died with its worker: the task does not keep running beside its retry.
    wait_for(lambda: not _alive(first_pid), 5, message="the killed worker's child to die")
    start_worker(processes, env, concurrency=1, name="rescuer")
    processes.start("reaper", "--interval", "0.5", env=env)
    assert wait_finished(run) and run_state(run) == "succeeded"
    task_run = TaskRun.objects.get(run=run)
    attempts = list(Attempt.objects.filter(task_run=task_run).order_by("number"))
    assert [(a.number, a.outcome) for a in attempts] == [(1, "lost"), (2, "succeeded")]
    assert attempts[0].worker_id != attempts[1].worker_id
    assert Worker.objects.get(pk=attempts[0].worker_id).state == "lost"
    events = records(record)
    second_start = next(e["at"] for e in events if e["attempt"] == 2 and e["event"] == "start")
    assert second_start > killed_at  # never on two workers at once
    assert not any(e["attempt"] == 1 and e["event"] == "end" for e in events)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by init) counts as dead.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_task_past_its_timeout_is_killed_and_retried(processes, env):
    processes.start("dispatcher", env=env)
    start_worker(processes, env, concurrency=1)
    started = time.monotonic()
    run = start_run({"slow": task("slow_then_fast", timeout=0.5, max_attempts=2, retry_delay=0)})
    assert wait_finished(run) and run_state(run) == "succeeded"
    assert time.monotonic() - started < 10
    task_run = TaskRun.objects.get(run=run)
    assert task_run.result == 2
    outcomes = list(Attempt.objects.filter(task_run=task_run).order_by("number").values_list("outcome", "error"))
    assert outcomes[0][0] == "timed_out" and "timed out after 0.5s" in outcomes[0][1]
    assert outcomes[1][0] == "succeeded"


def _peak(events) -> int:
    running = peak = 0
    for _, step in sorted(events):
        running += step
        peak = max(peak, running)
    return peak


def test_an_always_failing_task_ends_dead_after_exactly_its_attempts_and_a_retry_finishes_the_run(
        processes, env, tmp_path):
    heal = tmp_path / "healed"
    processes.start("dispatcher", env=env)
    start_worker(processes, env, concurrency=2)
    run = start_run({"flaky": task("always_fails", max_attempts=3, retry_delay=0.05, retry_backoff=1),
                     "after": task("no_argument", ["flaky"])}, params={"heal_file": str(heal)})
    assert wait_finished(run) and run_state(run) == "failed"
    flaky = TaskRun.objects.get(run=run, task="flaky")
    assert (flaky.state, flaky.attempts) == ("dead", 3)
    assert list(flaky.attempt_set.values_list("outcome", flat=True)) == ["failed"] * 3
    assert "boom on attempt 3" in flaky.error
    assert TaskRun.objects.get(run=run, task="after").state == "upstream_failed"
    heal.write_text("fixed")
    assert control.retry_task_runs([flaky.pk]) == 1
    assert wait_finished(run) and run_state(run) == "succeeded"
    assert TaskRun.objects.get(run=run, task="flaky").attempts == 4


def test_concurrency_limits_hold_under_several_workers_and_two_dispatchers(processes, env, tmp_path):
    record = tmp_path / "times.jsonl"
    QueueLimit.objects.create(queue="limited", max_running=3)
    TenantLimit.objects.create(tenant="acme", max_running=1)
    # One dispatcher of its own, one in a scheduler's process (what ./dev run starts).
    processes.start("dispatcher", env=env)
    processes.start("scheduler", "--dispatch", env=env)
    for _ in range(3):
        start_worker(processes, env, queues="limited", concurrency=2)
    runs = [start_run({"j": job("record_job", str(record), 0.3, f"{tenant}-{i}", queue="limited")}, tenant=tenant)
            for i in range(6) for tenant in ("acme", "other")]
    for run in runs:
        assert wait_finished(run, 30)
    events = [(e["at"], 1 if e["event"] == "start" else -1) for e in records(record)]
    acme = [(e["at"], 1 if e["event"] == "start" else -1) for e in records(record) if e["task"].startswith("acme")]
    assert len(events) == 24
    # Each limit is reached and never exceeded, across three workers and two dispatchers.
    assert _peak(events) == 3
    assert _peak(acme) == 1


def test_sigterm_drains_a_worker_without_losing_a_task(processes, env, tmp_path):
    record = tmp_path / "times.jsonl"
    processes.start("dispatcher", env=env)
    worker = start_worker(processes, env, concurrency=2, grace=10)
    finishing = start_run({"j": job("record_job", str(record), 1.0, "finishing")})
    wait_for(lambda: records(record), 20, message="the task to start")
    queued_later = start_run({"j": job("record_job", str(record), 0, "later")})
    code = processes.stop(worker, signal.SIGTERM)
    assert code == 0
    assert run_state(finishing) == "succeeded"  # finished within the grace period
    stopped = Worker.objects.get(pid=worker.pid)
    assert stopped.state == "stopped"
    # Work that arrived during the drain is not lost: the next worker runs it.
    start_worker(processes, env, concurrency=1)
    assert wait_finished(queued_later) and run_state(queued_later) == "succeeded"


def test_sigterm_past_the_grace_period_hands_the_task_back(processes, env, tmp_path):
    record = tmp_path / "times.jsonl"
    processes.start("dispatcher", env=env)
    worker = start_worker(processes, env, concurrency=1, grace=0.5)
    run = start_run({"work": task("crash_first_attempt", max_attempts=1)}, params={"record": str(record)})
    wait_for(lambda: records(record), 20, message="the task to start")
    assert processes.stop(worker, signal.SIGTERM) == 0
    task_run = TaskRun.objects.get(run=run)
    # Handed back (the running dispatcher may already have queued it again), allowance kept.
    assert task_run.state in ("scheduled", "queued") and task_run.max_attempts == 2
    assert Attempt.objects.get(task_run=task_run).outcome == "lost"
    start_worker(processes, env, concurrency=1)
    assert wait_finished(run) and run_state(run) == "succeeded"


def test_logs_are_captured_and_readable_while_the_task_runs(processes, env, tmp_path):
    gate = tmp_path / "gate"
    processes.start("dispatcher", env=env)
    start_worker(processes, env, concurrency=1)
    run = start_run({"noisy": task("noisy")}, params={"gate": str(gate)})
    attempt = wait_for(lambda: Attempt.objects.filter(task_run__run=run).first(), 20, message="the attempt")

    def partial_log():
        text, _, eof = logs.read(attempt)
        return text if "through logging" in text else None

    text = wait_for(partial_log, 10, message="the log while running")
    assert "to stdout" in text and "to stderr" in text
    assert logs.read(attempt)[2] is False  # still running: not at the end
    gate.write_text("open")
    assert wait_finished(run) and run_state(run) == "succeeded"
    attempt.refresh_from_db()
    assert attempt.log_path and conf.log_storage().exists(attempt.log_path)
    first, offset, eof = logs.read(attempt, 0, 12)
    rest, _, eof = logs.read(attempt, offset)
    assert eof and "after the gate" in first + rest and "WARNING tests.tasks: through logging" in first + rest


def test_a_shell_task_gets_the_params_in_its_environment_and_fails_on_exit_code(processes, env, tmp_path):
    processes.start("dispatcher", env=env)
    start_worker(processes, env, concurrency=2)
    command = 'echo "region=$PARAM_REGION days=$PARAM_DAYS run=$RUN_ID task=$TASK try=$ATTEMPT greet=$GREETING"; exit 3'
    # Shell commands run only as a stored graph version declares them (sync writes those).
    workflow = Workflow.objects.create(name="shell")
    tasks = {"sh": {"kind": "shell", "command": command, "env": {"GREETING": "hi"}, "upstream": []},
             "ok": {"kind": "shell", "command": "echo fine", "upstream": []}}
    version = WorkflowVersion.objects.create(workflow=workflow, number=1, hash="shell", spec={"tasks": tasks})
    run = start_run(tasks, params={"region": "eu", "days": [1, 2]}, version=version)
    assert wait_finished(run) and run_state(run) == "failed"
    failed = TaskRun.objects.get(run=run, task="sh")
    assert failed.state == "dead" and failed.error == "exit code 3"
    text, _, _ = logs.read(Attempt.objects.get(task_run=failed))
    assert f"region=eu days=[1, 2] run={run.pk} task=sh try=1 greet=hi" in text
    assert TaskRun.objects.get(run=run, task="ok").state == "succeeded"


def test_cancel_kills_a_running_task(processes, env, tmp_path):
    marker = tmp_path / "pid"
    processes.start("dispatcher", env=env)
    start_worker(processes, env, concurrency=1)
    run = start_run({"sleep": job("sleeper", 30, str(marker))})
    wait_for(marker.exists, 20, message="the task to start")
    wait_for(lambda: marker.read_text(), 5, message="the pid")
    pid = int(marker.read_text())
    assert control.cancel_run(run, reason="operator said so")
    wait_for(lambda: not _alive(pid), 5, message="the task's process to be killed")
    task_run = TaskRun.objects.get(run=run)
    assert task_run.state == "cancelled"
    assert Attempt.objects.get(task_run=task_run).outcome == "cancelled"
    # The worker keeps working with a fresh child.
    after = start_run({"add": job("add", 1, 2)})
    assert wait_finished(after) and run_state(after) == "succeeded"


def test_a_job_that_runs_on_shows_its_run_s_start_while_it_runs(processes, env, tmp_path):
    """A worker writes a run's start with its end when the job ends within 0.2 s, else in a batch
    soon after the claim (worker.batch.RUN_STARTS): a job that runs on shows its run's start while
    it runs, the claim's time."""
    marker = tmp_path / "pid"
    start_worker(processes, env, concurrency=1)
    run = start_run({"sleep": job("sleeper", 30, str(marker))})
    wait_for(marker.exists, 20, message="the task to start")
    started = wait_for(lambda: Run.objects.values_list("started_at", flat=True).get(pk=run.pk), 10,
                       message="the run's start")
    task_run = TaskRun.objects.get(run=run)
    assert (task_run.state, task_run.started_at) == ("running", started)
    assert Run.objects.get(pk=run.pk).schedule_delay is not None
    assert control.cancel_run(run, reason="seen")


def test_a_worker_declared_lost_kills_the_tasks_it_no_longer_owns(processes, env, tmp_path):
    """A worker that was only paused (not dead) must not keep running a task the reaper has
    already handed to another attempt."""
    from django.test.utils import override_settings

    from orchestrator import reaper

    marker = tmp_path / "pid"
    processes.start("dispatcher", env=env)
    proc = start_worker(processes, env, concurrency=1)
    run = start_run({"sleep": job("sleeper", 30, str(marker), max_attempts=2, retry_delay=60)})
    wait_for(lambda: marker.exists() and marker.read_text(), 20, message="the task to start")
    pid = int(marker.read_text())
    # As if its heartbeats had stopped for a while: the reaper ends the attempt.
    Worker.objects.filter(pid=proc.pid).update(heartbeat_at="2000-01-01T00:00:00Z")
    with override_settings(ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS=3):
        assert reaper.reap_once() == 1
    wait_for(lambda: not _alive(pid), 5, message="the worker to kill the task it lost")
    assert Attempt.objects.get(task_run__run=run).outcome == "lost"
    assert TaskRun.objects.get(run=run).state == "scheduled"  # attempt 2, in a minute
    wait_for(lambda: Worker.objects.filter(pid=proc.pid, state="running").exists(), 5, message="the worker to revive")
