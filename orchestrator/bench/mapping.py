"""``manage.py bench --only map``: maps over 1,000, 10,000 and 100,000 no-op items
(``--map-items``), with a real dispatcher and real worker processes on the benchmark database,
each beside the plain-job rate measured with the same processes just before it.

Per size:

- plain jobs: ``PLAIN_JOBS`` no-op jobs enqueued in batches (as ``bench.core``'s jobs section
  does), from the first enqueue to the last recorded success, just before the map and just
  after it (the load of a shared machine moves: the ratio is printed against both);
- the map: the time from the mapped-over parent's success (its recorded ``finished_at``) to the
  last instance's end (creating the instances, claiming, running and recording them, ending
  the mapped task and the run), instances per second, and that rate as a share of the plain-job
  rate; the time before the first instance started;
- the workers' memory: the resident set (RSS) of each worker process (the parent that claims,
  records and resolves; not its forked children) before the map and at its peak during it;
- the server time of the run page and of the mapped task's instances page for that run (Django's
  test client, median of a few requests).

The limits a big map needs are raised for the benchmark's processes only (``ORCHESTRATOR_MAX_
MAP_ITEMS``, ``ORCHESTRATOR_MAX_RESULT_BYTES``). A map still unfinished after ``MAP_TIMEOUT``
seconds is reported as such, with how many instances ended.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from django.db import connection

from orchestrator.bench.core import (
    JOBS_MODULE,
    Roles,
    count_done,
    enqueue_noops,
    last_finish,
    reset_work,
    unfinished,
)

SIZES = (1_000, 10_000, 100_000)
PLAIN_JOBS = 5_000
MAP_TIMEOUT = 600.0
# What the benchmark's processes allow: a list of 100,000 numbers is about 600 KB of JSON.
LIMITS = {"ORCHESTRATOR_MAX_MAP_ITEMS": "1000000", "ORCHESTRATOR_MAX_RESULT_BYTES": str(64 * 1024 * 1024)}


def _spec(ref: str, upstream=(), **extra) -> dict:
    return {"kind": "python", "ref": f"{JOBS_MODULE}:{ref}", "upstream": list(upstream), **extra}


def rss_mib(pid: int) -> float:
    """A process's resident set in MiB (0 once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0.0


def page_times(path: str, repeat: int = 3) -> list[float]:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import override_settings

    user, _ = get_user_model().objects.get_or_create(username="bench-map", defaults={"is_superuser": True,
                                                                                      "is_staff": True})
    client = Client()
    client.force_login(user)
    times = []
    from orchestrator.bench.pages import quiet_logins

    with quiet_logins(), override_settings(ALLOWED_HOSTS=["*"]):
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{path} answered {response.status_code}")
    return times


def reset_runs() -> None:
    """Empty the run tables between measures, the workers' own rows kept (they are running)."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE orchestrator_attempt, orchestrator_taskrun, orchestrator_webhookdelivery, "
                       "orchestrator_run CASCADE")


def plain_rate(n: int = PLAIN_JOBS) -> float:
    """No-op jobs per second through the running workers (bench.core's jobs section, smaller)."""
    reset_runs()
    started = time.time()
    for offset in range(0, n, 500):
        enqueue_noops(min(500, n - offset))
    deadline = time.monotonic() + 120
    while unfinished() and time.monotonic() < deadline:
        time.sleep(0.05)
    elapsed = last_finish() - started
    return count_done() / elapsed if elapsed > 0 else 0.0


def _wait_for_run(run_id: int, workers: list[int], peak: list[float]) -> tuple[str, list[float]]:
    """Wait (at most MAP_TIMEOUT) for the run to end: its last state, and each worker's peak RSS."""
    from orchestrator.models import Run

    deadline = time.monotonic() + MAP_TIMEOUT
    state = "running"
    while state in ("pending", "running") and time.monotonic() < deadline:
        time.sleep(0.1)
        peak = [max(p, rss_mib(pid)) for p, pid in zip(peak, workers, strict=True)]
        state = Run.objects.values_list("state", flat=True).get(pk=run_id)
    return state, peak


def _cpu_per_item(roles: Roles, measure) -> tuple[object, dict[str, float]]:
    """What ``measure()`` returns, and the CPU microseconds per item it reports (its second value)
    of each process kind: the benchmark database's backends, the worker parents, their children."""
    from orchestrator.bench.statements import cpu_by_kind

    before = cpu_by_kind(roles)
    value, items = measure()
    after = cpu_by_kind(roles)
    backends = sum(s - before["backends"].get(pid, 0.0) for pid, s in after["backends"].items())
    spent = {"backends": backends, "worker parents": after["worker"] - before["worker"],
             "children": after["children"] - before["children"]}
    return value, {kind: seconds / max(items, 1) * 1e6 for kind, seconds in spent.items()}


def _cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{kind} {us:.0f}" for kind, us in cpu.items())


def one_map(out, items: int, workers: list[int], roles: Roles) -> None:
    from django.db.models import Max, Min
    from django.urls import reverse

    from orchestrator.models import TaskRun
    from orchestrator.runs import create_run

    plain, plain_cpu = _cpu_per_item(roles, lambda: (plain_rate(), PLAIN_JOBS))
    reset_runs()
    before = [rss_mib(pid) for pid in workers]
    peak = list(before)
    started = time.perf_counter()

    def the_map():
        run, _ = create_run(None, trigger="manual", params={"items": items}, tasks={
            "listing": _spec("listing", mapped_by=["work"]),
            "work": _spec("noop_item", ["listing"], map_over="listing"),
        })
        return (run, *_wait_for_run(run.pk, workers, peak)), items

    (run, state, peak), map_cpu = _cpu_per_item(roles, the_map)
    wall = time.perf_counter() - started
    parent = TaskRun.objects.get(run=run, task="listing")
    instances = TaskRun.objects.filter(run=run, task="work", map_index__gte=0)
    ends = instances.aggregate(last=Max("finished_at"), first=Min("started_at"))
    done = instances.filter(state="succeeded").count()
    run_page = reverse("orchestrator:web:run", args=[run.pk])
    instances_page = reverse("orchestrator:web:mapped_instances",
                             args=[TaskRun.objects.get(run=run, task="work", map_index=-1).pk])
    pages = [(label, page_times(path)) for label, path in (("run page", run_page), ("instances page", instances_page))]
    # The plain-job rate again, after the map: on a shared machine the load moves between the two.
    after = plain_rate()
    low, high = sorted((plain, after))
    memory = ", ".join(f"{b:.0f} -> {p:.0f}" for b, p in zip(before, peak, strict=True))
    if parent.finished_at is None or ends["last"] is None:
        out(f"  map over {items:,} items: the run ended {state} before any instance ended ({wall:.0f} s)")
        return
    if state in ("pending", "running"):
        out(f"  map over {items:,} no-op items: unfinished after {MAP_TIMEOUT:.0f} s, {done:,} instances succeeded "
            f"({done / (wall or 1):,.0f}/s); plain jobs {low:,.0f}-{high:,.0f}/s; worker RSS MiB {memory}")
        return
    fan = (ends["last"] - parent.finished_at).total_seconds()
    rate = done / fan if fan else 0.0
    first = (ends["first"] - parent.finished_at).total_seconds() if ends["first"] else float("nan")
    out(f"  map over {items:>7,} no-op items: parent's success -> last instance's end {fan:7.2f} s, "
        f"{rate:>6,.0f} instances/s = {rate / high if high else 0:.0%}-{rate / low if low else 0:.0%} of the plain-job "
        f"rate ({low:,.0f}-{high:,.0f} jobs/s, {PLAIN_JOBS:,} jobs before and after); first instance started after "
        f"{first:.2f} s; {done:,} succeeded, run {state}; worker RSS MiB (before -> peak) {memory}")
    out(f"    CPU per item (µs), the map's instances: {_cpu_text(map_cpu)}; the plain jobs before it: "
        f"{_cpu_text(plain_cpu)}")
    for label, times in pages:
        out(f"    {label} of that run: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms "
            f"over {len(times)} requests")


def run(out, sizes=SIZES, workers: int = 2, concurrency: int = 16) -> None:
    saved = {key: os.environ.get(key) for key in LIMITS}
    os.environ.update(LIMITS)  # the processes started below inherit them (bench.core.child_env)
    roles = Roles()
    try:
        reset_work()
        roles.start("dispatcher")
        roles.workers(workers, concurrency)
        worker_pids = [proc.pid for proc in roles.procs[1:]]
        out(f"  {workers} worker process(es) x {concurrency} children, one dispatcher; each map beside "
            f"{PLAIN_JOBS:,} plain no-op jobs run by the same processes just before and just after it")
        for items in sizes:
            one_map(out, items, worker_pids, roles)
    finally:
        roles.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
