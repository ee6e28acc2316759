"""The ``io`` section: I/O-bound jobs (each waits 50 ms) on ONE worker process, per executor:

- async: ``@job(executor="async")``, ``await asyncio.sleep(0.05)``, on the worker's in-process
  executor with ``ASYNC_PLACES`` places;
- thread: ``@job(executor="thread")``, ``time.sleep(0.05)``, with ``THREAD_PLACES`` threads;
- process: the default executor, ``time.sleep(0.05)`` in each of ``PROCESS_CHILDREN`` forked
  children (what every job did before the in-process executors).

Jobs are enqueued while the worker runs, 500 per INSERT. The figure is jobs/s from the first
attempt's start to the last recorded success (what one worker process executes); jobs/s from the
first enqueue, and how long enqueuing took, follow it. Beside each figure: its ratio to the forked default's in the same run,
and the CPU seconds per 1,000 jobs of the worker's own process, of its children and of its
PostgreSQL backends (read from /proc, when the server runs on this machine), which say where the
time goes. The ceiling of each is its places
divided by 50 ms: 10,000 jobs/s for 500 places, 640 for 32 children.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time

from django.db import connection

from orchestrator.bench import core
from orchestrator.jobs import job

JOBS_MODULE = __name__
ASYNC_PLACES = 500
THREAD_PLACES = 200
PROCESS_CHILDREN = 32
WAIT = 0.05


@job(executor="async")
async def wait_async():
    await asyncio.sleep(WAIT)


@job(executor="thread")
def wait_thread():
    time.sleep(WAIT)


@job
def wait_process():
    time.sleep(WAIT)


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (the state first, then the parent's
    pid), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return None


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of one process so far (its reaped children not included)."""
    fields = stat_fields(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (its forked children, its in-process executor's host)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            with contextlib.suppress(IndexError, ValueError):
                if fields is not None and int(fields[1]) == pid:
                    found.append(int(name))
    return found


def _backends() -> list[int]:
    """The PostgreSQL backends of the benchmark database other than this process's own (the
    worker's connections), when the server runs on this machine."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        return [row[0] for row in cursor.fetchall()]


def _start_worker(args: list[str], env_factory=core.child_env) -> subprocess.Popen:
    env = env_factory()
    env["ORCHESTRATOR_JOB_MODULES"] = f"{env['ORCHESTRATOR_JOB_MODULES']},{JOBS_MODULE}"
    return subprocess.Popen([sys.executable, str(core.ROOT / "manage.py"), "worker", "--queues", "default",
                             "--grace", "2", *args], cwd=core.ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _wait_registered(timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM orchestrator_worker WHERE state = 'running'")
            if cursor.fetchone()[0]:
                return
        time.sleep(0.05)
    raise RuntimeError("the benchmark's worker did not start within 30 s")


def _first_start() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM min(started_at)) FROM orchestrator_attempt")
        return float(cursor.fetchone()[0] or time.time())


def measure(kind: str, n: int, env_factory=core.child_env) -> dict:
    """For n jobs of one executor: jobs done, seconds from the first enqueue to the last success
    ("wall") and from the first start to the last success ("running"), the enqueuing's seconds,
    the CPU seconds of the worker, of its children and of its PostgreSQL backends."""
    args = {"async": ["--concurrency", "1", "--inprocess", str(ASYNC_PLACES)],
            "thread": ["--concurrency", "1", "--inprocess", str(THREAD_PLACES)],
            "process": ["--concurrency", str(PROCESS_CHILDREN)]}[kind]
    core.reset_work()
    proc = _start_worker(args, env_factory)
    roles = core.Roles()
    roles.procs.append(proc)  # stopped with the others' care
    try:
        _wait_registered()
        time.sleep(0.5)  # the host or the children forked and ready
        backends = {pid: _cpu_seconds(pid) for pid in _backends()}
        cpu_before = _cpu_seconds(proc.pid), sum(_cpu_seconds(child) for child in _children(proc.pid))
        started = time.time()
        for offset in range(0, n, 500):
            core.enqueue_noops(min(500, n - offset), ref=f"{JOBS_MODULE}:wait_{kind}")
        enqueued = time.time() - started
        deadline = time.monotonic() + max(120.0, n * WAIT / 8)
        while core.unfinished() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker_cpu = _cpu_seconds(proc.pid) - cpu_before[0]
        children_cpu = sum(_cpu_seconds(child) for child in _children(proc.pid)) - cpu_before[1]
        # The worker's connections now (a fork closes them: the children must not share them),
        # those it had at the start counted from then.
        backend_cpu = sum(_cpu_seconds(pid) - backends.get(pid, 0.0) for pid in _backends())
        done = core.count_done()
        last = core.last_finish()
    finally:
        roles.stop()
    return {"done": done, "wall": last - started, "running": last - _first_start(), "enqueue": enqueued,
            "worker_cpu": worker_cpu, "children_cpu": children_cpu, "backend_cpu": backend_cpu}


def run(out, n: int = 10_000, forked: int | None = None, env_factory=core.child_env) -> dict:
    """Each executor's jobs/s on one worker process; the forked default runs ``forked`` jobs (a
    fifth of n by default: it is the slow one). ``env_factory``: the worker's environment (the
    benchmark database's by default). Returns the figures by executor."""
    forked = forked or max(1, n // 5)
    rates, figures = {}, {}
    for kind, count, how in (("process", forked, f"{PROCESS_CHILDREN} forked children (the default)"),
                             ("async", n, f"async, {ASYNC_PLACES} places on one event loop"),
                             ("thread", n, f"thread, {THREAD_PLACES} threads")):
        m = measure(kind, count, env_factory)
        figures[kind] = m
        done = m["done"]
        rate = done / m["running"] if m["running"] > 0 else 0.0
        rates[kind] = rate
        ratio = f" = {rate / rates['process']:.1f}x the forked default" if kind != "process" and rates["process"] else ""
        per = 1000 / done if done else 0.0
        out(f"  {how}: {count} jobs, {rate:>6,.0f} jobs/s first start -> last success{ratio} "
            f"({done / m['wall']:,.0f} jobs/s from the first enqueue; enqueuing took {m['enqueue']:.2f} s"
            f"{'' if done == count else f'; only {done} done'}); CPU per 1,000 jobs: worker "
            f"{m['worker_cpu'] * per:.2f} s, its children {m['children_cpu'] * per:.2f} s, its PostgreSQL "
            f"backends {m['backend_cpu'] * per:.2f} s")
    return figures
