"""Helpers of the workflow-feature tests: sync a module of workflows from a throwaway package,
run a run to its end in this process (dispatcher ticks, claims and completions like a worker's),
and tick the scheduler with an injected clock."""

from orchestrator import dispatcher
from orchestrator.models import Workflow
from orchestrator.scheduler import Scheduler
from orchestrator.worker import Worker as WorkerLoop
from tests.test_execution_rules import execute_claimed
from tests.test_sync import Folder


def sync_module(tmp_path, source: str, name: str = "mod") -> dict[str, Workflow]:
    folder = Folder(tmp_path)
    folder.write(name, source)
    report = folder.sync()
    assert report.ok, report
    return {wf.name: wf for wf in Workflow.objects.all()}


def worker_loop() -> WorkerLoop:
    worker = WorkerLoop(["default"], concurrency=4)
    worker.register()
    return worker


def run_to_end(run, clock, loop, rounds: int = 50):
    """Dispatch and execute in this process until nothing is due now; returns the run, reloaded."""
    for _ in range(rounds):
        dispatcher.tick(now=clock.now())
        if not execute_claimed(loop, 10, clock):
            break
    run.refresh_from_db()
    return run


def scheduler_tick(clock) -> bool:
    return Scheduler(clock=clock, holder="test", maintenance=[]).tick()
