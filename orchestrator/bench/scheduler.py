"""The scheduler's figures for ``manage.py bench --only scheduler`` (on the benchmark database):

1. insert: the leader inserting the runs of 10,000 schedules due in the same minute, in one tick
   (runs and their task runs, ON CONFLICT DO NOTHING, next fire times advanced);
2. failover: two real ``manage.py scheduler`` processes, SIGKILL of the leader, time until the
   standby holds the lease, with the default 15 s lease and, for reference, a 3 s lease.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.db import connection

from orchestrator.clock import FakeClock
from orchestrator.models import Lease, Run, Schedule, Workflow, WorkflowVersion
from orchestrator.scheduler import Scheduler

ROOT = Path(__file__).resolve().parent.parent.parent
SPEC = {"params": {}, "tasks": {"noop": {"kind": "python", "ref": "workflows.jobs:noop", "upstream": []}}}


def _workflow() -> Workflow:
    workflow, _ = Workflow.objects.get_or_create(name="bench_scheduler")
    version, _ = WorkflowVersion.objects.get_or_create(workflow=workflow, number=1,
                                                       defaults={"hash": "bench", "spec": SPEC})
    Workflow.objects.filter(pk=workflow.pk).update(current_version=version, paused=False, present=True)
    workflow.refresh_from_db()
    return workflow


def _cleanup(workflow: Workflow) -> None:
    # Plain deletes: the ORM's cascade collector would fetch 10,000 rows of every related table first.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM orchestrator_taskrun WHERE run_id IN"
                       " (SELECT id FROM orchestrator_run WHERE workflow_id = %s)", [workflow.pk])
        cursor.execute("DELETE FROM orchestrator_run WHERE workflow_id = %s", [workflow.pk])
        cursor.execute("DELETE FROM orchestrator_schedule WHERE workflow_id = %s", [workflow.pk])


def bench_insert(out, count: int) -> float:
    workflow = _workflow()
    _cleanup(workflow)
    minute = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    Schedule.objects.bulk_create(
        [Schedule(workflow=workflow, name=f"s{i}", cron="0 * * * *", next_fire_at=minute) for i in range(count)],
        batch_size=2000)
    Lease.objects.filter(name="scheduler").delete()
    scheduler = Scheduler(clock=FakeClock(minute + timedelta(seconds=1)), holder="bench", maintenance=[])
    started = time.perf_counter()
    scheduler.tick()
    elapsed = time.perf_counter() - started
    created = Run.objects.filter(workflow=workflow, logical_date=minute).count()
    advanced = Schedule.objects.filter(workflow=workflow, next_fire_at=minute + timedelta(hours=1)).count()
    out(f"  insert: {created:,} runs (+{created:,} task runs) for {count:,} schedules due in the same minute "
        f"in {elapsed:.2f} s, {created / elapsed:,.0f} runs/s; {advanced:,} schedules advanced")
    scheduler.lease.release()
    _cleanup(workflow)
    return elapsed


def _leader_pid() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT holder FROM orchestrator_lease WHERE name = 'scheduler' AND expires_at > clock_timestamp()")
        row = cursor.fetchone()
    return int(row[0].split(":")[1]) if row else None


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def bench_failover(out, lease_seconds: float, env_factory) -> float:
    Lease.objects.filter(name="scheduler").delete()
    # INFO: the "standby" line of the second process is how the benchmark knows it is up.
    env = env_factory(ORCHESTRATOR_LEASE_SECONDS=lease_seconds, LOG_LEVEL="INFO")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        def start(name):
            log = open(Path(tmp) / f"{name}.log", "wb")  # noqa: SIM115 - closed with the directory
            proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "scheduler"], cwd=ROOT, env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            proc.log_path = Path(tmp) / f"{name}.log"
            procs.append(proc)
            return proc

        try:
            first = start("first")
            _wait(lambda: _leader_pid() == first.pid, 60, "the first scheduler to lead")
            second = start("second")
            _wait(lambda: "standby" in second.log_path.read_text(errors="replace"), 60, "the second to stand by")
            time.sleep(lease_seconds / 3)  # a renewal or two: the kill lands anywhere in the renewal cycle
            first.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            _wait(lambda: _leader_pid() == second.pid, lease_seconds + 30, "the standby to take over")
            takeover = time.monotonic() - killed
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    out(f"  failover: standby leads {takeover:.2f} s after SIGKILL of the leader (lease {lease_seconds:g} s, "
        f"renewed every {lease_seconds / 3:.1f} s, standby retries every 1 s)")
    return takeover


def run(out, schedules: int = 10000, leases=(15, 3), env_factory=None) -> dict:
    if env_factory is None:
        from orchestrator.bench.core import child_env

        env_factory = child_env
    figures = {"insert_seconds": bench_insert(out, schedules)}
    for lease_seconds in leases:
        figures[f"failover_{lease_seconds:g}s"] = bench_failover(out, lease_seconds, env_factory)
    return figures
