"""The runs pages: the list of runs (filtered, keyset-paged) and a run's page (its graph, its task
runs with every attempt on a timeline, mapped tasks counted), with cancel and retry. A run's page
lists its tasks a page at a time, counts everything else in SQL, and draws the graph for up to
``GRAPH_MOST`` tasks, so a run of 100,000 tasks costs what a run of a few hundred does."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import messages
from django.db.models import Prefetch, prefetch_related_objects
from django.shortcuts import get_object_or_404
from django.urls import reverse

from orchestrator import access, approvals, audit, clock, control, reads
from orchestrator.limits import MAX_ID
from orchestrator.models import Attempt, Run, TaskRun
from orchestrator.states import TaskState
from orchestrator.web import actions, folding, lineage, mapped, svg, zones
from orchestrator.web.errors import query_int
from orchestrator.web.forms import RUN_BULK_ACTIONS, RunFilterForm
from orchestrator.web.kit import (
    POLL,
    back,
    day_bounds,
    id_cursor,
    operator_action,
    page,
    page_links,
    seconds,
    valid_filters,
    viewer_required,
    workflow_filter,
)
from orchestrator.web.timeline import Axis

RETRYABLE = (TaskState.DEAD, TaskState.FAILED, TaskState.UPSTREAM_FAILED)


def filter_runs(data: dict, zone=UTC):
    """The runs matching the list's filters, without pagination; dates are days in ``zone``."""
    since, until = day_bounds(data.get("since"), data.get("until"), zone)
    return reads.runs(workflow=workflow_filter(data.get("workflow")), state=data.get("state"),
                      trigger=data.get("trigger"), logical_from=since, logical_before=until)


@viewer_required
def run_list(request):
    form = RunFilterForm(request.GET or None, user=request.user)
    data = valid_filters(form)
    runs = reads.RUN_ORDER.page(access.visible(request.user, filter_runs(data, zones.for_request(request).zone))
                                .select_related("workflow", "created_by"), id_cursor(data))
    now = clock.now()
    for run in runs.rows:
        run.seconds = seconds(run.started_at, run.finished_at, now)
    return page(request, "orchestrator/web/runs.html", {"form": form, "runs": runs.rows, "bulk_actions": RUN_BULK_ACTIONS,
                                                        **page_links(request, runs)})


TASKS_PAGE = 100  # tasks on one page of the run page; the graph is drawn when every task fits one
GRAPH_MOST = TASKS_PAGE


def tasks_in_order(run: Run, after: int | None) -> tuple[list[TaskRun], int | None, dict[str, list[str]] | None]:
    """A page of the run's tasks (a mapped task as its own row, its instances counted apart) with
    their attempts, from the one after task run ``after``; the id the next page starts after; and
    the graph ({task: upstream}) when the whole run fits the page, its rows then in the graph's
    order. A run of 100,000 tasks costs what a run of 300 does: one page, no graph."""
    task_runs, next_after = reads.run_tasks(run.pk, after, TASKS_PAGE)
    prefetch_related_objects(task_runs, Prefetch("attempt_set", queryset=Attempt.objects.order_by("number")))
    if after is not None or next_after is not None or len(task_runs) > GRAPH_MOST:
        return task_runs, next_after, None
    upstream = {tr.task: list(tr.upstream) for tr in task_runs}
    order = {name: index for index, name in enumerate(svg.task_order(upstream))}
    task_runs.sort(key=lambda tr: (order.get(tr.task, len(order)), tr.task))
    return task_runs, next_after, upstream


def axis_of(run: Run, task_runs: list[TaskRun], summaries: dict[str, mapped.Summary], now: datetime) -> Axis:
    """The timeline's axis: the run's own span, and the attempts and mapped tasks of the page
    (the same axis on every page of a finished run)."""
    intervals = [(a.started_at, a.finished_at) for tr in task_runs for a in tr.attempt_set.all()]
    intervals += [(s.first_start, s.last_end) for s in summaries.values() if s.first_start]
    if run.started_at:
        intervals.append((run.started_at, run.finished_at))
    return Axis.over(intervals, now)


def task_run_links(task_runs: list[TaskRun]) -> None:
    """Each task run's page address, reversed once for the page rather than three times a row
    (a third of the run page's time was spent in reverse())."""
    pattern = reverse("orchestrator:web:task_run", args=[MAX_ID])
    for tr in task_runs:
        tr.url = pattern.replace(str(MAX_ID), str(tr.pk))


def place_attempts(task_runs: list[TaskRun], axis: Axis, now: datetime) -> None:
    for tr in task_runs:
        tr.seconds = seconds(tr.started_at, tr.finished_at, now)
        tr.bars = [{"attempt": attempt, **axis.bar(attempt.started_at,
                                                   seconds(attempt.started_at, attempt.finished_at, now) or 0.0)}
                   for attempt in tr.attempt_set.all()]


def place_instances(task_runs: list[TaskRun], summaries: dict[str, mapped.Summary],
                    shown: dict[str, list[TaskRun]], axis: Axis, now: datetime) -> None:
    """Mapped tasks on the run page: their counts, the first instances under their row, and one
    timeline bar from the first instance's start to the map's end."""
    for tr in task_runs:
        tr.mapped = summaries.get(tr.task)
        if tr.mapped is None:
            continue
        tr.instances = shown.get(tr.task, [])
        for instance in tr.instances:
            instance.seconds = seconds(instance.started_at, instance.finished_at, now)
        if tr.mapped.first_start and axis.start:
            end = tr.mapped.last_end if tr.state != TaskState.MAPPED else None
            tr.seconds = seconds(tr.mapped.first_start, end, now)
            tr.span_bar = axis.bar(tr.mapped.first_start, tr.seconds or 0.0)


def run_context(run: Run, now: datetime, after: int | None = None, fold: folding.Fold | None = None) -> dict:
    """The run page from the task after task run ``after``, its graph's groups unfolded by
    ``fold``: a bounded number of statements, each
    returning a bounded number of rows, whatever the size of the run (tests/test_pages_at_size.py)."""
    task_runs, next_after, upstream = tasks_in_order(run, after)
    counts = reads.run_counts(run)
    # The mapped tasks of this page: counted (reads.run_counts), a few instances loaded.
    shown = mapped.first_instances(run.pk, sorted({tr.task for tr in task_runs} & set(counts.instances)))
    summaries = mapped.page_summaries(counts.instances, task_runs, shown)
    axis = axis_of(run, task_runs, summaries, now)
    place_attempts(task_runs, axis, now)
    place_instances(task_runs, summaries, shown, axis, now)
    task_run_links(task_runs)
    states = set(counts.tasks) | {state for by_state in counts.instances.values() for state in by_state}
    graph = None
    if upstream is not None:
        graph = svg.graph(upstream, {tr.task: tr.state for tr in task_runs}, {tr.task: tr.url for tr in task_runs},
                          {task: (summary.short, summary.words) for task, summary in summaries.items()},
                          svg.shape_of({"tasks": {tr.task: tr.spec for tr in task_runs}}, lineage.url), fold)
    return {
        "run": run,
        "task_runs": task_runs,
        "counts": sorted(counts.tasks.items()),
        "total_tasks": counts.total_tasks,
        "graph": graph,
        "graph_most": GRAPH_MOST,
        "after": after,
        "next_after": next_after,
        "span_start": axis.start,
        "span": axis.length if axis.start else None,
        "seconds": seconds(run.started_at or axis.start, run.finished_at, now),
        "retryable": any(state in RETRYABLE for state in states),
        "poll": POLL if run.is_active else None,
    }


@viewer_required
def run_detail(request, run_id):
    # Not the graph version's spec: the page draws the graph from the task runs (a run of 100,000
    # tasks has megabytes of spec).
    run = get_object_or_404(access.visible(request.user, Run.objects.select_related(
        "workflow", "version", "created_by", "schedule").defer("version__spec")), pk=run_id)
    after = query_int(request, "after", None, 1, MAX_ID)
    context = run_context(run, clock.now(), after, folding.fold_from(request.GET))
    context["can_operate"] = access.can_operate(request.user, run)
    context["approvals"] = approvals.waiting_for(request.user, run) if run.is_active else []
    context.update(actions.page_extras(run))
    return page(request, "orchestrator/web/run.html", context, partial="live")


@operator_action
def run_cancel(request, run_id):
    run = get_object_or_404(access.visible(request.user, Run.objects.select_related("workflow")), pk=run_id)
    access.require_operate(request.user, run)
    cancelled = control.cancel_run(run, reason=f"cancelled in the web UI by {request.user.get_username()}",
                                   by=request.user)
    audit.record("cancel", request=request, target=run, changed=cancelled)
    if cancelled:
        messages.success(request, f"Cancelled run #{run.pk}.")
    else:
        messages.warning(request, f"Run #{run.pk} had already ended; nothing was cancelled.")
    return back(request, reverse("orchestrator:web:run", args=[run.pk]))


@operator_action
def run_retry(request, run_id):
    run = get_object_or_404(access.visible(request.user, Run.objects.select_related("workflow")), pk=run_id)
    access.require_operate(request.user, run)
    count = control.retry_run(run)
    audit.record("retry", request=request, target=run, changed=count)
    if count:
        messages.success(request, f"Retrying {count} task run{'s' if count != 1 else ''} of run #{run.pk}.")
    else:
        messages.warning(request, f"Run #{run.pk} has no dead, failed or upstream-failed task to retry.")
    return back(request, reverse("orchestrator:web:run", args=[run.pk]))
