"""Start delay under load and cost with a backlog, for ``manage.py bench`` (on the benchmark database).

- steady: jobs arrive at a steady rate (500 and 2,000 jobs/s by default) for a few seconds while
  a dispatcher and two workers run; the start delay of every job (enqueue to the job's own first
  instruction) as p50 / p99 / max, and per stage, from the timestamps the product writes:
  enqueue (the producer's clock as it calls ``jobs.enqueue_many``) -> claimed (``started_at``: the clock of
  the worker's batch, taken before it sends the claim) -> child started (the job's return value,
  ``time.time()`` as its first instruction). The jobs are under no limit, so the workers claim
  them straight from ``scheduled``; work under a limit would add a dispatcher tick before.
- backlog: the same workers with 0, 100,000 and 1,000,000 due task runs already waiting in their
  queue, and with 1,000,000 delayed ones (due tomorrow): one worker claim's wall time on that
  table, jobs completed per second over a window, and the start delay of a high-priority job
  enqueued every 50 ms during the window (it should overtake the backlog). Without a due backlog
  the producer keeps 1,000 no-op jobs due or running, so the workers are as busy.
- history: the same window after filling finished runs, task runs and attempts (1,000,000 by
  default: what fits in a benchmark's minutes; ``--history``), against the same figures at zero,
  and the server time of the pages whose cost could follow the history (runs list, dashboard,
  dead-letter queue) at both.

Fills are one ``INSERT ... SELECT generate_series`` per table; a million rows take a few minutes
on a loaded two-core machine.
"""

from __future__ import annotations

import json
import statistics
import time
from datetime import datetime

from django.db import connection, transaction

from orchestrator import clock
from orchestrator.bench.core import Output, Roles, reset_work
from orchestrator.channels import wake_due

NOOP = "orchestrator.bench.jobs:noop"
STAMP = "orchestrator.bench.jobs:stamp"
STAMP_ASYNC = "orchestrator.bench.jobs:stamp_async"
NOOP_ASYNC = "orchestrator.bench.jobs:noop_async"
ASYNC_PLACES = 500  # in-process places per worker for the async jobs, as the peers and io sections
# Due or running no-op jobs kept up while a window runs without a backlog: more than two workers
# finish in 50 ms, fewer than a backlog.
SUPPLY = 1000

ENQUEUE_RUNS = """
INSERT INTO orchestrator_run (logical_date, trigger, params, tenant, priority, lane, state, reason,
                              payload_hash, created_at)
SELECT %(at)s, 'job', '{}', 'default', %(priority)s, 0, 'running', '', '', %(at)s FROM generate_series(1, %(n)s)
RETURNING id
"""
ENQUEUE_TASK_RUNS = """
INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, queue, priority, tenant, lane, attempts,
                                  max_attempts, due_at, error, created_at)
SELECT id, %(ref)s, 'scheduled', %(spec)s::jsonb, '{}', 'default', %(priority)s, 'default', 0, 0, 1,
       %(due)s, '', %(at)s
FROM unnest(%(ids)s::bigint[]) AS id
"""

# A waiting backlog: n runs and their task runs in one statement each, due at ``due``.
FILL_BACKLOG = """
WITH r AS (
    INSERT INTO orchestrator_run (logical_date, trigger, params, tenant, priority, lane, state, reason,
                                  payload_hash, created_at)
    SELECT now(), 'job', '{}', 'default', 0, 0, 'running', '', '', now() FROM generate_series(1, %(n)s)
    RETURNING id
)
INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, queue, priority, tenant, lane, attempts,
                                  max_attempts, due_at, error, created_at)
SELECT id, %(ref)s, 'scheduled', %(spec)s::jsonb, '{}', 'default', 0, 'default', 0, 0, 1, %(due)s, '', now()
FROM r
"""

# Finished history: succeeded runs, one task run and one attempt each, spread over the last year.
FILL_HISTORY = """
WITH r AS (
    INSERT INTO orchestrator_run (logical_date, trigger, params, tenant, priority, lane, state, reason,
                                  payload_hash, created_at, started_at, finished_at)
    SELECT now() - g * interval '3 seconds', 'job', '{}', 'default', 0, 0, 'succeeded', '', '',
           now() - g * interval '3 seconds', now() - g * interval '3 seconds',
           now() - g * interval '3 seconds' + interval '20 ms'
    FROM generate_series(1, %(n)s) AS g
    RETURNING id, started_at, finished_at
), t AS (
    INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, queue, priority, tenant, lane, attempts,
                                      max_attempts, due_at, error, created_at, queued_at, started_at, finished_at)
    SELECT id, %(ref)s, 'succeeded', %(spec)s::jsonb, '{}', 'default', 0, 'default', 0, 1, 1, started_at, '',
           started_at, started_at, started_at, finished_at
    FROM r
    RETURNING id, started_at, finished_at
)
INSERT INTO orchestrator_attempt (task_run_id, number, outcome, started_at, finished_at, error, traceback, log_path)
SELECT id, 1, 'succeeded', started_at, finished_at, '', '', '' FROM t
"""

STAGES = """
SELECT extract(epoch FROM created_at)::float8, extract(epoch FROM queued_at)::float8,
       extract(epoch FROM started_at)::float8,
       (result #>> '{}')::float8
FROM orchestrator_taskrun
WHERE task = %(ref)s AND state = 'succeeded' AND created_at >= %(since)s AND priority = %(priority)s
"""


def _spec(ref: str) -> str:
    return json.dumps({"kind": "python", "ref": ref, "call": "job", "args": [], "kwargs": {}})


def _now() -> datetime:
    return clock.now()


def enqueue(n: int, ref: str = NOOP, priority: int = 0) -> None:
    """n jobs due now, committed together, then the dispatchers woken (what a bulk producer does)."""
    at = _now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(ENQUEUE_RUNS, {"n": n, "at": at, "priority": priority})
        ids = [row[0] for row in cursor.fetchall()]
        cursor.execute(ENQUEUE_TASK_RUNS, {"ids": ids, "ref": ref, "spec": _spec(ref), "priority": priority,
                                           "due": at, "at": at})
        wake_due({"default": n})


def enqueue_jobs(n: int, ref: str) -> None:
    """n jobs due now through the product's own bulk enqueue (``jobs.enqueue_many``: one statement
    inserts the runs and their task runs and wakes the workers), as an application enqueues them."""
    from orchestrator.jobs import enqueue_many

    enqueue_many([{"ref": ref}] * n)


def fill_backlog(n: int, delayed: bool = False, ref: str = NOOP) -> None:
    due = "now() + interval '1 day'" if delayed else "now() - interval '1 second'"
    with connection.cursor() as cursor:
        cursor.execute(FILL_BACKLOG.replace("%(due)s", due), {"n": n, "ref": ref, "spec": _spec(ref)})
        if n:
            # What autovacuum does within a minute of such an insert; the windows measure the
            # backlog, not the minute after it arrived.
            cursor.execute("VACUUM ANALYZE orchestrator_run")
            cursor.execute("VACUUM ANALYZE orchestrator_taskrun")


def fill_history(n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(FILL_HISTORY, {"n": n, "ref": NOOP, "spec": _spec(NOOP)})
        cursor.execute("VACUUM ANALYZE orchestrator_run")
        cursor.execute("VACUUM ANALYZE orchestrator_taskrun")
        cursor.execute("VACUUM ANALYZE orchestrator_attempt")


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return (values[0],) * 3 if values else (float("nan"),) * 3
    q = statistics.quantiles(values, n=100, method="inclusive")
    return q[49], q[98], max(values)


def _stages(since: datetime, priority: int, ref: str = STAMP) -> list[tuple[float, float, float, float]]:
    with connection.cursor() as cursor:
        cursor.execute(STAGES, {"ref": ref, "since": since, "priority": priority})
        return [row for row in cursor.fetchall() if None not in row]


def _print_delays(out, label: str, rows, stages: bool = True) -> dict:
    if not rows:
        out(f"  {label}: no job finished")
        return {}
    total = [(started - created) * 1000 for created, _, _, started in rows]
    p50, p99, top = _quantiles(total)
    out(f"  {label} ({len(rows)} jobs): start delay p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {top:.1f} ms")
    figures = {"p50": p50, "p99": p99, "max": top, "count": len(rows)}
    if stages:
        parts = (("enqueue -> claimed", 0, 2), ("claimed -> child started", 2, 3))
        for name, a, b in parts:
            values = [(row[b] - row[a]) * 1000 for row in rows]
            s50, s99, smax = _quantiles(values)
            out(f"      {name:<26} p50 {s50:7.1f} ms, p99 {s99:7.1f} ms, max {smax:7.1f} ms")
    return figures


def _finished_since(since: datetime) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM orchestrator_taskrun WHERE finished_at >= %s AND state = 'succeeded'",
                       [since])
        return cursor.fetchone()[0]


def _start(workers: int, concurrency: int, inprocess: int = 0) -> Roles:
    roles = Roles()
    roles.start("dispatcher")
    roles.workers(workers, concurrency, inprocess=inprocess)
    # Children of a fresh worker are still importing: the figures are of a running system.
    time.sleep(1.0)
    return roles


def steady(out, rate: int, seconds: float, workers: int = 2, concurrency: int = 16, ref: str = STAMP,
           inprocess: int = 0) -> dict:
    """Jobs arriving at ``rate`` per second (one INSERT every 10 ms or so) for ``seconds``; ``ref``
    and ``inprocess``: another stamping job (the async one) and the in-process places it needs."""
    reset_work()
    roles = _start(workers, concurrency, inprocess)
    try:
        since = _now()
        started = time.monotonic()
        sent = 0
        total = int(rate * seconds)
        while sent < total:
            due = min(total, int((time.monotonic() - started) * rate) + 1)
            if due > sent:
                enqueue_jobs(due - sent, ref)
                sent = due
            else:
                time.sleep(0.002)
        achieved = total / (time.monotonic() - started)
        deadline = time.monotonic() + 60
        while _finished_since(since) < total and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        roles.stop()
    return _print_delays(out, f"{rate:,} jobs/s for {seconds:g} s ({workers} workers x {concurrency}, "
                              f"arrival achieved {achieved:,.0f}/s)", _stages(since, 0, ref))


def claim_ms(repeat: int = 3) -> float:
    """The wall time of one worker's claim of 16 on the table as it is (rolled back: nothing moves)."""
    from orchestrator import db
    from orchestrator.loop import SHORT_TRANSACTION
    from orchestrator.worker import Worker

    times = []
    for _ in range(repeat):
        with transaction.atomic():
            worker = Worker(["default"], concurrency=16)
            worker.register()
            with db.cursor() as cursor:
                db.execute(cursor, SHORT_TRANSACTION)
            began = time.perf_counter()
            worker.claim(16, _now())
            times.append((time.perf_counter() - began) * 1000)
            transaction.set_rollback(True)
    return min(times)


# The benchmark's jobs due now or running. Written for the due-work index (every column before
# due_at fixed): with a million delayed rows a plain "due_at <= now()" reads all of them, and the
# producer then starves the workers it measures.
IN_FLIGHT = """
SELECT (SELECT count(*) FROM orchestrator_taskrun WHERE state = 'scheduled' AND queue = 'default' AND lane = 0
        AND tenant = 'default' AND priority IN (0, 10) AND due_at <= now())
     + (SELECT count(*) FROM orchestrator_taskrun WHERE state IN ('queued', 'running'))
"""


def window(out, label: str, seconds: float, workers: int = 2, concurrency: int = 16, supply: int = 0,
           inprocess: int = 0, stamp: str = STAMP) -> dict:
    """Workers run for ``seconds`` on what is waiting; a priority-10 job every 50 ms measures the
    start delay. With ``supply``, no-op jobs are added every 50 ms so that about that many are due or
    running at any time (work for the workers without a backlog that grows). ``inprocess`` and
    ``stamp``: the in-process places of each worker and the priority job (the async one there)."""
    claim = claim_ms()
    roles = _start(workers, concurrency, inprocess)
    try:
        since = _now()
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if supply:
                with connection.cursor() as cursor:
                    cursor.execute(IN_FLIGHT)
                    missing = supply - cursor.fetchone()[0]
                if missing > 0:
                    enqueue(missing)
            enqueue(1, stamp, priority=10)
            time.sleep(0.05)
        done = _finished_since(since)
        elapsed = time.monotonic() - started
        # The priority jobs enqueued last get a moment to finish.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM orchestrator_taskrun WHERE task = %s AND priority = 10 "
                               "AND state IN ('scheduled', 'queued', 'running')", [stamp])
                if cursor.fetchone()[0] == 0:
                    break
            time.sleep(0.05)
    finally:
        roles.stop()
    rate = done / elapsed
    out(f"  {label}: one claim of 16 {claim:.1f} ms; {rate:,.0f} jobs/s over {elapsed:.1f} s")
    figures = _print_delays(out, "    priority job every 50 ms", _stages(since, 10, stamp), stages=False)
    return {"claim_ms": claim, "jobs_per_s": rate, **figures}


def run_steady(out, rates=(500, 2000), seconds: float = 5.0) -> dict:
    return {rate: steady(out, rate, seconds) for rate in rates}


def run_backlog(out, sizes=(0, 100_000, 1_000_000), delayed: int = 1_000_000, seconds: float = 8.0) -> dict:
    figures = {}
    for size in sizes:
        reset_work()
        began = time.monotonic()
        fill_backlog(size)
        filled = time.monotonic() - began
        # With no backlog the workers get a steady supply instead, so the rate compares.
        what = f"filled in {filled:.0f} s" if size else f"{SUPPLY:,} kept due or running"
        figures[size] = window(out, f"{size:>9,} due waiting ({what})", seconds,
                               supply=SUPPLY if size == 0 else 0)
    size = next((size for size in sizes if size), 0)
    if size:
        # The async executor's no-op jobs with the same backlog, on 2 workers of 500 places each.
        reset_work()
        fill_backlog(size, ref=NOOP_ASYNC)
        figures[f"async {size}"] = window(out, f"{size:>9,} async jobs due waiting (async executor, 2 workers x "
                                               f"{ASYNC_PLACES} places)", seconds, concurrency=1,
                                          inprocess=ASYNC_PLACES, stamp=STAMP_ASYNC)
    if delayed:
        reset_work()
        fill_backlog(delayed, delayed=True)
        figures["delayed"] = window(out, f"{delayed:>9,} delayed (due tomorrow)", seconds, supply=SUPPLY)
    return figures


# Pages whose cost could follow the history: the runs list and its filters, the dashboard, the
# dead-letter queue.
HISTORY_PAGES = {
    "runs list, first page": "/runs/",
    "runs list, state=failed": "/runs/?state=failed",
    "runs list, trigger=job": "/runs/?trigger=job",
    "dashboard": "/",
    "dead-letter queue": "/dead-letter/",
}


def _pages(out) -> dict:
    from orchestrator.bench.pages import time_pages

    return time_pages(HISTORY_PAGES, Output(lambda line: out("    " + line.strip())), repeat=7)


def run_history(out, size: int = 1_000_000, seconds: float = 8.0) -> dict:
    reset_work()
    figures = {0: window(out, f"        0 finished in history ({SUPPLY:,} kept due or running)", seconds,
                         supply=SUPPLY)}
    figures["pages 0"] = _pages(out)
    reset_work()
    began = time.monotonic()
    fill_history(size)
    filled = time.monotonic() - began
    figures[size] = window(out, f"{size:>9,} finished runs, task runs and attempts (filled in {filled:.0f} s)",
                           seconds, supply=SUPPLY)
    figures[f"pages {size}"] = _pages(out)
    return figures
