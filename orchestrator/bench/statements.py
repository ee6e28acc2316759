"""The ``statements`` section: where a no-op job's time goes, per 1,000 jobs, on the forked default
and on the async executor (2 workers each, as the peers section runs them):

- the database's side, from ``pg_stat_statements``: per statement, its calls, the rows it
  returned or wrote and its execution time (statements run by the task-run triggers are listed
  too, marked "nested": their time is also in the statement that fired them);
- the CPU of each kind of process (the worker parents, their children and hosts, the dispatcher,
  the PostgreSQL backends of the benchmark database), read from /proc: what the two cores did.

The jobs are enqueued while the workers run (``jobs.enqueue_many``, 500 per statement, as the
peers section does; this process's CPU for it is "enqueuing"), so the workers run at full speed.

``pg_stat_statements`` must be loaded by the server (``shared_preload_libraries``); without it the
section says so and gives the CPU figures alone. The section creates the extension in the
benchmark database and tracks nested statements there (``ALTER DATABASE ... SET
pg_stat_statements.track = 'all'``): superuser rights.
"""

from __future__ import annotations

import re
import time

from django.db import connection

from orchestrator.bench import core, iobound
from orchestrator.bench import jobs as bench_jobs  # noqa: F401 - registers the no-op jobs this process enqueues

# Names for the statements a job's path sends (the first pattern found in the normalised text).
NAMES = (
    ("INSERT INTO orchestrator_taskruncount", "count trigger: taskruncount insert"),
    ("FROM new_rows n JOIN old_rows o", "count trigger: taskruncount insert (update)"),
    ("WITH RECURSIVE admitted", "worker: claim (CLAIM)"),
    ("WITH l AS MATERIALIZED", "worker: end attempts (END_TASK_RUNS)"),
    ("INSERT INTO \"orchestrator_run\"", "enqueue: runs and task runs"),
    ("INSERT INTO orchestrator_run", "enqueue: runs and task runs"),
    ("SET LOCAL", "worker: transaction settings"),
    ("orchestrator_worker", "heartbeat / worker row"),
    ("pg_notify", "notify"),
    ("LISTEN", "listen"),
)


def _name(query: str) -> str:
    for pattern, name in NAMES:
        if pattern in query:
            return name
    return re.sub(r"\s+", " ", query).strip()[:70]


def available() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('shared_preload_libraries')")
        return "pg_stat_statements" in cursor.fetchone()[0]


def _prepare_extension() -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        cursor.execute(f"ALTER DATABASE \"{core.BENCH_DB}\" SET pg_stat_statements.track = 'all'")


# Per statement of the benchmark database since the reset: (query, top level, calls, rows, ms,
# shared buffers touched, bytes of WAL). The last two are counts, which a busy machine does not
# move as it moves the time: read them when the times of two versions overlap.
READ = """
SELECT query, toplevel, sum(calls)::bigint, sum(rows)::bigint, sum(total_exec_time),
       sum(shared_blks_hit + shared_blks_read)::bigint, sum(wal_bytes)::bigint
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY 1, 2
"""


def _statements() -> list[tuple[str, bool, int, int, float, int, int]]:
    with connection.cursor() as cursor:
        cursor.execute(READ)
        return cursor.fetchall()


def cpu_by_kind(roles: core.Roles) -> dict[str, float]:
    """CPU seconds so far per process kind: the worker parents, their children (forked children and
    hosts), the dispatcher, the benchmark database's backends (by pid) and this process."""
    dispatcher, workers = roles.procs[0].pid, [proc.pid for proc in roles.procs[1:]]
    return {"worker": sum(iobound._cpu_seconds(pid) for pid in workers),
            "children": sum(iobound._cpu_seconds(child) for pid in workers for child in iobound._children(pid)),
            "dispatcher": iobound._cpu_seconds(dispatcher),
            "backends": {pid: iobound._cpu_seconds(pid) for pid in iobound._backends()},
            "enqueuing": time.process_time()}


def measure(kind: str, n: int, processes: int, concurrency: int, places: int, statements: bool) -> dict:
    """n no-op jobs of one executor ("process" or "async") run by ``processes`` workers, enqueued
    while they run (``jobs.enqueue_many``, 500 per statement, as the peers section does): jobs
    done, seconds, CPU seconds per process kind, and the statements' figures."""
    ref = "orchestrator.bench.jobs:noop_async" if kind == "async" else "orchestrator.bench.jobs:noop"
    core.reset_work()
    roles = core.Roles()
    try:
        roles.start("dispatcher")
        if kind == "async":
            roles.workers(processes, 1, inprocess=places)
        else:
            roles.workers(processes, concurrency)
        time.sleep(0.5)  # the children or hosts forked and ready
        if statements:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_statements_reset()")
        before = cpu_by_kind(roles)
        started = time.time()
        for offset in range(0, n, 500):
            core.enqueue_jobs(min(500, n - offset), ref=ref)
        enqueuing = time.process_time() - before["enqueuing"]
        deadline = time.monotonic() + 180
        while core.unfinished() and time.monotonic() < deadline:
            time.sleep(0.05)
        after = cpu_by_kind(roles)
        done = core.count_done()
        elapsed = core.last_finish() - started
    finally:
        roles.stop()
    cpu = {key: after[key] - before[key] for key in ("worker", "children", "dispatcher")}
    # The worker's connections now (a fork closes them), those it had before counted from then.
    cpu["backends"] = sum(seconds - before["backends"].get(pid, 0.0) for pid, seconds in after["backends"].items())
    cpu["enqueuing"] = enqueuing
    return {"done": done, "elapsed": elapsed, **cpu, "statements": _statements() if statements else []}


def run(out, n: int = 20000, concurrency: int = 16, processes: int = 2, places: int | None = None,
        top: int = 14) -> None:
    places = places or iobound.ASYNC_PLACES
    statements = available()
    if statements:
        _prepare_extension()
    else:
        out("  pg_stat_statements is not loaded by this server (shared_preload_libraries): CPU figures only")
    for kind, how in (("process", f"forked default, {processes} workers x {concurrency} children"),
                      ("async", f"async executor, {processes} workers x {places} in-process places")):
        m = measure(kind, n, processes, concurrency, places, statements)
        done = m["done"]
        per = 1000 / done if done else 0.0
        out(f"  {how}: {done} of {n} jobs in {m['elapsed']:.2f} s, {done / m['elapsed']:,.0f} jobs/s "
            f"; CPU s per 1,000 jobs: worker parents {m['worker'] * per:.3f}, their children "
            f"{m['children'] * per:.3f}, dispatcher {m['dispatcher'] * per:.3f}, PostgreSQL backends "
            f"{m['backends'] * per:.3f}, enqueuing {m['enqueuing'] * per:.3f}")
        if not m["statements"]:
            continue
        merged: dict[tuple[str, bool], list] = {}
        for query, toplevel, *counted in m["statements"]:
            figures = merged.setdefault((_name(query), toplevel), [0, 0, 0.0, 0, 0])
            for i, value in enumerate(counted):
                figures[i] += value or 0
        top_level = [figures for (_, toplevel), figures in merged.items() if toplevel]
        calls, _, total, buffers, wal = (sum(f[i] for f in top_level) for i in range(5))
        out(f"    statements per 1,000 jobs: {calls * per:,.0f} top-level calls, {total * per:,.0f} ms executing, "
            f"{buffers * per:,.0f} buffers touched, {wal * per / 1024:,.0f} kB of WAL; the {top} costliest "
            f"(calls, rows, ms, buffers, kB of WAL):")
        for (name, toplevel), (c, r, ms, b, w) in sorted(merged.items(), key=lambda item: -item[1][2])[:top]:
            out(f"      {c * per:>8,.0f} {r * per:>9,.0f} {ms * per:>8,.1f} {b * per:>9,.0f} {w * per / 1024:>7,.0f}  "
                f"{name}{'' if toplevel else ' (nested)'}")
