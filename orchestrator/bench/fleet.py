"""What a fleet costs the database, for ``manage.py bench`` (section ``fleet``).

N worker processes of concurrency 1 (1, 4, 16 and 64 by default; most of them idle) serve one
queue while jobs arrive at a steady rate (50 a second by default), each its own transaction and
notification. For each N it prints the database transactions per job, from the server's own
count (``pg_stat_database.xact_commit`` of the benchmark database, read again only after every
backend has reported: PostgreSQL flushes a backend's counts at most once a second, and an idle
one's within ten), the fleet's idle cost (its transactions a second before the jobs arrive:
heartbeats and the turning poll), the per-job figure net of that idle cost, the jobs completed per
second and the start delay (p50 / p99). Flat in N is the target: the cost of a job must not
follow the number of workers that could have run it.

The workers are forked from one process that set Django up once (``main``, run by ``manage.py
shell``): 64 interpreters each importing Django would take most of a minute on a small machine,
and their memory would not fit a small one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from django.db import connection, connections

from orchestrator.bench.core import BENCH_DB, ROOT, Roles, child_env, reset_work
from orchestrator.bench.load import STAMP, _quantiles, _stages, enqueue
from orchestrator.worker import Worker

# PostgreSQL reports an idle backend's transaction counts within this long (PGSTAT_IDLE_INTERVAL).
STATS_SETTLE_SECONDS = 10.5


def _committed() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [BENCH_DB])
        return cursor.fetchone()[0]


def _running_workers() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM orchestrator_worker WHERE state = 'running'")
        return cursor.fetchone()[0]


def _succeeded_since(since) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM orchestrator_taskrun WHERE state = 'succeeded' AND created_at >= %s",
                       [since])
        return cursor.fetchone()[0]


def start_fleet(roles: Roles, workers: int) -> None:
    code = f"import sys; from orchestrator.bench.fleet import main; sys.exit(main([{workers}]))"
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "shell", "-c", code], cwd=ROOT,
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    roles.procs.append(proc)
    deadline = time.monotonic() + 120
    while _running_workers() < workers:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"the benchmark's {workers} workers did not start within 120 s")
        time.sleep(0.1)


def measure(out, workers: int, rate: float, seconds: float) -> dict:
    from orchestrator import clock

    reset_work()
    roles = Roles()
    try:
        start_fleet(roles, workers)
        time.sleep(STATS_SETTLE_SECONDS)  # start-up counted and reported: the fleet is idle
        idle_from, idle_began = _committed(), time.monotonic()
        time.sleep(STATS_SETTLE_SECONDS)
        idle_to = _committed()
        idle_rate = (idle_to - idle_from - 1) / (time.monotonic() - idle_began)
        since = clock.now()
        total = int(rate * seconds)
        began = time.monotonic()
        for i in range(total):
            time.sleep(max(0.0, began + i / rate - time.monotonic()))
            enqueue(1, STAMP)
        deadline = time.monotonic() + 60
        reads = 1
        while (done := _succeeded_since(since)) < total and time.monotonic() < deadline:
            reads += 1
            time.sleep(0.02)
        finished = time.monotonic()
        time.sleep(STATS_SETTLE_SECONDS)
        window = time.monotonic() - began
        committed = _committed() - idle_to
    finally:
        roles.stop()
    # Less this process's own transactions: the enqueues, its reads of "done" and of the count.
    fleet_commits = max(0, committed - total - reads - 1)
    per_job = fleet_commits / done if done else float("nan")
    net = (fleet_commits - idle_rate * window) / done if done else float("nan")
    delays = [(started - created) * 1000 for created, _, _, started in _stages(since, 0)]
    p50, p99, _ = _quantiles(delays)
    out(f"  {workers:>3} workers x 1: {per_job:5.2f} transactions/job ({net:5.2f} net of the idle "
        f"{idle_rate:5.1f}/s), {done / (finished - began):5.1f} jobs/s of {rate:g} arriving, "
        f"start delay p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    return {"per_job": per_job, "net_per_job": net, "idle_per_s": idle_rate, "jobs_per_s": done / (finished - began),
            "p50_ms": p50, "p99_ms": p99}


def run(out, workers=(1, 4, 16, 64), rate: float = 50.0, seconds: float = 5.0) -> dict:
    out(f"  jobs arrive at {rate:g}/s for {seconds:g} s, one transaction and notification each; the count is "
        f"the server's (pg_stat_database.xact_commit), the arrivals' own enqueues and reads left out")
    return {n: measure(out, n, rate, seconds) for n in workers}


def main(argv: list) -> int:
    """Fork N workers of concurrency 1 from this process (Django set up); SIGTERM to the group
    drains them."""
    count = int(argv[0])
    connections.close_all()  # no connection may be shared by the forks
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                Worker(["default"], concurrency=1, grace=2).serve()
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the workers got the group's SIGTERM themselves
    failed = sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in pids)
    return 1 if failed else 0

