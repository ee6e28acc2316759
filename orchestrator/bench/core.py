"""The benchmark's ground: its database ``orchestrator_bench`` on the current server (dropped,
created and migrated at the start; the product's own data is never touched), the worker and
dispatcher processes it starts, what the sections print to, and the execution-path sections:

- jobs: no-op single-task jobs completed per second end to end (enqueue, dispatch, execute,
  record) with one and with two worker processes. Jobs are enqueued while the workers run, in
  batches of 500 by the product's own bulk path (``jobs.enqueue_many``: one statement per batch,
  what a bulk producer calls); the clock runs from the first enqueue to the last recorded
  success. Each line also gives the rows written per job (PostgreSQL's pg_stat_user_tables, read
  after the processes exited: inserts, updates and how many of those were HOT updates, which
  write no index) for the run, task run and attempt tables.
- latency: enqueue-to-start delay (the job's own first instruction) at a light steady load, one
  job per ``create_run`` transaction every 20 ms.
- dag: trigger-to-success wall time of a DAG of 1 + 200 parallel + 1 join tasks, and of a
  100-task chain.
- pg: PostgreSQL's own ceiling on the same server: a bare SKIP LOCKED claim-and-complete loop,
  one job per transaction and 100 per transaction, so each figure above reads as a ratio to it.

Which sections run, in what order: ``bench.sections``.
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections

from orchestrator.channels import wake_due
from orchestrator.conf import app_settings
from orchestrator.database_url import format_database_url

# Two benchmarks at once on one server would drop each other's database: name another one.
BENCH_DB = os.environ.get("ORCHESTRATOR_BENCH_DATABASE", "orchestrator_bench")
ROOT = Path(__file__).resolve().parent.parent.parent
JOBS_MODULE = "orchestrator.bench.jobs"


# --- the database ----------------------------------------------------------------------------------

def child_env(**extra) -> dict:
    """The environment of a process that works on the benchmark database."""
    env = dict(os.environ)
    env.update({"DATABASE_URL": format_database_url(connection.settings_dict, BENCH_DB), "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING", "DEBUG": "0",
                "SECRET_KEY": settings.SECRET_KEY or secrets.token_urlsafe(50),
                "ORCHESTRATOR_WEBHOOK_SECRET": app_settings.WEBHOOK_SECRET or secrets.token_urlsafe(50),
                "ORCHESTRATOR_DATA_DIR": str(app_settings.DATA_DIR),
                # The workers run this module's registered jobs.
                "ORCHESTRATOR_JOB_MODULES": ",".join([*app_settings.JOB_MODULES, JOBS_MODULE])})
    env.update({key: str(value) for key, value in extra.items()})
    return env


def _server_connection():
    import psycopg

    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding"):
        params.pop(key, None)
    params["dbname"] = "postgres"
    return psycopg.connect(**params, autocommit=True)


def prepare_database() -> None:
    """Drop and create the benchmark database, point this process at it, migrate."""
    connections.close_all()
    with _server_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    for alias in connections:
        connections[alias].settings_dict["NAME"] = BENCH_DB
    settings.DATABASES["default"]["NAME"] = BENCH_DB
    call_command("migrate", interactive=False, verbosity=0)


def reset_work() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE orchestrator_attempt, orchestrator_taskrun, orchestrator_webhookdelivery, "
                       "orchestrator_run, orchestrator_worker CASCADE")


# --- processes -------------------------------------------------------------------------------------

class Roles:
    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=child_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def workers(self, count: int, concurrency: int, inprocess: int = 0) -> None:
        """``count`` worker processes of ``concurrency`` children each (and ``inprocess`` places of
        the in-process executor), once they registered."""
        places = ["--inprocess", str(inprocess)] if inprocess else []
        for _ in range(count):
            self.start("worker", "--queues", "default", "--concurrency", str(concurrency), "--grace", "2", *places)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM orchestrator_worker WHERE state = 'running'")
                if cursor.fetchone()[0] >= count:
                    return
            time.sleep(0.05)
        raise RuntimeError("the benchmark's workers did not start within 30 s")

    def stop(self) -> None:
        import signal

        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []


# --- SQL -------------------------------------------------------------------------------------------

# Bulk enqueue: n job runs, then their task runs (scheduled, due now), then wake the dispatchers.
ENQUEUE_RUNS = """
INSERT INTO orchestrator_run (logical_date, trigger, params, tenant, priority, lane, state, reason,
                              payload_hash, created_at)
SELECT now(), 'job', '{}', 'default', 0, 0, 'running', '', '', now() FROM generate_series(1, %(n)s)
RETURNING id
"""
ENQUEUE_TASK_RUNS = """
INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, queue, priority, tenant, lane, attempts,
                                  max_attempts, due_at, error, created_at)
SELECT id, %(ref)s, 'scheduled', %(spec)s::jsonb, '{}', 'default', 0, 'default', 0, 0, 1, now(), '', now()
FROM unnest(%(ids)s::bigint[]) AS id
"""

# PostgreSQL's ceiling: the same claim and complete, on a bare table.
PG_SETUP = """
DROP TABLE IF EXISTS bench_queue;
CREATE TABLE bench_queue (id bigserial PRIMARY KEY, state text NOT NULL, payload jsonb);
CREATE INDEX bench_queue_queued ON bench_queue (id) WHERE state = 'queued';
"""
PG_FILL = "INSERT INTO bench_queue (state, payload) SELECT 'queued', '{}' FROM generate_series(1, %s)"
PG_CLAIM = """
UPDATE bench_queue SET state = 'running'
WHERE id IN (SELECT id FROM bench_queue WHERE state = 'queued' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id
"""
PG_COMPLETE = "UPDATE bench_queue SET state = 'done' WHERE id = ANY (%s)"


def enqueue_noops(n: int, ref: str = "orchestrator.bench.jobs:noop") -> None:
    import json

    spec = json.dumps({"kind": "python", "ref": ref, "call": "job", "args": [], "kwargs": {}})
    with connection.cursor() as cursor:
        cursor.execute(ENQUEUE_RUNS, {"n": n})
        ids = [row[0] for row in cursor.fetchall()]
        cursor.execute(ENQUEUE_TASK_RUNS, {"ids": ids, "ref": ref, "spec": spec})
        wake_due({"default": n})


# Rows written to the job tables so far, as PostgreSQL counts them (a backend reports its counts
# when it goes idle or exits; the snapshot is cleared so this reads them afresh).
WRITES = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
WHERE relname IN ('orchestrator_run', 'orchestrator_taskrun', 'orchestrator_attempt')
"""
WRITE_TABLES = (("run", "orchestrator_run"), ("task run", "orchestrator_taskrun"), ("attempt", "orchestrator_attempt"))


def table_writes() -> dict[str, tuple[int, int, int]]:
    """(inserts, updates, HOT updates) per job table, as counted so far; under "commits", the
    transactions committed in the benchmark database (every process's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush(), pg_stat_clear_snapshot()")
        cursor.execute(WRITES)
        counts = {name: (ins, upd, hot) for name, ins, upd, hot in cursor.fetchall()}
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        counts["commits"] = (cursor.fetchone()[0], 0, 0)
        return counts


def writes_per_job(before: dict, after: dict, jobs: int) -> str:
    """The rows written per job between two ``table_writes``: per table, inserts + updates (HOT)."""
    if not jobs:
        return "no job done"
    parts = []
    for label, table in WRITE_TABLES:
        ins, upd, hot = (a - b for a, b in zip(after.get(table, (0, 0, 0)), before.get(table, (0, 0, 0)), strict=True))
        parts.append(f"{label} {ins / jobs:.2f} ins + {upd / jobs:.2f} upd ({hot / jobs:.2f} HOT)")
    commits = after.get("commits", (0, 0, 0))[0] - before.get("commits", (0, 0, 0))[0]
    return "; ".join(parts) + f"; {commits / jobs:.3f} transactions per job (all processes)"


def enqueue_jobs(n: int, ref: str = "orchestrator.bench.jobs:noop") -> None:
    """n jobs through the product's bulk path (one statement, see jobs.enqueue_many)."""
    from orchestrator.jobs import enqueue_many

    enqueue_many([{"ref": ref}] * n)


def unfinished() -> bool:
    # Cheap while the workers run (it is asked every 50 ms): a partial index answers each state.
    # A running task run is one whose attempt runs, or is claimed ahead of it (its local queue).
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM orchestrator_taskrun WHERE state = '{state}')"
                                               for state in ("scheduled", "queued", "running")))
        return cursor.fetchone()[0]


def last_finish() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM max(finished_at)) FROM orchestrator_run")
        return float(cursor.fetchone()[0] or time.time())


def count_done() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM orchestrator_run WHERE state = 'succeeded'")
        return cursor.fetchone()[0]


# --- sections --------------------------------------------------------------------------------------

def pg_ceiling(batch: int, commit: str = "on", seconds: float = 1.5) -> float:
    """Jobs/s of a bare SKIP LOCKED claim-and-complete loop, ``batch`` jobs per transaction."""
    with connection.cursor() as cursor:
        cursor.execute(PG_SETUP)
        cursor.execute(PG_FILL, [300_000 if batch > 1 else 30_000])
        cursor.execute(f"SET synchronous_commit = {commit}")
    done = 0
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            with connection.cursor() as cursor:
                # Autocommit: each statement is its own transaction, as in a worker's claim/complete.
                cursor.execute(PG_CLAIM, [batch])
                ids = [row[0] for row in cursor.fetchall()]
                if not ids:
                    break
                cursor.execute(PG_COMPLETE, [ids])
            done += len(ids)
        return done / (time.perf_counter() - started)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")


def bench_pg(out, seconds: float = 1.5) -> None:
    # The workers commit asynchronously (see worker.batch.ASYNC_COMMIT); the ceiling is shown both ways.
    for batch, commit in ((1, "on"), (100, "on"), (1, "off"), (100, "off")):
        rate = pg_ceiling(batch, commit, seconds)
        out(f"  bare SKIP LOCKED claim+complete, {batch:>3} per transaction, synchronous_commit={commit:<3}: "
            f"{rate:>9,.0f} jobs/s")


def bench_jobs(out, n: int, concurrency: int) -> None:
    for workers in (1, 2):
        reset_work()
        roles = Roles()
        try:
            roles.start("dispatcher")
            roles.workers(workers, concurrency)
            before = table_writes()
            started = time.time()
            for offset in range(0, n, 500):
                enqueue_jobs(min(500, n - offset))
            deadline = time.monotonic() + 120
            while unfinished() and time.monotonic() < deadline:
                time.sleep(0.05)
            done = count_done()
            elapsed = last_finish() - started
        finally:
            roles.stop()
        time.sleep(0.5)  # the exited processes' backends report their counts as they end
        out(f"  {n} no-op jobs, {workers} worker process(es) x {concurrency} children: "
            f"{done / elapsed:>7,.0f} jobs/s end to end ({elapsed:.2f} s{'' if done == n else f', only {done} done'})")
        out(f"    rows written per job: {writes_per_job(before, table_writes(), done)}")


def bench_latency(out, count: int = 150, interval: float = 0.02, concurrency: int = 4) -> None:
    from orchestrator.models import TaskRun
    from orchestrator.runs import create_run

    reset_work()
    roles = Roles()
    spec = {"kind": "python", "ref": "orchestrator.bench.jobs:stamp", "call": "job", "args": [], "kwargs": {}}
    enqueued = {}
    try:
        roles.start("dispatcher")
        roles.workers(1, concurrency)
        time.sleep(0.5)
        for _ in range(count):
            at = time.time()
            run, _ = create_run(None, trigger="job", tasks={"stamp": spec})
            enqueued[run.pk] = at
            time.sleep(interval)
        deadline = time.monotonic() + 30
        while count_done() < count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        roles.stop()
    delays = sorted((result - enqueued[run_id]) * 1000 for run_id, result in
                    TaskRun.objects.filter(state="succeeded").values_list("run_id", "result"))
    if not delays:
        out("  no job finished")
        return
    q = statistics.quantiles(delays, n=100, method="inclusive")
    out(f"  enqueue -> start delay at {1 / interval:.0f} jobs/s ({len(delays)} jobs): "
        f"p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms, p99 {q[98]:.1f} ms, max {delays[-1]:.1f} ms")


def bench_dag(out, concurrency: int = 8) -> None:
    from orchestrator.models import Run
    from orchestrator.runs import create_run

    def spec(upstream=()):
        return {"kind": "python", "ref": "orchestrator.bench.jobs:noop_task", "upstream": list(upstream)}

    wide = {"start": spec()}
    wide.update({f"t{i:03d}": spec(["start"]) for i in range(200)})
    wide["join"] = spec([f"t{i:03d}" for i in range(200)])
    chain = {"c000": spec()}
    chain.update({f"c{i:03d}": spec([f"c{i - 1:03d}"]) for i in range(1, 100)})
    reset_work()
    roles = Roles()
    try:
        roles.start("dispatcher")
        roles.workers(2, concurrency)
        time.sleep(0.5)
        for label, tasks in (("1 + 200 parallel + 1 join", wide), ("100-task chain", chain)):
            started = time.perf_counter()
            run, _ = create_run(None, trigger="manual", tasks=tasks)
            deadline = time.monotonic() + 120
            state = "running"
            while state == "running" and time.monotonic() < deadline:
                time.sleep(0.005)
                state = Run.objects.values_list("state", flat=True).get(pk=run.pk)
            elapsed = time.perf_counter() - started
            out(f"  DAG {label}: {elapsed:.2f} s trigger -> {state} (2 workers x {concurrency})")
    finally:
        roles.stop()


class Output:
    """What the sections print to: callable with a line, or a stream with ``write``."""

    def __init__(self, line):
        self.line = line

    def __call__(self, text: str) -> None:
        self.line(text)

    def write(self, text: str) -> None:
        for part in text.rstrip("\n").split("\n"):
            self.line(part)

    def flush(self) -> None:
        pass
