"""The ``peers`` section: this product's no-op jobs per second beside PgQueuer's, on the same
PostgreSQL server, with the same job count and the same number of worker processes, in
interleaved rounds (a busy machine moves both alike, so read the ratio of each round), and
PostgreSQL's own ceiling (a bare claim-and-complete of 100 per transaction) measured in the same
run.

- this product: 2 worker processes x ``concurrency`` children, jobs enqueued while they run, in
  batches of 500 (``jobs.enqueue_many``: one statement each), from the first enqueue to the last
  recorded success; every run keeps its run, task run and attempt rows.
- this product's async executor: the same, with an ``async def`` no-op declared
  ``@job(executor="async")`` on 2 worker processes of ``places`` in-process places each (500 by
  default, as ``bench.iobound`` starts them; one child and one event-loop host per worker):
  PgQueuer's own way of running a job, in-process on an asyncio loop with no cap on the jobs in
  flight (its batch size is how many one dequeue takes), so its fair peer.
- PgQueuer (PyPI ``pgqueuer``, asyncpg; a bench-only extra, installed into this environment by
  the section when missing): 2 processes, batch size ``concurrency``, the same no-op entrypoint,
  jobs enqueued the same way (500 per call), from the first enqueue to the moment its queue table
  is empty (polled every 10 ms). It deletes a finished job and keeps a log row.

Its tables live in the benchmark database beside ours and are dropped with it.
"""

from __future__ import annotations

import importlib
import os
import statistics
import subprocess
import sys
import time

from django.db import connection

from orchestrator.bench import core, iobound
from orchestrator.bench import jobs as bench_jobs  # noqa: F401 - registers the no-op job this process enqueues

PGQUEUER = "pgqueuer==1.6.0"
ASYNCPG = "asyncpg>=0.29"
BATCH = 500

# One PgQueuer worker process: its QueueManager with a no-op entrypoint, until it is terminated.
PEER_WORKER = """
import asyncio, sys
from datetime import timedelta
import asyncpg
from pgqueuer import AsyncpgDriver, QueueManager, Queries

async def main(dsn, batch):
    connection = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(connection)))

    @qm.entrypoint("noop")
    async def noop(job):
        pass

    print("ready", flush=True)
    await qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=1))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def ensure_pgqueuer(out) -> bool:
    """Import PgQueuer, installing it (and asyncpg) into this environment first when missing."""
    try:
        importlib.import_module("pgqueuer")
        importlib.import_module("asyncpg")
        return True
    except ImportError:
        pass
    out(f"  installing {PGQUEUER} and asyncpg into {sys.prefix} (bench only) ...")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--isolated", PGQUEUER, ASYNCPG],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        out(f"  could not install PgQueuer: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        return False
    importlib.invalidate_caches()
    return True


def _dsn() -> str:
    from orchestrator.database_url import format_database_url

    return format_database_url(connection.settings_dict, core.BENCH_DB)


def _reset_peer(dsn: str) -> None:
    """PgQueuer's tables in the benchmark database, installed once and emptied for each round."""
    import asyncio

    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    async def reset():
        conn = await asyncpg.connect(dsn)
        try:
            if await conn.fetchval("SELECT to_regclass('pgqueuer') IS NULL"):
                await Queries(AsyncpgDriver(conn)).install()
            await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        finally:
            await conn.close()

    asyncio.run(reset())


def peer_round(n: int, processes: int, batch: int) -> tuple[float, int]:
    """PgQueuer's jobs/s for n no-op jobs, and how many finished."""
    import asyncio

    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    dsn = _dsn()
    _reset_peer(dsn)
    procs = []
    try:
        start_workers(procs, [[PEER_WORKER, dsn, str(batch)]] * processes)
        time.sleep(0.5)  # its LISTEN and first dequeue

        async def enqueue_and_wait() -> tuple[float, int]:
            conn = await asyncpg.connect(dsn)
            try:
                queries = Queries(AsyncpgDriver(conn))
                started = time.time()
                for offset in range(0, n, BATCH):
                    size = min(BATCH, n - offset)
                    await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
                deadline = time.monotonic() + 120
                left = n
                while time.monotonic() < deadline:
                    left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
                    if left == 0:
                        break
                    await asyncio.sleep(0.01)
                return time.time() - started, n - left
            finally:
                await conn.close()

        elapsed, done = asyncio.run(enqueue_and_wait())
    finally:
        stop_workers(procs)
    return done / elapsed, done


def start_workers(procs: list, commands: list[list[str]]) -> None:
    """Start a PgQueuer worker per command (``python -c`` and its arguments) into ``procs`` (the
    caller stops them, ``stop_workers``, whatever happens), once each said it is ready."""
    for command in commands:
        procs.append(subprocess.Popen([sys.executable, "-c", *command], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, start_new_session=True))
    for proc in procs:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("a PgQueuer worker did not start")


def stop_workers(procs: list) -> None:
    """SIGTERM each worker's session, SIGKILL what has not exited 10 s later."""
    import signal

    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def ours_round(n: int, processes: int, concurrency: int, places: int = 0) -> tuple[float, int]:
    """This product's jobs/s for n no-op jobs enqueued by enqueue_many, and how many finished.
    With ``places``: async no-op jobs on workers of one child and that many in-process places."""
    try:
        from orchestrator.jobs import enqueue_many
    except ImportError:  # a version before enqueue_many (to measure it beside this one): the bench's bulk insert
        def enqueue_many(items):
            core.enqueue_noops(len(items))

    ref = "orchestrator.bench.jobs:noop_async" if places else "orchestrator.bench.jobs:noop"
    core.reset_work()
    roles = core.Roles()
    try:
        roles.start("dispatcher")
        if places:
            roles.workers(processes, 1, inprocess=places)
            time.sleep(0.5)  # each worker's host forked and ready, as PgQueuer's workers are given
        else:
            roles.workers(processes, concurrency)
        started = time.time()
        for offset in range(0, n, BATCH):
            enqueue_many([{"ref": ref}] * min(BATCH, n - offset))
        deadline = time.monotonic() + 120
        while core.unfinished() and time.monotonic() < deadline:
            time.sleep(0.05)
        done = core.count_done()
        elapsed = core.last_finish() - started
    finally:
        roles.stop()
    return done / elapsed, done


def _spread(values: list[float]) -> str:
    return f"{min(values):,.0f} / {statistics.median(values):,.0f} / {max(values):,.0f}"


def run(out, n: int = 20000, concurrency: int = 16, rounds: int = 3, processes: int = 2,
        places: int | None = None) -> None:
    """``places``: the in-process places of each worker of the async row (default: the io section's,
    ``bench.iobound.ASYNC_PLACES``)."""
    if not ensure_pgqueuer(out):
        return
    places = places or iobound.ASYNC_PLACES
    ceiling = core.pg_ceiling(batch=100)
    ours, mine_async, peer, ratios, async_ratios = [], [], [], [], []
    for number in range(1, rounds + 1):
        mine, mine_done = ours_round(n, processes, concurrency)
        on_loop, on_loop_done = ours_round(n, processes, concurrency, places=places)
        theirs, theirs_done = peer_round(n, processes, concurrency)
        ours.append(mine)
        mine_async.append(on_loop)
        peer.append(theirs)
        ratios.append(mine / theirs)
        async_ratios.append(on_loop / theirs)
        out(f"  round {number}: this product {mine:>7,.0f} jobs/s{_short(mine_done, n)}, "
            f"async executor {on_loop:>7,.0f} jobs/s{_short(on_loop_done, n)}, "
            f"PgQueuer {theirs:>7,.0f} jobs/s{_short(theirs_done, n)}, "
            f"ratios {mine / theirs:.2f} and {on_loop / theirs:.2f}")
    out(f"  {n} no-op jobs, {processes} processes ({processes} workers x {concurrency} children; async executor "
        f"{processes} workers x {places} in-process places; PgQueuer batch {concurrency}), jobs/s min / median / "
        f"max over {rounds} round(s):")
    out(f"    this product (run, task run, attempt kept) {_spread(ours)}")
    out(f"    this product, async executor (same rows)   {_spread(mine_async)}")
    out(f"    PgQueuer 1.6 (asyncpg)                     {_spread(peer)}")
    out(f"    ratio this product / PgQueuer per round    "
        f"{' '.join(f'{ratio:.2f}' for ratio in ratios)} (median {statistics.median(ratios):.2f})")
    out(f"    ratio async executor / PgQueuer per round  "
        f"{' '.join(f'{ratio:.2f}' for ratio in async_ratios)} (median {statistics.median(async_ratios):.2f})")
    out(f"    PostgreSQL's ceiling, bare claim+complete of 100 per transaction: {ceiling:,.0f} jobs/s")


def _short(done: int, n: int) -> str:
    return "" if done == n else f" (only {done})"
