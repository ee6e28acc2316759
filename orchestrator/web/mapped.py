"""Mapped tasks on the pages: the run page, its graph and the workflow's grid show a mapped task
as one node, one row and one cell (its own row, map_index -1) with counts of its instances per
state; the instances are listed under that row, and all of them, page by page, on a page of their
own (``mapped_instances``).

A map over ten thousand items must not cost the run page ten thousand rows: counts come from the
counts kept as task runs change state (``counts.py``, a few rows per run), and only a few
instances are loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.shortcuts import get_object_or_404

from orchestrator import clock, counts
from orchestrator.limits import MAX_ID
from orchestrator.models import TaskRun
from orchestrator.states import TaskState
from orchestrator.web.errors import InvalidInput, query_int

INSTANCES_SHOWN = 20  # under the mapped task's row on the run page
INSTANCES_PAGE = 200  # on the instances page

STATE_ORDER = {state: index for index, state in enumerate(TaskState.values)}


@dataclass
class Summary:
    """The instances of one mapped task in one run."""

    counts: dict[str, int] = field(default_factory=dict)
    first_start: datetime | None = None
    last_end: datetime | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def ordered(self) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda item: STATE_ORDER.get(item[0], len(STATE_ORDER)))

    @property
    def ended(self) -> int:
        return sum(n for state, n in self.counts.items()
                   if state in (TaskState.SUCCEEDED, TaskState.SKIPPED, TaskState.FAILED, TaskState.DEAD,
                                TaskState.UPSTREAM_FAILED, TaskState.CANCELLED))

    @property
    def short(self) -> str:
        """The node's note: how many ended of how many."""
        return f"{self.ended}/{self.total}"

    @property
    def words(self) -> str:
        """For titles: "40 instances: 37 succeeded, 3 running"."""
        parts = ", ".join(f"{n} {state.replace('_', ' ')}" for state, n in self.ordered)
        return f"{self.total} instance{'s' if self.total != 1 else ''}" + (f": {parts}" if parts else "")


def summaries(run_ids: list[int]) -> dict[tuple[int, str], Summary]:
    """{(run id, task): Summary} of every mapped task with instances in these runs, from the counts
    kept as task runs change state (``counts.py``): a few rows per run, whatever the maps' sizes."""
    return {key: Summary(by_state) for key, by_state in counts.runs_instance_counts(run_ids).items()}


def task_summary(run_id: int, task: str) -> Summary:
    """The instances of one mapped task counted by state, from the counts kept (``counts.py``)."""
    return Summary(counts.task_instance_counts(run_id, task))


def is_mapped(tr: TaskRun) -> bool:
    """Whether ``tr`` is a mapped task's own task run (the summary of its instances)."""
    return tr.map_index == -1 and "map_over" in (tr.spec or {})


def page_summaries(instances: dict[str, dict[str, int]], task_runs: list[TaskRun],
                   shown: dict[str, list[TaskRun]]) -> dict[str, Summary]:
    """{task: Summary} of the mapped tasks among ``task_runs`` (a page of the run page), from their
    counts (``reads.run_counts``) and their first instances (``first_instances``): the map's time
    is from the first of those to start (instances start in index order, give or take the
    workers' batches) to the mapped task's own end, so that no statement reads every instance's
    row for a min() and a max()."""
    found = {}
    for tr in task_runs:
        if tr.task in instances:
            starts = [i.started_at for i in shown.get(tr.task, []) if i.started_at]
            found[tr.task] = Summary(dict(instances[tr.task]), min(starts, default=None), tr.finished_at)
    return found


def first_instances(run_id: int, tasks: list[str], limit: int = INSTANCES_SHOWN) -> dict[str, list[TaskRun]]:
    """The lowest-numbered instances of each of these mapped tasks."""
    shown: dict[str, list[TaskRun]] = {}
    for task in tasks:
        shown[task] = list(TaskRun.objects.filter(run_id=run_id, task=task, map_index__gte=0)
                           .order_by("map_index")
                           .only("id", "task", "map_index", "state", "attempts", "max_attempts", "started_at",
                                 "finished_at", "error")[:limit])
    return shown


def instances_context(request, task_run_id: int) -> dict:
    """The instances page: the mapped task's instances from ``?from=`` (a map index), optionally
    of one ``?state=``, a page at a time (keyset on map_index, no OFFSET)."""
    own = get_object_or_404(TaskRun.objects.select_related("run__workflow"), pk=task_run_id, map_index=-1)
    start = query_int(request, "from", 0, 0, MAX_ID)
    state = request.GET.get("state", "")
    if state and state not in TaskState.values:
        raise InvalidInput("state", f"state must be one of {', '.join(TaskState.values)}, got {state[:40]!r}")
    instances = TaskRun.objects.filter(run_id=own.run_id, task=own.task, map_index__gte=start)
    if state:
        instances = instances.filter(state=state)
    page = list(instances.order_by("map_index")
                .only("id", "task", "map_index", "state", "attempts", "max_attempts", "started_at", "finished_at",
                      "error")[:INSTANCES_PAGE + 1])
    more = len(page) > INSTANCES_PAGE
    page = page[:INSTANCES_PAGE]
    now = clock.now()
    for instance in page:
        instance.seconds = ((instance.finished_at or now) - instance.started_at).total_seconds() \
            if instance.started_at else None
    summary = task_summary(own.run_id, own.task)
    return {
        "tr": own, "run": own.run, "summary": summary, "instances": page, "state": state,
        "next_from": page[-1].map_index + 1 if more else None, "start": start,
    }
