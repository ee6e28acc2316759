"""The workflow page's grid: the workflow's runs as columns by logical date (newest right), a row per
task, each cell coloured by its task run's state (however short the run, its state is read at a
glance), and in it a bar as tall as the task run took against the longest one shown.

A page of the grid reads one page of runs on the (workflow, logical_date, id) index and their
task runs (mapped instances counted, not loaded), so it costs the same however long the history.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q
from django.utils.http import urlencode

from orchestrator.models import Run, TaskRun, Workflow
from orchestrator.web import mapped, svg
from orchestrator.web.kit import seconds

RUNS = 25
SIZES = (25, 50, 100, 200)
BAR = 24  # px: the height of a cell
SHORTEST = 3  # px: a task run that took almost nothing still shows its bar


def bar(took: float | None, longest: float) -> tuple[int, int]:
    """(y, height) of a cell's bar: its share of ``longest``, at least a few pixels; none for a
    task run that never started (waiting, upstream failed, ...): its colour says so."""
    if took is None:
        height = 0
    elif longest:
        height = max(SHORTEST, round(BAR * took / longest))
    else:
        height = SHORTEST
    return BAR - height, height


def page_of_runs(wf: Workflow, size: int, before: int | None) -> tuple[list[Run], bool, bool]:
    """Up to ``size`` runs of ``wf`` by logical date, oldest first, ending just before run
    ``before`` (or at the newest); whether older runs exist; whether the page was pivoted on an
    existing run."""
    runs = Run.objects.filter(workflow=wf)
    pivot = Run.objects.filter(workflow=wf, pk=before).values_list("logical_date", "id").first() if before else None
    if pivot:
        runs = runs.filter(Q(logical_date__lt=pivot[0]) | Q(logical_date=pivot[0], pk__lt=pivot[1]))
    runs = list(runs.order_by("-logical_date", "-id")[: size + 1])
    has_older = len(runs) > size
    runs = runs[:size]
    runs.reverse()
    return runs, has_older, bool(pivot)


def cells(runs: list[Run], now: datetime) -> dict[tuple[int, str], TaskRun]:
    """{(run id, task): its task run} with each one's time and bar."""
    found = {
        (tr.run_id, tr.task): tr
        for tr in TaskRun.objects.filter(run_id__in=[r.pk for r in runs], map_index=-1)
        .only("id", "run_id", "task", "state", "attempts", "started_at", "finished_at")
    }
    for key, summary in mapped.summaries([r.pk for r in runs if r.dynamic]).items():
        if key in found:
            found[key].mapped = summary
    for tr in found.values():
        tr.seconds = seconds(tr.started_at, tr.finished_at, now)
    longest = max((tr.seconds for tr in found.values() if tr.seconds), default=0.0)
    for tr in found.values():
        tr.bar_y, tr.bar_h = bar(tr.seconds, longest)
    return found


def grid_context(wf: Workflow, upstream: dict[str, list[str]], now: datetime, size: int = RUNS,
                 before: int | None = None) -> dict:
    """The grid of ``wf``: ``size`` runs (``?runs=``), those before run ``before`` (``?before=``)."""
    runs, has_older, paged = page_of_runs(wf, size, before)
    found = cells(runs, now)
    order = svg.task_order(upstream)
    extra = sorted({task for (_run, task) in found} - set(order))
    query = {"runs": size} if size != RUNS else {}
    return {
        "runs": runs,
        "grid_rows": [(task, [(run, found.get((run.pk, task))) for run in runs]) for task in order + extra],
        "grid_bar": BAR,
        "grid_size": size,
        "grid_sizes": SIZES,
        "grid_paged": paged,
        "grid_query": urlencode({**query, **({"before": before} if paged else {})}),
        "grid_older": urlencode({**query, "before": runs[0].pk}) if has_older and runs else None,
        "grid_newest": urlencode(query),
    }
