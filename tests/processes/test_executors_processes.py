"""The in-process executors (``@job(executor="async"/"thread")``) in real worker processes on the
test database: timeouts, crashes by real signals, logs per job, drain, placement."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from django.test.utils import override_settings

from orchestrator import control, logs
from orchestrator.jobs import enqueue
from orchestrator.models import Attempt, Run, TaskRun, Worker
from tests.conftest import process_env, wait_for
from tests.support import inprocess_jobs  # noqa: F401 - registers the jobs these tests enqueue by name

REF = "tests.support.inprocess_jobs"
FAST = {
    "ORCHESTRATOR_HEARTBEAT_SECONDS": "0.5",
    "ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS": "3",
    "ORCHESTRATOR_POLL_SECONDS": "0.5",
    "ORCHESTRATOR_JOB_MODULES": f"workflows.jobs,{REF}",
}


@pytest.fixture
def data_dir(tmp_path):
    with override_settings(ORCHESTRATOR_DATA_DIR=tmp_path / "data"):
        yield tmp_path / "data"


@pytest.fixture
def env(data_dir):
    return process_env(ORCHESTRATOR_DATA_DIR=str(data_dir), **FAST)


def start_worker(processes, env, *, inprocess=10, concurrency=1, name=None):
    proc = processes.start("worker", "--queues", "default", "--concurrency", str(concurrency),
                           "--inprocess", str(inprocess), env=env, name=name)
    wait_for(lambda: Worker.objects.filter(pid=proc.pid, state="running").exists(), 20, message="the worker to register")
    if inprocess:
        # Until its host is ready a worker claims for its children only (where an async job would
        # run too): the scenarios below are about jobs on the host.
        wait_for(lambda: "in-process executor ready" in processes.output(proc), 20, message="the host to be ready")
    return proc


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finished(run: Run, timeout: float = 30.0) -> Run:
    wait_for(lambda: Run.objects.values_list("state", flat=True).get(pk=run.pk) not in ("pending", "running"),
             timeout, message=f"run {run.pk} to finish")
    return Run.objects.get(pk=run.pk)


def attempts(run: Run) -> list[tuple[int, str, str]]:
    return list(Attempt.objects.filter(task_run__run=run).order_by("number").values_list("number", "outcome", "error"))


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


processes_db = pytest.mark.django_db(transaction=True)


@processes_db
@pytest.mark.slow
def test_an_async_job_past_its_timeout_is_cancelled_and_the_loop_goes_on(processes, env, tmp_path):
    path = tmp_path / "hang.jsonl"
    start_worker(processes, env)
    hung, _ = enqueue(f"{REF}:hang_async", args=[str(path)], timeout=1.0)
    hung = finished(hung)
    assert hung.state == "failed"
    [(number, outcome, error)] = attempts(hung)
    assert outcome == "timed_out" and "timed out after 1s: the job was cancelled" in error
    # The job itself saw the cancellation (CancelledError at its await), in the same host process
    # that runs the next async job: nothing was killed.
    wait_for(lambda: any(r["event"] == "cancelled" for r in records(path)), 10, message="the cancellation")
    host = records(path)[0]["pid"]
    after, _ = enqueue(f"{REF}:pid_async")
    after = finished(after)
    assert after.state == "succeeded"
    assert TaskRun.objects.get(run=after).result == host


@processes_db
@pytest.mark.slow
def test_a_thread_job_past_its_timeout_is_recorded_and_its_host_replaced(processes, env, tmp_path):
    path = tmp_path / "hang.jsonl"
    start_worker(processes, env)
    hung, _ = enqueue(f"{REF}:hang_thread", args=[str(path)], timeout=1.0)
    hung = finished(hung)
    assert hung.state == "failed"
    [(number, outcome, error)] = attempts(hung)
    assert outcome == "timed_out" and "a thread cannot be stopped" in error
    # The stuck thread's process is killed (it ran nothing else), and a fresh one takes new jobs.
    host = records(path)[0]["pid"]
    wait_for(lambda: not alive(host), 10, message="the stuck thread's host to be killed")
    after, _ = enqueue(f"{REF}:pid_thread")
    after = finished(after)
    assert after.state == "succeeded"
    fresh = TaskRun.objects.get(run=after).result
    assert fresh != host and alive(fresh)


@processes_db
@pytest.mark.slow
def test_a_worker_sigkilled_with_200_async_jobs_in_flight_loses_none(processes, env, tmp_path):
    path, heal = tmp_path / "starts.jsonl", tmp_path / "healed"
    doomed = start_worker(processes, env, inprocess=200, name="doomed")
    runs = [enqueue(f"{REF}:wait_unless_healed", args=[str(path), str(heal)], max_attempts=2)[0]
            for _ in range(200)]
    wait_for(lambda: len(records(path)) >= 200, 60, message="200 async jobs to start")
    starts = records(path)
    host = starts[0]["pid"]
    assert {r["pid"] for r in starts} == {host}  # all 200 at once in one process, on its loop
    assert TaskRun.objects.filter(run__in=runs, state="running").count() == 200
    processes.stop(doomed, signal.SIGKILL)
    wait_for(lambda: not alive(host), 10, message="the host to die with its worker")
    heal.write_text("yes")
    start_worker(processes, env, inprocess=200, name="rescuer")
    processes.start("reaper", "--interval", "0.5", env=env)
    wait_for(lambda: not Run.objects.filter(pk__in=[r.pk for r in runs]).exclude(state="succeeded").exists(), 90,
             message="every run to succeed")
    # Every one was re-run: its first attempt recorded lost, its second succeeded.
    outcomes = {}
    for task_run, number, outcome in Attempt.objects.filter(task_run__run__in=runs).values_list(
            "task_run_id", "number", "outcome"):
        outcomes.setdefault(task_run, []).append((number, outcome))
    assert len(outcomes) == 200
    assert all(sorted(pairs) == [(1, "lost"), (2, "succeeded")] for pairs in outcomes.values())


@processes_db
@pytest.mark.slow
def test_the_logs_of_concurrent_in_process_jobs_do_not_mix(processes, env, data_dir, tmp_path):
    path = tmp_path / "times.jsonl"
    start_worker(processes, env, inprocess=10)
    jobs = {tag: enqueue(f"{REF}:chatty_{kind}", args=[tag, 20, str(path)])[0]
            for tag, kind in (("alpha", "async"), ("beta", "async"), ("gamma", "thread"), ("delta", "thread"))}
    for run in jobs.values():
        assert finished(run).state == "succeeded"
    # They ran at the same time: each pair started before the other of the pair ended.
    events = {(r["tag"], r["event"]): r["at"] for r in records(path)}
    for one, other in (("alpha", "beta"), ("gamma", "delta")):
        assert events[(one, "start")] < events[(other, "end")] and events[(other, "start")] < events[(one, "end")]
    for tag, run in jobs.items():
        task_run = TaskRun.objects.get(run=run)
        assert task_run.result >= 4  # the ORM (async for async jobs) answered
        attempt = Attempt.objects.get(task_run=task_run)
        with override_settings(ORCHESTRATOR_DATA_DIR=data_dir):
            text = Path(logs.local_path(attempt.log_path)).read_text()
        lines = [line for line in text.splitlines() if line.strip()]
        assert sum(f"{tag} record" in line for line in lines) == 20, text
        assert sum(line == f"{tag} print {i}" for i in range(20) for line in lines) == 20, text
        others = [other for other in jobs if other != tag]
        assert not [line for line in lines if any(other in line for other in others)], text


@processes_db
@pytest.mark.slow
def test_an_operator_cancels_an_async_job_and_a_failing_one_records_its_error(processes, env, tmp_path):
    path = tmp_path / "hang.jsonl"
    start_worker(processes, env)
    hung, _ = enqueue(f"{REF}:hang_async", args=[str(path)])
    wait_for(lambda: records(path), 20, message="the job to start")
    assert control.cancel_run(hung.pk)
    wait_for(lambda: any(r["event"] == "cancelled" for r in records(path)), 10, message="the job to be cancelled")
    assert finished(hung).state == "cancelled"
    failing, _ = enqueue(f"{REF}:fails_async")
    assert finished(failing).state == "failed"
    [(number, outcome, error)] = attempts(failing)
    assert (outcome, error) == ("failed", "ValueError: async boom")
    assert "async boom" in Attempt.objects.get(task_run__run=failing).traceback


@processes_db
@pytest.mark.slow
def test_without_in_process_places_async_and_thread_jobs_run_in_forked_children(processes, env):
    proc = start_worker(processes, env, inprocess=0, concurrency=1)
    runs = [enqueue(f"{REF}:{name}")[0] for name in ("pid_async", "pid_thread", "plain_job")]
    pids = []
    for run in runs:
        assert finished(run).state == "succeeded"
        pids.append(TaskRun.objects.get(run=run).result)
    assert proc.pid not in pids and all(pid != os.getpid() for pid in pids)


@processes_db
@pytest.mark.slow
def test_a_worker_with_in_process_places_runs_each_job_where_it_declared(processes, env):
    proc = start_worker(processes, env, inprocess=10, concurrency=1)
    # Interleaved, so that claims ahead of the child (short tasks, a backlog) take in-process jobs
    # beyond the host's free places too: those wait for a place, never for the child.
    names = ("plain_job", "pid_async", "pid_thread")
    runs = {name: [] for name in names}
    for _ in range(20):
        for name in names:
            runs[name].append(enqueue(f"{REF}:{name}")[0])
    pids = {}
    for name, group in runs.items():
        for run in group:
            assert finished(run).state == "succeeded"
        pids[name] = {TaskRun.objects.get(run=run).result for run in group}
    [host] = pids["pid_async"]
    assert pids["pid_thread"] == {host}  # the in-process jobs share one host process
    assert host not in pids["plain_job"] and proc.pid not in pids["plain_job"] | {host}


@processes_db
@pytest.mark.slow
def test_sigterm_lets_in_process_jobs_finish_and_hands_back_what_outlives_the_grace(processes, env, tmp_path):
    path = tmp_path / "hang.jsonl"
    proc = processes.start("worker", "--queues", "default", "--concurrency", "1", "--inprocess", "10",
                           "--grace", "1", env=env)
    wait_for(lambda: Worker.objects.filter(pid=proc.pid, state="running").exists(), 20, message="the worker")
    wait_for(lambda: "in-process executor ready" in processes.output(proc), 20, message="the host to be ready")
    hung, _ = enqueue(f"{REF}:hang_async", args=[str(path)], max_attempts=1)
    wait_for(lambda: records(path), 20, message="the job to start")
    assert processes.stop(proc, signal.SIGTERM, timeout=15) == 0
    task_run = TaskRun.objects.get(run=hung)
    # Due again at once, the interrupted attempt not counted against its one allowed attempt.
    assert (task_run.state, task_run.max_attempts) == ("scheduled", 2)
    [(number, outcome, error)] = attempts(hung)
    assert outcome == "lost" and "interrupted: the worker shut down" in error
    assert Worker.objects.get(pid=proc.pid).state == "stopped"


@processes_db
@pytest.mark.slow
def test_a_job_that_ends_the_host_fails_with_the_jobs_beside_it_and_a_new_host_runs_the_next(processes, env, tmp_path):
    path = tmp_path / "hang.jsonl"
    start_worker(processes, env)
    beside, _ = enqueue(f"{REF}:hang_async", args=[str(path)])
    wait_for(lambda: records(path), 20, message="the job beside it to start")
    crash, _ = enqueue(f"{REF}:exit_host")
    for run in (crash, beside):
        assert finished(run).state == "failed"
        [(number, outcome, error)] = attempts(run)
        assert outcome == "failed" and "ended unexpectedly (exit code 3)" in error
    after, _ = enqueue(f"{REF}:pid_async")
    assert finished(after).state == "succeeded"
    assert TaskRun.objects.get(run=after).result != records(path)[0]["pid"]
