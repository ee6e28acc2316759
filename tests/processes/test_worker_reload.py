"""A running worker picks up changed code without a restart: after a sync (a new code generation)
its children are replaced by fresh forks that run the code on disk, busy ones only once their
task ended; with --max-tasks-per-child a child is replaced after its share of tasks. Its pool is
elastic: it forks children up to --concurrency when work waits and lets the extra ones exit after
idling. Real worker and dispatcher processes on the test database, modules written to a
temporary folder."""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import override_settings

from orchestrator import reload
from orchestrator.models import Run, TaskRun, Worker, Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from orchestrator.worker import Slot
from orchestrator.worker import Worker as WorkerLoop
from tests.conftest import alive, process_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {
    "ORCHESTRATOR_HEARTBEAT_SECONDS": "0.5",
    "ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS": "30",
    "ORCHESTRATOR_POLL_SECONDS": "0.5",
    "PYTHONDONTWRITEBYTECODE": "1",
}

JOBS = """
import os
import time
from pathlib import Path

from orchestrator.registry import job
from {helper} import HELPED

VALUE = {value!r}


@job
def value():
    return {{"value": VALUE, "helped": HELPED, "pid": os.getpid(), "worker": os.getppid()}}


@job
def value_after_gate(gate, started):
    Path(started).write_text(str(os.getpid()))
    deadline = time.monotonic() + 30
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return {{"value": VALUE, "pid": os.getpid()}}
"""

HELPER = "HELPED = {value!r}\n"


class Code:
    """Modules of one test in a temporary folder on the workers' path, each with a unique name:
    a job module, the helper it imports, and a package of workflow modules."""

    def __init__(self, tmp_path):
        self.root = tmp_path / "code"
        self.root.mkdir()
        tag = uuid.uuid4().hex[:8]
        self.jobs, self.helper, self.package = f"reload_jobs_{tag}", f"reload_helper_{tag}", f"reload_flows_{tag}"
        (self.root / self.package).mkdir()
        (self.root / self.package / "__init__.py").write_text("")
        self.imports = tmp_path / "imports.txt"  # pid of each process that imported the workflow module
        self.write_jobs("one")
        self.write_helper("helper one")

    def write_jobs(self, value: str, extra: str = "") -> None:
        # A different length each time, so no cached bytecode of the old text can pass for the new.
        (self.root / f"{self.jobs}.py").write_text(JOBS.format(helper=self.helper, value=value) + extra)

    def write_helper(self, value: str) -> None:
        (self.root / f"{self.helper}.py").write_text(HELPER.format(value=value))

    def write_workflow(self, value: str) -> None:
        (self.root / self.package / "flow.py").write_text(textwrap.dedent(f"""
            import os

            from orchestrator.dsl import Workflow

            if os.environ.get("RELOAD_IMPORTS"):
                with open(os.environ["RELOAD_IMPORTS"], "a") as handle:
                    handle.write(f"{{os.getpid()}}\\n")

            flow = Workflow("{self.package}")


            @flow.task
            def which(ctx):
                return {{"value": {value!r}, "pid": os.getpid(), "worker": os.getppid()}}
        """))

    def sync(self):
        return sync_workflows(directory=self.root / self.package, package=self.package)

    def job(self, fn: str, *args) -> dict:
        return {"kind": "python", "ref": f"{self.jobs}:{fn}", "call": "job", "args": list(args)}

    def env(self, data_dir, **extra) -> dict:
        return process_env(
            ORCHESTRATOR_DATA_DIR=str(data_dir), PYTHONPATH=str(self.root), RELOAD_IMPORTS=str(self.imports),
            ORCHESTRATOR_JOB_MODULES=f"workflows.jobs,tests.support.tasks_for_tests,{self.jobs}", **FAST, **extra,
        )


@pytest.fixture
def code(tmp_path):
    with override_settings(ORCHESTRATOR_DATA_DIR=tmp_path / "data"):
        yield Code(tmp_path)


def start(processes, code, tmp_path, *args, **extra):
    env = code.env(tmp_path / "data", **extra)
    processes.start("dispatcher", env=env)
    proc = processes.start("worker", "--queues", "default", *args, env=env)
    wait_for(lambda: Worker.objects.filter(pid=proc.pid, state="running").exists(), 20, message="the worker to register")
    return proc


def run_job(code, fn: str, *args) -> Run:
    run, _ = create_run(None, trigger="job", tasks={fn: code.job(fn, *args)})
    return run


def result(run, timeout=20.0):
    wait_for(lambda: Run.objects.values_list("state", flat=True).get(pk=run.pk) not in ("pending", "running"),
             timeout, message=f"run {run.pk} to finish")
    task_run = TaskRun.objects.get(run=run)
    assert (task_run.state, task_run.attempts) == ("succeeded", 1), (task_run.state, task_run.error)
    return task_run.result


def said(processes, proc, text: str, timeout=15.0) -> bool:
    return wait_for(lambda: text in processes.output(proc), timeout, message=f"the worker to log {text!r}")


def test_a_sync_makes_the_running_worker_run_the_changed_workflow_task(processes, code, tmp_path):
    code.write_workflow("version one")
    code.sync()
    worker = start(processes, code, tmp_path, "--concurrency", "1")
    workflow = Workflow.objects.get(name=code.package)
    first = result(create_run(workflow, trigger="manual")[0])
    assert first["value"] == "version one" and first["worker"] == worker.pid

    code.write_workflow("version two, changed")
    code.sync()
    # The next run, on the same worker process, runs the new code, in a fresh child.
    second = result(create_run(workflow, trigger="manual")[0])
    assert second["value"] == "version two, changed"
    assert second["worker"] == worker.pid and worker.poll() is None
    assert second["pid"] != first["pid"]
    # Only the children imported the workflow module, never the worker itself.
    importers = {int(line) for line in code.imports.read_text().split()}
    assert importers == {first["pid"], second["pid"]} and worker.pid not in importers


def test_a_sync_makes_the_running_worker_import_a_changed_job_module_and_its_helper_again(processes, code, tmp_path):
    worker = start(processes, code, tmp_path, "--concurrency", "2")
    first = result(run_job(code, "value"))
    assert (first["value"], first["helped"]) == ("one", "helper one")

    code.write_helper("helper two, changed")  # the job module itself is unchanged
    code.sync()
    second = result(run_job(code, "value"))
    assert (second["value"], second["helped"]) == ("one", "helper two, changed")

    code.write_jobs("three, changed")
    code.sync()
    third = result(run_job(code, "value"))
    assert (third["value"], third["helped"]) == ("three, changed", "helper two, changed")
    assert first["worker"] == second["worker"] == third["worker"] == worker.pid


def test_a_child_is_replaced_after_max_tasks_per_child_and_no_task_is_lost(processes, code, tmp_path):
    worker = start(processes, code, tmp_path, "--concurrency", "1", "--max-tasks-per-child", "2")
    runs = [run_job(code, "value") for _ in range(5)]
    pids = [result(run)["pid"] for run in runs]  # each succeeded with exactly one attempt
    assert len(set(pids)) >= 3, pids
    # One child runs at most two of them.
    assert max(pids.count(pid) for pid in pids) <= 2
    # The replaced children were reaped: one live child, no zombie.
    wait_for(lambda: len(states := children(worker.pid)) == 1 and "Z" not in states, 10,
             message="the worker to have one child and no zombie")


def children(pid: int) -> list[str]:
    """The states (R, S, Z...) of the child processes of ``pid``."""
    states = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            if int(fields[1]) == pid:
                states.append(fields[0])
    return states


def test_max_tasks_per_child_comes_from_the_setting_and_must_not_be_negative(settings):
    settings.ORCHESTRATOR_WORKER_MAX_TASKS_PER_CHILD = 7
    assert WorkerLoop(["default"]).pool.max_tasks_per_child == 7
    assert WorkerLoop(["default"], max_tasks_per_child=0).pool.max_tasks_per_child == 0
    with pytest.raises(ValueError, match="--max-tasks-per-child must be 0"):
        WorkerLoop(["default"], max_tasks_per_child=-1)


def test_a_sync_leaves_a_running_task_alone_and_it_finishes_with_the_old_code(processes, code, tmp_path):
    gate, started = tmp_path / "gate", tmp_path / "started"
    worker = start(processes, code, tmp_path, "--concurrency", "2", "--min-children", "2")
    busy = run_job(code, "value_after_gate", str(gate), str(started))
    wait_for(lambda: started.exists() and started.read_text(), 20, message="the task to start")
    busy_pid = int(started.read_text())

    code.write_jobs("two, changed")
    report = code.sync()
    said(processes, worker, f"code generation {report.generation}: replacing 1 idle child process(es) now and "
                            "1 busy one(s) when their task ends")
    # The idle child runs the new code at once; the busy one was not killed.
    meanwhile = result(run_job(code, "value"))
    assert meanwhile["value"] == "two, changed" and meanwhile["pid"] != busy_pid
    assert alive(busy_pid)
    gate.write_text("open")
    assert result(busy) == {"value": "one", "pid": busy_pid}
    # Its child is replaced once its outcome is in.
    wait_for(lambda: not alive(busy_pid), 10, message="the busy child to be replaced after its task")
    after = [result(run_job(code, "value")) for _ in range(2)]
    assert all(r["value"] == "two, changed" and r["pid"] != busy_pid for r in after)


def test_a_worker_that_missed_the_notify_recycles_when_its_heartbeat_reads_the_generation(processes, code, tmp_path):
    worker = start(processes, code, tmp_path, "--concurrency", "1")
    first = result(run_job(code, "value"))
    code.write_jobs("two, changed")
    # A sync whose NOTIFY this worker never heard (a LISTEN reconnect, polling behind a pooler).
    with connection.cursor() as cursor:
        cursor.execute(reload.BUMP)
        generation = cursor.fetchone()[0]
    said(processes, worker, f"code generation {generation}: replacing 1 idle child process(es) now")
    second = result(run_job(code, "value"))
    assert second["value"] == "two, changed" and second["pid"] != first["pid"]


def test_a_job_module_that_no_longer_imports_is_logged_and_the_worker_keeps_running(processes, code, tmp_path):
    worker = start(processes, code, tmp_path, "--concurrency", "1")
    assert result(run_job(code, "value"))["value"] == "one"

    code.write_jobs("two, broken", extra="\ndef broken(:\n")
    code.sync()
    said(processes, worker, f"job module {code.jobs} could not be imported again (SyntaxError")
    # The worker survives; other jobs run, and the broken module's functions as registered at start.
    run, _ = create_run(None, trigger="job", tasks={"add": {"kind": "python", "ref": "tests.support.tasks_for_tests:add",
                                                            "call": "job", "args": [2, 3]}})
    assert result(run) == 5
    assert result(run_job(code, "value"))["value"] == "one"
    assert worker.poll() is None


def test_by_default_every_child_is_forked_ahead_and_none_idles_out(processes, code, tmp_path):
    # A fixed pool: no task waits for a fork when work arrives after a quiet spell.
    worker = start(processes, code, tmp_path, "--concurrency", "3")
    wait_for(lambda: len(children(worker.pid)) == 3, 10, message="three children forked ahead")
    assert result(run_job(code, "value"))["value"] == "one"
    loop = WorkerLoop(["default"], concurrency=3)
    assert loop.pool.min_children == 3
    loop.pool.slots = [Slot(pid=0, conn=None, ready=True, idle_since=0.0) for _ in range(3)]
    assert loop.pool.next_shrink() is None  # never below the minimum: nothing to shrink


def test_the_pool_grows_to_the_concurrency_when_work_waits_and_shrinks_back_after_idling(processes, code, tmp_path):
    gate = tmp_path / "gate"
    worker = start(processes, code, tmp_path, "--concurrency", "3", "--min-children", "1",
                   ORCHESTRATOR_WORKER_CHILD_IDLE_SECONDS="1")
    wait_for(lambda: len(children(worker.pid)) == 1, 10, message="one child forked ahead")
    markers = [tmp_path / f"started-{i}" for i in range(3)]
    runs = [run_job(code, "value_after_gate", str(gate), str(marker)) for marker in markers]
    # All three run at once (each waits for the gate), each in a child of its own.
    wait_for(lambda: all(m.exists() and m.read_text() for m in markers), 20, message="three tasks running at once")
    assert len({m.read_text() for m in markers}) == 3
    assert len(children(worker.pid)) == 3
    gate.write_text("open")
    assert all(result(run)["value"] == "one" for run in runs)
    # The two children above the minimum exit after a second without work, and are reaped.
    wait_for(lambda: len(states := children(worker.pid)) == 1 and "Z" not in states, 15,
             message="the pool to shrink back to one child")
    assert result(run_job(code, "value"))["value"] == "one"
