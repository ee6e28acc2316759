"""The workflow page's grid: the workflow's runs as columns by logical date (newest right), a row per
task, each cell coloured by its task run's state (however short the run, its state is read at a
glance), and in it a bar as tall as the task run took against the longest one shown.

A page of the grid reads one page of runs on the (workflow, logical_date, id) index and their
task runs (mapped instances counted, not loaded), so it costs the same however long the history.

Filters (``?state=``, ``?trigger=``, ``?since=``/``?until=`` dates in the viewer's clock) narrow
the runs shown and stay in every link of the grid (sizes, older, newest, a picked run). A date
range bounds the index range walked; a state or trigger filter is checked on the rows the walk
meets.

Task groups (``orchestrator.web.folding``) are folded to one row each until ``?unfold=<group>``
unfolds them; the fold is kept in the grid's links as the filters are, and costs no read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, tzinfo

from django.db.models import Q
from django.utils.http import urlencode

from orchestrator.models import Run, TaskRun, Workflow
from orchestrator.states import RunState, Trigger
from orchestrator.web import folding, mapped, svg
from orchestrator.web.errors import InvalidInput
from orchestrator.web.kit import day_bounds, seconds

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


@dataclass(frozen=True)
class Filters:
    """What the grid shows: runs in ``state``, started by ``trigger``, with a logical date from
    day ``since`` to day ``until`` (both included) in ``zone``."""

    state: str = ""
    trigger: str = ""
    since: date | None = None
    until: date | None = None
    zone: tzinfo | None = None
    fold: folding.Fold = folding.Fold()  # the groups shown unfolded: not a filter, kept as one

    def __bool__(self) -> bool:
        return bool(self.state or self.trigger or self.since or self.until)

    def query(self) -> dict[str, str]:
        """The filters as query parameters, for the grid's links."""
        found = {"state": self.state, "trigger": self.trigger,
                 "since": self.since.isoformat() if self.since else "",
                 "until": self.until.isoformat() if self.until else "",
                 "unfold": sorted(self.fold.unfolded)}
        return {key: value for key, value in found.items() if value}

    def apply(self, runs):
        if self.state:
            runs = runs.filter(state=self.state)
        if self.trigger:
            runs = runs.filter(trigger=self.trigger)
        lo, hi = day_bounds(self.since, self.until, self.zone or UTC)
        if lo:
            runs = runs.filter(logical_date__gte=lo)
        if hi:
            runs = runs.filter(logical_date__lt=hi)
        return runs


def _choice(params, name: str, choices) -> str:
    value = params.get(name, "")
    if value and value not in choices.values:
        raise InvalidInput(name, f"{name} must be one of {', '.join(choices.values)}, got {value[:80]!r}")
    return value


def _day(params, name: str) -> date | None:
    value = params.get(name, "")
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidInput(name, f"{name} must be a date as YYYY-MM-DD, got {value[:80]!r}") from None


def filters_from(params, zone: tzinfo | None = None) -> Filters:
    """The grid's filters (and fold) from a query (``request.GET``); a bad value is a 400 naming it."""
    found = Filters(state=_choice(params, "state", RunState), trigger=_choice(params, "trigger", Trigger),
                    since=_day(params, "since"), until=_day(params, "until"), zone=zone,
                    fold=folding.fold_from(params))
    if found.since and found.until and found.since > found.until:
        raise InvalidInput("since", f"since ({found.since}) is after until ({found.until})")
    return found


def page_of_runs(wf: Workflow, size: int, before: int | None,
                 filters: Filters | None = None) -> tuple[list[Run], bool, bool]:
    """Up to ``size`` runs of ``wf`` by logical date, oldest first, ending just before run
    ``before`` (or at the newest); whether older runs exist; whether the page was pivoted on an
    existing run."""
    runs = (filters or Filters()).apply(Run.objects.filter(workflow=wf))
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
                 before: int | None = None, filters: Filters | None = None) -> dict:
    """The grid of ``wf``: ``size`` runs (``?runs=``), those before run ``before`` (``?before=``),
    those that pass ``filters``."""
    filters = filters if filters is not None else Filters()  # one that only unfolds groups is false
    runs, has_older, paged = page_of_runs(wf, size, before, filters)
    found = cells(runs, now)
    order = svg.task_order(upstream)
    extra = sorted({task for (_run, task) in found} - set(order))
    kept = filters.query()
    query = {**kept, **({"runs": size} if size != RUNS else {})}
    groups = folding.Groups.of_spec(wf.spec)
    return {
        "grid_fold": filters.fold,
        "grid_groups": bool(groups),
        "grid_filters": filters,
        "grid_states": RunState.values,
        "grid_triggers": Trigger.values,
        "grid_sizes_qs": [(n, urlencode({**kept, **({"runs": n} if n != RUNS else {})}, doseq=True)) for n in SIZES],
        "grid_filtered": bool(filters),
        "runs": runs,
        "grid_rows": folding.grid_rows(order + extra, groups, filters.fold, runs, found),
        "grid_bar": BAR,
        "grid_size": size,
        "grid_sizes": SIZES,
        "grid_paged": paged,
        "grid_query": urlencode({**query, **({"before": before} if paged else {})}, doseq=True),
        "grid_older": urlencode({**query, "before": runs[0].pk}, doseq=True) if has_older and runs else None,
        "grid_newest": urlencode(query, doseq=True),
    }
