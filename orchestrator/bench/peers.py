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

Each side's CPU per job, over the same window as its rate, is split between the PostgreSQL
server (every process of it: backends, autovacuum, WAL writer, so other work on the same server
counts too; read from /proc, so only when the server runs on this machine) and the Python processes (this one, enqueuing and watching, and the
workers with their children). CPU is what a busy machine shares out, so its ratio moves less from
one round to the next than the rates do, and it says which side of the connection a gap is on.
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


def _tree_cpu(root: int, table: dict[int, tuple[int, float]]) -> float:
    """CPU seconds of a process and all its descendants, live and reaped (``table``: pid ->
    (parent pid, user + system CPU of itself and of its reaped children))."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    total, stack, seen = 0.0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += table.get(pid, (0, 0.0))[1]
        stack.extend(children.get(pid, []))
    return total


def _processes() -> dict[int, tuple[int, float]]:
    tick = os.sysconf("SC_CLK_TCK")
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := iobound.stat_fields(int(name))) is not None:
            table[int(name)] = (int(fields[1]), sum(int(value) for value in fields[11:15]) / tick)
    return table


def _server_pid() -> int | None:
    """The PostgreSQL server's main process, when it runs on this machine: the parent of this
    connection's backend."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    try:
        with open(f"/proc/{backend}/comm") as comm:
            if not comm.read().startswith("postgres"):
                return None
    except OSError:
        return None
    fields = iobound.stat_fields(backend)
    return None if fields is None else int(fields[1])


def cpu_now(server: int | None) -> tuple[float | None, float]:
    """CPU seconds so far of the PostgreSQL server (None when it is not on this machine) and of
    this process with its descendants."""
    table = _processes()
    return (None if server is None else _tree_cpu(server, table)), _tree_cpu(os.getpid(), table)


def cpu_per_job(before: tuple, after: tuple, done: int) -> tuple[float | None, float]:
    """Microseconds of CPU per job: (PostgreSQL server or None, Python processes)."""
    per = 1e6 / max(done, 1)
    server = None if before[0] is None or after[0] is None else (after[0] - before[0]) * per
    return server, (after[1] - before[1]) * per


def peer_round(n: int, processes: int, batch: int, server: int | None = None) -> tuple[float, int, tuple]:
    """PgQueuer's jobs/s for n no-op jobs, how many finished, and the CPU per job
    (``cpu_per_job``)."""
    import asyncio

    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    dsn = _dsn()
    _reset_peer(dsn)
    procs = []
    try:
        start_workers(procs, [[PEER_WORKER, dsn, str(batch)]] * processes)
        time.sleep(0.5)  # its LISTEN and first dequeue

        async def enqueue_and_wait() -> tuple[float, int, tuple]:
            conn = await asyncpg.connect(dsn)
            try:
                queries = Queries(AsyncpgDriver(conn))
                before = cpu_now(server)
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
                elapsed = time.time() - started
                return elapsed, n - left, cpu_per_job(before, cpu_now(server), n - left)
            finally:
                await conn.close()

        elapsed, done, cpu = asyncio.run(enqueue_and_wait())
    finally:
        stop_workers(procs)
    return done / elapsed, done, cpu


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


def ours_round(n: int, processes: int, concurrency: int, places: int = 0,
               server: int | None = None) -> tuple[float, int, tuple]:
    """This product's jobs/s for n no-op jobs enqueued by enqueue_many, how many finished, and the
    CPU per job (``cpu_per_job``). With ``places``: async no-op jobs on workers of one child and
    that many in-process places."""
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
        before = cpu_now(server)
        started = time.time()
        for offset in range(0, n, BATCH):
            enqueue_many([{"ref": ref}] * min(BATCH, n - offset))
        deadline = time.monotonic() + 120
        while core.unfinished() and time.monotonic() < deadline:
            time.sleep(0.05)
        done = core.count_done()
        cpu = cpu_per_job(before, cpu_now(server), done)
        elapsed = core.last_finish() - started
    finally:
        roles.stop()
    return done / elapsed, done, cpu


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
    server = _server_pid()
    ours, mine_async, peer, ratios, async_ratios = [], [], [], [], []
    cpu: dict[str, list[tuple]] = {"ours": [], "async": [], "peer": []}
    for number in range(1, rounds + 1):
        mine, mine_done, cpu_mine = ours_round(n, processes, concurrency, server=server)
        on_loop, on_loop_done, cpu_loop = ours_round(n, processes, concurrency, places=places, server=server)
        theirs, theirs_done, cpu_theirs = peer_round(n, processes, concurrency, server=server)
        ours.append(mine)
        mine_async.append(on_loop)
        peer.append(theirs)
        ratios.append(mine / theirs)
        async_ratios.append(on_loop / theirs)
        cpu["ours"].append(cpu_mine)
        cpu["async"].append(cpu_loop)
        cpu["peer"].append(cpu_theirs)
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
    _cpu_lines(out, cpu, server is not None)
    out(f"    PostgreSQL's ceiling, bare claim+complete of 100 per transaction: {ceiling:,.0f} jobs/s")


def _cpu_lines(out, cpu: dict[str, list[tuple]], local: bool) -> None:
    """CPU per job of each side, median over the rounds, and its ratio to PgQueuer's."""
    def median(side: str, part: int) -> float:
        return statistics.median(figures[part] for figures in cpu[side])

    where = "PostgreSQL server + Python processes" if local else "Python processes (the server is not on this machine)"
    out(f"  CPU per job, microseconds, median over the rounds ({where}):")
    peer_total = (median("peer", 0) if local else 0.0) + median("peer", 1)
    for side, label in (("ours", "this product"), ("async", "async executor"), ("peer", "PgQueuer")):
        python = median(side, 1)
        server = median(side, 0) if local else 0.0
        split = f"{server:,.0f} + {python:,.0f} = " if local else ""
        ratio = "" if side == "peer" else f", {(server + python) / peer_total:.2f}x PgQueuer's"
        out(f"    {label:<15} {split}{server + python:,.0f}{ratio}")


def _short(done: int, n: int) -> str:
    return "" if done == n else f" (only {done})"
