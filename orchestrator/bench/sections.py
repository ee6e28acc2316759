"""``manage.py bench``: the sections it runs, in order, on a benchmark database dropped and created
for the purpose (``bench.core``).

Sections (``--only pg,jobs,peers,delays,statements,latency,steady,backlog,history,dag,fleet,io,scheduler,pages,cron,map,sensors,footprint``):

- pg, jobs, latency, dag: PostgreSQL's own ceiling, jobs end to end, the start delay at light
  load, DAG wall time (see ``bench.core``).
- peers: jobs/s beside PgQueuer's on the same server, same job and process counts, interleaved
  rounds with their ratios, and PostgreSQL's ceiling in the same run (see ``bench.peers``).
- delays: start delay at 500 jobs/s beside PgQueuer's, quiet and with another process taking a
  core, in interleaved turns (see ``bench.delays``).
- statements: where a no-op job's time goes on both paths, per 1,000 jobs: each statement's calls,
  rows and time (``pg_stat_statements``, when the server loads it) and the CPU of each kind of
  process (see ``bench.statements``).
- steady, backlog, history: start delay under a steady arrival rate with a per-stage breakdown,
  and cost with a due backlog (for the first one also on the async executor), a delayed backlog
  and a finished history (see ``bench.load``).
- fleet: database transactions per job with 1 to 64 mostly idle workers at a steady arrival rate
  (see ``bench.fleet``).
- io: 10,000 jobs that each wait 50 ms on one worker process, async and thread executors beside the
  forked default (see ``bench.iobound``).
- scheduler, pages, cron: see ``bench.scheduler``, ``bench.pages`` and ``bench.cron``.
- map: maps over 1,000, 10,000 and 100,000 no-op items (``--map-items``): time from the parent's
  success to the last instance's end, instances/s beside the plain-job rate of the same
  processes, worker memory (see ``bench.mapping``).
- sensors: 10,000 sensors waiting at every=60 beside ordinary jobs (see ``bench.sensors``).
- footprint: the memory (PSS) of the whole ``./dev run`` stack once idle (see ``bench.footprint``).
"""

from __future__ import annotations

import os

from orchestrator.bench import (
    core,
    cron,
    delays,
    fleet,
    footprint,
    iobound,
    load,
    mapping,
    pages,
    peers,
    scheduler,
    sensors,
    statements,
)
from orchestrator.bench.core import BENCH_DB, Output

SECTIONS = ("pg", "jobs", "peers", "delays", "statements", "latency", "steady", "backlog", "history", "dag", "fleet", "io", "scheduler",
            "pages", "cron", "map", "sensors", "footprint")


def run(out, only: list[str] | None = None, jobs: int = 20000, concurrency: int = 16, rates=(500, 2000),
        seconds: float = 5.0, backlog=(0, 100_000, 1_000_000), delayed: int = 1_000_000,
        history: int = 1_000_000, fleet_sizes=(1, 4, 16, 64), fleet_rate: float = 50.0, rounds: int = 3,
        map_items=mapping.SIZES, places: int | None = None) -> None:
    only = list(only or SECTIONS)
    unknown = [name for name in only if name not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    out = out if isinstance(out, Output) else Output(out)
    out(f"benchmark database {BENCH_DB!r} (dropped and created), {os.cpu_count()} CPU(s)")
    core.prepare_database()
    steps = (
        ("pg", "PostgreSQL's own ceiling:", lambda: core.bench_pg(out)),
        ("jobs", "Jobs end to end:", lambda: core.bench_jobs(out, jobs, concurrency)),
        ("peers", "Beside PgQueuer (same server, same job and process counts):",
         lambda: peers.run(out, jobs, concurrency, rounds, places=places)),
        ("delays", "Start delay at a steady rate beside PgQueuer's, quiet and with a core taken:",
         lambda: delays.run(out, rates[0], seconds)),
        ("statements", "Where a no-op job's time goes, per 1,000 jobs (pg_stat_statements and CPU per process kind):",
         lambda: statements.run(out, jobs, concurrency, places=places)),
        ("latency", "Start delay at light load:", lambda: core.bench_latency(out)),
        ("steady", "Start delay under a steady arrival rate (per stage: enqueue -> claimed -> child started):",
         lambda: load.run_steady(out, rates, seconds)),
        ("backlog", "With a backlog waiting (2 workers x 16):",
         lambda: load.run_backlog(out, backlog, delayed, max(seconds, 8.0))),
        ("history", "With finished history in the tables (2 workers x 16):",
         lambda: load.run_history(out, history, max(seconds, 8.0))),
        ("dag", "DAG wall time:", lambda: core.bench_dag(out)),
        ("fleet", "A fleet's cost per job (N workers of concurrency 1, most of them idle):",
         lambda: fleet.run(out, fleet_sizes, fleet_rate, seconds)),
        ("io", "I/O-bound jobs (each waits 50 ms) on one worker process, per executor (see bench.iobound):",
         lambda: iobound.run(out)),
        ("scheduler", "Scheduler:", lambda: scheduler.run(out)),
        ("pages", "Pages:", lambda: pages.run(out)),
        ("cron", "Cron over long ranges:", lambda: cron.run(out)),
        ("map", "Mapping (maps of no-op items beside plain no-op jobs, same processes):",
         lambda: mapping.run(out, map_items)),
        ("sensors", "Waiting sensors:", lambda: sensors.run(out)),
        ("footprint", "Idle footprint:", lambda: footprint.run(out)),
    )
    for name, title, step in steps:
        if name in only:
            out(title)
            step()
