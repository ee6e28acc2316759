"""The in-process executors (``@job(executor="async"/"thread")``) in real worker processes on the
test database: timeouts, crashes by real signals, logs per job, and the decorator's checks."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from django.test.utils import override_settings

from orchestrator import control, logs
from orchestrator.executor import READY
from orchestrator.jobs import enqueue
from orchestrator.models import Attempt, Run, TaskRun, Worker
from orchestrator.registry import executor_of, job
from orchestrator.worker import Worker as WorkerRole
from tests import inprocess_jobs
from tests.conftest import process_env, wait_for

REF = "tests.inprocess_jobs"
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


# --- the decorator ----------------------------------------------------------------------------


def test_the_async_executor_refuses_a_plain_function_at_definition():
    with pytest.raises(TypeError, match=r"executor='async'.*needs an 'async def' function.*plain_sync"):
        @job(executor="async")
        def plain_sync():
            pass


def test_the_thread_executor_refuses_an_async_function_at_definition():
    with pytest.raises(TypeError, match=r"executor='thread'.*coroutine_thread.*is 'async def'"):
        @job(executor="thread")
        async def coroutine_thread():
            pass


def test_an_unknown_executor_is_refused_naming_the_choices():
    with pytest.raises(TypeError, match=r"one of 'process', 'async', 'thread', got 'celery'"):
        job(executor="celery")


def test_each_job_keeps_the_executor_it_declared():
    assert executor_of(f"{REF}:hang_async") == "async"
    assert executor_of(f"{REF}:hang_thread") == "thread"
    assert executor_of(f"{REF}:plain_job") == "process"
    assert inprocess_jobs.plain_job.__name__ == "plain_job"  # the decorator returns the function itself


# --- where a worker places what it claimed (fake children, no process, no database) -------------


class FakeConn:
    def __init__(self):
        self.sent, self.inbox = [], []

    def send(self, message):
        self.sent.append(message)

    def poll(self):
        return bool(self.inbox)

    def recv(self):
        if not self.inbox:
            raise EOFError
        return self.inbox.pop(0)

    def close(self):
        pass


class FakeChildren:
    def __init__(self, first_pid):
        self.next_pid, self.conns, self.killed = first_pid, {}, []

    def fork(self):
        self.next_pid += 1
        self.conns[self.next_pid] = FakeConn()
        return self.next_pid, self.conns[self.next_pid]

    def kill(self, pid):
        self.killed.append(pid)

    def exited(self, pid):
        return pid in self.killed

    def how_it_ended(self, pid):
        return "signal 9"


class FakeLoop:
    def __init__(self):
        self.watched = {}

    def watch(self, conn, callback):
        self.watched[id(conn)] = callback

    def unwatch(self, conn):
        self.watched.pop(id(conn), None)

    def wake(self, conn):
        self.watched[id(conn)](conn)


def ready_worker(children=1, places=10):
    """A worker whose children and in-process host are forked (fakes) and said they are ready."""
    worker = WorkerRole(["default"], concurrency=children, inprocess=places)
    worker.pool.children, worker.inprocess.children = FakeChildren(100), FakeChildren(900)
    worker.loop = loop = FakeLoop()
    worker.pool.start(loop)
    worker.inprocess.start(loop)
    for conn in [*worker.pool.children.conns.values(), *worker.inprocess.children.conns.values()]:
        conn.inbox.append(READY)
        loop.wake(conn)
    return worker


def message(task_run_id, fn, timeout=None):
    return {"id": task_run_id, "run_id": task_run_id, "task": fn, "number": 1, "timeout": timeout,
            "spec": {"kind": "python", "call": "job", "ref": f"{REF}:{fn}", "args": [], "kwargs": {}}}


def test_a_worker_offers_in_process_places_as_far_as_its_claims_found_in_process_jobs():
    worker = ready_worker(children=1, places=10)
    # Nothing known yet: the idle child and one place, to find out.
    assert worker.capacity() == 2
    worker.place([message(1, "pid_async"), message(2, "pid_async")])
    host = worker.inprocess.host
    assert [[m["id"] for m in sent] for sent in host.conn.sent] == [[1, 2]]  # on the host in one message
    assert worker.pool.idle_slots()  # the child still idle
    # Half the latest claims were in-process jobs: half the 8 free places, and the idle child.
    assert worker.inprocess_share == 0.5 and worker.capacity() == 1 + 4
    worker.place([message(3, "pid_thread")] * 1)
    assert worker.inprocess_share == 0.75 and worker.capacity() == 1 + round(7 * 0.75)


def test_without_places_a_worker_claims_for_its_idle_children_and_runs_every_job_there():
    worker = ready_worker(children=2, places=0)
    assert worker.inprocess.host is None and worker.capacity() == 2
    worker.place([message(1, "pid_async"), message(2, "pid_thread")])
    assert sorted(slot.message["id"] for slot in worker.pool.slots) == [1, 2] and worker.held == []
    assert worker.capacity() == 0


def test_an_in_process_job_beyond_the_free_places_takes_an_idle_child():
    worker = ready_worker(children=1, places=1)
    worker.place([message(1, "pid_async"), message(2, "pid_async")])
    assert [[m["id"] for m in sent] for sent in worker.inprocess.host.conn.sent] == [[1]]
    assert [slot.message["id"] for slot in worker.pool.slots] == [2]


def test_default_jobs_claimed_for_in_process_places_wait_for_a_child_and_stop_further_offers():
    worker = ready_worker(children=1, places=10)
    worker.place([message(1, "plain_job"), message(2, "plain_job")])
    [slot] = worker.pool.slots
    assert slot.message["id"] == 1 and [m["id"] for m in worker.held] == [2]
    assert worker.inprocess_share == 0.0
    # While a job waits for a child, a claim takes nothing: no idle child, no place offered.
    assert worker.capacity() == 0
    # The child's outcome frees it: the held job starts there, and places are offered again.
    worker.pool.children.conns[slot.pid].inbox.append((1, 1, "succeeded", None, "", "", "", None, ""))
    worker.loop.wake(slot.conn)
    worker.start_held()
    assert slot.message["id"] == 2 and worker.held == []
    assert worker.capacity() == 1  # one place, to find in-process jobs; the child is busy


def test_an_overdue_thread_job_retires_its_host_and_an_overdue_async_job_is_cancelled():
    worker = ready_worker(children=1, places=10)
    worker.place([message(1, "hang_async", timeout=1.0), message(2, "hang_thread", timeout=5.0)])
    first = worker.inprocess.host
    ended = worker.inprocess.overdue(float("inf"))
    assert sorted(m["id"] for m in ended) == [1, 2]
    assert {"cancel": 1} in first.conn.sent  # the async job is cancelled where it runs
    # The stuck thread's host ran nothing else: killed, and a fresh one takes the next jobs.
    assert first.pid in worker.inprocess.children.killed
    assert worker.inprocess.host is not first and worker.inprocess.hosts == [worker.inprocess.host]


def test_a_host_with_a_stuck_thread_finishes_its_other_jobs_before_it_is_killed():
    worker = ready_worker(children=1, places=10)
    replies = []
    worker.inprocess.on_reply = lambda message, reply: replies.append(message["id"])
    worker.place([message(1, "hang_thread", timeout=1.0), message(2, "pid_async")])
    first = worker.inprocess.host
    worker.inprocess.overdue(10**9)
    assert first.retiring and first.pid not in worker.inprocess.children.killed  # job 2 still runs there
    first.conn.inbox.append([(2, 1, "succeeded", "7", "", "", "", None, "")])
    worker.loop.wake(first.conn)
    assert replies == [2] and first.pid in worker.inprocess.children.killed


def test_after_a_sync_the_host_is_replaced_once_its_jobs_ended():
    worker = ready_worker(children=1, places=10)
    worker.place([message(1, "pid_async")])
    first = worker.inprocess.host
    worker.inprocess.recycle(first.generation + 1)
    assert first.retiring and worker.inprocess.host is not first
    assert first.pid not in worker.inprocess.children.killed  # its job still runs
    first.conn.inbox.append([(1, 1, "succeeded", "7", "", "", "", None, "")])
    worker.loop.wake(first.conn)
    assert first.pid in worker.inprocess.children.killed and worker.inprocess.hosts == [worker.inprocess.host]


# --- in real workers -----------------------------------------------------------------------------

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
    runs = {name: [enqueue(f"{REF}:{name}")[0] for _ in range(6)] for name in ("plain_job", "pid_async", "pid_thread")}
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
