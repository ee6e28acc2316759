"""The ``delays`` section: start delay at a steady arrival rate beside PgQueuer's, on a quiet
machine and with another process taking a core, in interleaved turns on the same server.

- this product: ``bench.load.steady`` (2 workers x 16 forked children, a dispatcher; the producer
  enqueues the jobs due at each moment with ``jobs.enqueue_many``), enqueue to the job's first
  instruction; and the same with an ``async def`` job on the async executor (2 workers of 500
  in-process places, as the peers section runs it);
- PgQueuer: 2 worker processes of batch size 16 (as in the peers section), its producer enqueueing
  the same way (``Queries.enqueue`` of the jobs due at each moment); each job's payload is the
  producer's clock just before its enqueue, and its entrypoint takes ``time.time()`` as its first
  instruction;
- "a core taken": one more process spinning in a loop for the length of the turn (what a busy web
  server or a build does to a small machine), started before either side's workers.

Figures are p50 / p99 / max in ms over every job of the turn. A busy machine moves both sides
alike: read each pair of turns side by side.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

from orchestrator.bench import iobound, load, peers

# One PgQueuer worker that records each job's start delay (its payload is the enqueue time) and
# writes them to a file when terminated.
PEER_WORKER = """
import asyncio, signal, sys, time
from datetime import timedelta
import asyncpg
from pgqueuer import AsyncpgDriver, QueueManager, Queries

delays = []

def dump(path):
    with open(path, "w") as f:
        f.write("\\n".join(f"{d:.6f}" for d in delays))

async def main(dsn, batch, path):
    connection = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(connection)))

    @qm.entrypoint("stamp")
    async def stamp(job):
        delays.append(time.time() - float(job.payload.decode()))

    def stop():
        dump(path)
        sys.stdout.flush()
        import os
        os._exit(0)

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
    print("ready", flush=True)
    await qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=1))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
"""

SPIN = "while True:\n    pass\n"


@contextlib.contextmanager
def core_taken(on: bool):
    """A process spinning on the CPU while the block runs (nothing when ``on`` is false)."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def peer_steady(rate: int, seconds: float, processes: int = 2, batch: int = 16) -> list[float]:
    """PgQueuer's start delays (seconds) for jobs arriving at ``rate`` per second."""
    import asyncio

    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    dsn = peers._dsn()
    peers._reset_peer(dsn)
    files = [tempfile.NamedTemporaryFile(prefix="peer-delays-", suffix=".txt", delete=False) for _ in range(processes)]
    procs = []
    try:
        for f in files:
            f.close()
        peers.start_workers(procs, [[PEER_WORKER, dsn, str(batch), f.name] for f in files])
        time.sleep(1.0)  # as this product's workers are given (bench.load._start)

        async def produce() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                queries = Queries(AsyncpgDriver(conn))
                started = time.monotonic()
                sent, total = 0, int(rate * seconds)
                while sent < total:
                    due = min(total, int((time.monotonic() - started) * rate) + 1)
                    if due > sent:
                        stamp = f"{time.time():.6f}".encode()
                        await queries.enqueue(["stamp"] * (due - sent), [stamp] * (due - sent), [0] * (due - sent))
                        sent = due
                    else:
                        await asyncio.sleep(0.002)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and await conn.fetchval("SELECT count(*) FROM pgqueuer"):
                    await asyncio.sleep(0.05)
            finally:
                await conn.close()

        asyncio.run(produce())
    finally:
        peers.stop_workers(procs)
    delays = []
    for f in files:
        with open(f.name) as readable:
            delays += [float(line) for line in readable if line.strip()]
        os.unlink(f.name)
    return delays


def _figures(delays_ms: list[float]) -> str:
    if not delays_ms:
        return "no job started"
    p50, p99, top = load._quantiles(delays_ms)
    return f"p50 {p50:6.1f}  p99 {p99:7.1f}  max {top:7.1f} ms ({len(delays_ms)} jobs)"


def run(out, rate: int = 500, seconds: float = 5.0, turns: int = 2) -> None:
    if not peers.ensure_pgqueuer(out):
        return
    for turn in range(1, turns + 1):
        for taken in (False, True):
            label = "a core taken" if taken else "quiet       "
            with core_taken(taken):
                ours = _ours(rate, seconds)
            with core_taken(taken):
                on_loop = _ours(rate, seconds, load.STAMP_ASYNC, places=iobound.ASYNC_PLACES)
            with core_taken(taken):
                theirs = [d * 1000 for d in peer_steady(rate, seconds)]
            out(f"  turn {turn}, {label}  this product   {_figures(ours)}")
            out(f"  turn {turn}, {label}  async executor {_figures(on_loop)}")
            out(f"  turn {turn}, {label}  PgQueuer       {_figures(theirs)}")
    out(f"  {rate} jobs/s for {seconds:g} s each; this product 2 workers x 16 forked children, its async executor "
        f"2 workers x {iobound.ASYNC_PLACES} places, PgQueuer 2 processes of batch 16; start delay = enqueue (the "
        f"producer's clock) to the job's first instruction")


def _ours(rate: int, seconds: float, ref: str = load.STAMP, places: int = 0) -> list[float]:
    """This product's start delays (ms) at ``rate``: the forked default, or with ``places`` the
    async executor (one child and ``places`` in-process places per worker, as the peers section)."""
    since = load._now()
    if places:
        load.steady(lambda text: None, rate, seconds, concurrency=1, ref=ref, inprocess=places)
    else:
        load.steady(lambda text: None, rate, seconds)
    return [(started - created) * 1000 for created, _, _, started in load._stages(since, 0, ref)]
