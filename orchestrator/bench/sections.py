"""``manage.py bench``: the sections it runs, in order, on a benchmark database dropped and created
for the purpose (``bench.core``).

Sections (``--only pg,jobs,latency,steady,backlog,history,dag,fleet,scheduler,pages,cron,map,sensors,footprint``):

- pg, jobs, latency, dag: PostgreSQL's own ceiling, jobs end to end, the start delay at light
  load, DAG wall time (see ``bench.core``).
- steady, backlog, history: start delay under a steady arrival rate with a per-stage breakdown,
  and cost with a due backlog, a delayed backlog and a finished history (see ``bench.load``).
- fleet: database transactions per job with 1 to 64 mostly idle workers at a steady arrival rate
  (see ``bench.fleet``).
- scheduler, pages, cron, map, sensors: see ``bench.scheduler``, ``bench.pages``, ``bench.cron``,
  ``bench.mapping`` and ``bench.sensors``.
- footprint: the memory (PSS) of the whole ``./dev run`` stack once idle (see ``bench.footprint``).
"""

from __future__ import annotations

import os

from orchestrator.bench import core, cron, fleet, footprint, load, mapping, pages, scheduler, sensors
from orchestrator.bench.core import BENCH_DB, Output

SECTIONS = ("pg", "jobs", "latency", "steady", "backlog", "history", "dag", "fleet", "scheduler", "pages", "cron",
            "map", "sensors", "footprint")


def run(out, only: list[str] | None = None, jobs: int = 20000, concurrency: int = 16, rates=(500, 2000),
        seconds: float = 5.0, backlog=(0, 100_000, 1_000_000), delayed: int = 1_000_000,
        history: int = 1_000_000, fleet_sizes=(1, 4, 16, 64), fleet_rate: float = 50.0) -> None:
    only = list(only or SECTIONS)
    unknown = [name for name in only if name not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    out = out if isinstance(out, Output) else Output(out)
    out(f"benchmark database {BENCH_DB!r} (dropped and created), {os.cpu_count()} CPU(s)")
    core.prepare_database()
    if "pg" in only:
        out("PostgreSQL's own ceiling:")
        core.bench_pg(out)
    if "jobs" in only:
        out("Jobs end to end:")
        core.bench_jobs(out, jobs, concurrency)
    if "latency" in only:
        out("Start delay at light load:")
        core.bench_latency(out)
    if "steady" in only:
        out("Start delay under a steady arrival rate (per stage: enqueue -> claimed -> child started):")
        load.run_steady(out, rates, seconds)
    if "backlog" in only:
        out("With a backlog waiting (2 workers x 16):")
        load.run_backlog(out, backlog, delayed, max(seconds, 8.0))
    if "history" in only:
        out("With finished history in the tables (2 workers x 16):")
        load.run_history(out, history, max(seconds, 8.0))
    if "dag" in only:
        out("DAG wall time:")
        core.bench_dag(out)
    if "fleet" in only:
        out("A fleet's cost per job (N workers of concurrency 1, most of them idle):")
        fleet.run(out, fleet_sizes, fleet_rate, seconds)
    for name, title, module in (("scheduler", "Scheduler:", scheduler), ("pages", "Pages:", pages),
                                ("cron", "Cron over long ranges:", cron), ("map", "Mapping:", mapping),
                                ("sensors", "Waiting sensors:", sensors),
                                ("footprint", "Idle footprint:", footprint)):
        if name in only:
            out(title)
            module.run(out)
