"""``manage.py bench --only map``: a map over many items of no-op tasks, with a real dispatcher
and real worker processes on the benchmark database.

Two figures: the time from the mapped-over parent's success (its recorded ``finished_at``) to
the last instance's end, i.e. creating the instances, dispatching, running and recording them,
and ending the mapped task; then the server time of the run page for that run (Django's test
client, median of a few requests), which must not grow with the number of instances.
"""

from __future__ import annotations

import statistics
import time

from orchestrator.bench.core import JOBS_MODULE, Roles, reset_work

ITEMS = 10_000  # also the default of ORCHESTRATOR_MAX_MAP_ITEMS


def _spec(ref: str, upstream=(), **extra) -> dict:
    return {"kind": "python", "ref": f"{JOBS_MODULE}:{ref}", "upstream": list(upstream), **extra}


def page_times(path: str, repeat: int = 5) -> list[float]:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import override_settings

    user, _ = get_user_model().objects.get_or_create(username="bench-map", defaults={"is_superuser": True,
                                                                                      "is_staff": True})
    client = Client()
    client.force_login(user)
    times = []
    with override_settings(ALLOWED_HOSTS=["*"]):
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{path} answered {response.status_code}")
    return times


def run(out, items: int = ITEMS, workers: int = 2, concurrency: int = 16) -> None:
    from django.db.models import Max
    from django.urls import reverse

    from orchestrator.models import Run, TaskRun
    from orchestrator.runs import create_run

    reset_work()
    roles = Roles()
    try:
        roles.start("dispatcher")
        roles.workers(workers, concurrency)
        time.sleep(0.5)
        started = time.perf_counter()
        run, _ = create_run(None, trigger="manual", params={"items": items}, tasks={
            "listing": _spec("listing", mapped_by=["work"]),
            "work": _spec("noop_item", ["listing"], map_over="listing"),
        })
        deadline = time.monotonic() + 900
        state = "running"
        while state in ("pending", "running") and time.monotonic() < deadline:
            time.sleep(0.05)
            state = Run.objects.values_list("state", flat=True).get(pk=run.pk)
        wall = time.perf_counter() - started
    finally:
        roles.stop()
    parent = TaskRun.objects.get(run=run, task="listing")
    instances = TaskRun.objects.filter(run=run, task="work", map_index__gte=0)
    last_end = instances.aggregate(last=Max("finished_at"))["last"]
    done = instances.filter(state="succeeded").count()
    if parent.finished_at is None or last_end is None:
        out(f"  map over {items:,} items: the run ended {state} before any instance ended")
        return
    fan = (last_end - parent.finished_at).total_seconds()
    out(f"  map over {items:,} no-op items, {workers} workers x {concurrency}: parent's success -> last instance's "
        f"end {fan:.2f} s ({done / fan if fan else 0:,.0f} instances/s; {done:,} succeeded; run {state}, "
        f"{wall:.2f} s from trigger)")
    for label, path in (("run page", reverse("orchestrator:web:run", args=[run.pk])),
                        ("instances page", reverse("orchestrator:web:mapped_instances",
                                                   args=[TaskRun.objects.get(run=run, task="work", map_index=-1).pk]))):
        times = page_times(path)
        out(f"  {label} of that run ({items:,} instances): median {statistics.median(times):.1f} ms, "
            f"max {max(times):.1f} ms over {len(times)} requests")
