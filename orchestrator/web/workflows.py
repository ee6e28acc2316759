"""The workflow pages: the list with each workflow's latest runs and next fire times, and a
workflow's page (its grid, the graph of a picked run, its run history, schedules, fire times that
did not run, its data, and the trigger form), with trigger, pause and resume."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib import messages
from django.db import connection
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.http import urlencode

from orchestrator import access, audit, clock, control, cron
from orchestrator.limits import MAX_ID
from orchestrator.models import Run, TaskRun, Workflow
from orchestrator.params import ParamError
from orchestrator.runs import RunError, trigger_workflow
from orchestrator.states import RunState, Trigger
from orchestrator.web import grid, lineage, mapped, svg, zones
from orchestrator.web.errors import query_int
from orchestrator.web.forms import (
    RUN_BULK_ACTIONS,
    BackfillForm,
    backfill_step,
    logical_date_of,
    param_fields,
    submitted_params,
)
from orchestrator.web.kit import back, is_htmx, operator_action, page, seconds, viewer_required
from orchestrator.web.task_runs import task_actions

CHART_RUNS = 40
NOT_RUN_SHOWN = 10
STRIP_RUNS = 14

# The newest runs of each workflow in one query: a LATERAL join that walks the (workflow, -id)
# index of each workflow for a few rows instead of ranking the whole table.
LAST_RUNS_SQL = """
    SELECT w.id, r.id, r.state FROM unnest(%s::bigint[]) AS w(id) CROSS JOIN LATERAL (
        SELECT id, state FROM orchestrator_run WHERE workflow_id = w.id ORDER BY id DESC LIMIT %s) r
"""


def last_run_states(workflow_ids: list[int], per_workflow: int = STRIP_RUNS) -> dict[int, list[tuple[int, str]]]:
    """{workflow id: [(run id, state), ...]}, oldest left, newest right."""
    strips: dict[int, list[tuple[int, str]]] = {wid: [] for wid in workflow_ids}
    if not workflow_ids:
        return strips
    with connection.cursor() as cursor:
        cursor.execute(LAST_RUNS_SQL, [workflow_ids, per_workflow])
        for workflow_id, run_id, state in cursor.fetchall():
            strips[workflow_id].append((run_id, state))
    for runs in strips.values():
        runs.reverse()
    return strips


def describe(expr: str) -> str:
    try:
        return cron.describe(expr)
    except cron.CronError as exc:
        return f"invalid: {exc}"


def next_fires(wf: Workflow, now: datetime, count: int = 3) -> list[datetime]:
    """The next fire times of the workflow's active schedules: the scheduler's own next_fire_at
    first (it knows catch-up and jitter), then what cron says."""
    active = [s for s in wf.schedules.all() if not s.paused]
    upcoming = {s.next_fire_at for s in active if s.next_fire_at}
    for schedule in active:
        try:
            upcoming.update(at for at, _local in cron.preview(schedule.cron, schedule.timezone, now, count=count))
        except cron.CronError:
            pass
    return sorted(upcoming)[:count]


def workflows_context(now: datetime, workflows=None) -> dict:
    """The list's context, of ``workflows`` (a queryset: those a user may read) or of every workflow."""
    workflows = list((Workflow.objects.all() if workflows is None else workflows).select_related("current_version")
                     .prefetch_related("schedules").order_by("-present", "name"))
    strips = last_run_states([wf.pk for wf in workflows])
    for wf in workflows:
        wf.strip = strips[wf.pk]
        wf.schedule_list = [(s, describe(s.cron)) for s in wf.schedules.all()]
        wf.task_count = len(wf.spec.get("tasks", {}))
        wf.next_fires = next_fires(wf, now)
        # What starts it besides its schedules: its dataset triggers, (mode, dataset names).
        wf.dataset_triggers = [(trigger.get("mode", "any"), list(trigger.get("datasets", [])))
                               for trigger in wf.spec.get("triggers", []) if trigger.get("datasets")]
    return {"workflows": workflows}


@viewer_required
def workflow_list(request):
    return page(request, "orchestrator/web/workflows.html",
                workflows_context(clock.now(), access.visible(request.user, Workflow.objects.all())))


def selected_graph(wf: Workflow, selected: Run | None, upstream: dict[str, list[str]]):
    """The graph of the picked run: its own version's tasks, each in its state and linking to its
    task run, a mapped task with its counts."""
    spec = wf.spec
    if selected is not None and selected.version_id and selected.version_id != wf.current_version_id:
        spec = selected.version.spec
        upstream = svg.upstream_of(spec)
    shape = svg.shape_of(spec, lineage.url)
    if selected is None:
        return svg.graph(upstream, {}, {}, {}, shape)
    states, links = {}, {}
    for tr in TaskRun.objects.filter(run=selected, map_index=-1).only("id", "task", "state"):
        states[tr.task] = tr.state
        links[tr.task] = reverse("orchestrator:web:task_run", args=[tr.pk])
    notes = {task: (summary.short, summary.words)
             for (_run, task), summary in mapped.summaries([selected.pk] if selected.dynamic else []).items()}
    return svg.graph(upstream, states, links, notes, shape)


def history(wf: Workflow, now: datetime) -> dict:
    """The chart of the last finished runs (skipped and missed fire times aside) and their success rate."""
    finished = list(Run.objects.filter(workflow=wf, finished_at__isnull=False)
                    .exclude(state__in=[RunState.SKIPPED, RunState.MISSED])
                    .order_by("-id").only("id", "state", "started_at", "created_at", "finished_at")[:CHART_RUNS])
    finished.reverse()
    bars = [svg.Bar(r.pk, r.state, seconds(r.started_at or r.created_at, r.finished_at, now) or 0.0,
                    reverse("orchestrator:web:run", args=[r.pk])) for r in finished]
    succeeded = sum(1 for r in finished if r.state == RunState.SUCCEEDED)
    return {
        "chart": svg.history_chart(bars),
        "success_rate": (100.0 * succeeded / len(finished)) if finished else None,
        "finished_count": len(finished),
    }


def not_run(wf: Workflow, now: datetime) -> dict:
    """Fire times of the last day that did not run (catchup, overlap, deadline, bad params): each is
    a skipped or missed run with its reason; a long gap is one summary row."""
    rows = Run.objects.filter(workflow=wf, trigger=Trigger.SCHEDULE, state__in=[RunState.SKIPPED, RunState.MISSED],
                              finished_at__gte=now - timedelta(hours=24))
    return {
        "not_run": list(rows.order_by("-logical_date").only("id", "state", "logical_date", "reason")[:NOT_RUN_SHOWN]),
        "not_run_count": rows.count(),
    }


def schedules(wf: Workflow, now: datetime) -> list[tuple]:
    """Each schedule with its description and next fire times, in the viewer's time and as the
    local wall-clock time in the schedule's own zone."""
    found = []
    for schedule in wf.schedules.all():
        try:
            upcoming = [(at, local.strftime("%a %H:%M %Z"))
                        for at, local in cron.preview(schedule.cron, schedule.timezone, now, count=5)]
        except cron.CronError as exc:
            upcoming, schedule.error = [], str(exc)
        found.append((schedule, describe(schedule.cron), upcoming))
    return found


def workflow_context(wf: Workflow, now: datetime, *, run: int | None = None, grid_size: int = grid.RUNS,
                     grid_before: int | None = None, grid_filters: grid.Filters | None = None,
                     submitted: dict | None = None, errors: dict | None = None, form_error: str = "",
                     readable=None) -> dict:
    """The workflow page: ``run`` is the run picked for the graph (the newest one shown when
    absent), ``submitted``, ``errors`` and ``form_error`` what the trigger form shows again."""
    upstream = svg.upstream_of(wf.spec)
    cells = grid.grid_context(wf, upstream, now, grid_size, grid_before, grid_filters)
    runs = cells["runs"]
    selected = Run.objects.filter(workflow=wf, pk=run).select_related("version").first() if run else None
    if selected is None and runs:
        selected = runs[-1]
    return {
        "wf": wf,
        "data": lineage.of_workflow(wf, readable),
        "spec": wf.spec,
        **cells,
        "selected": selected,
        "graph": selected_graph(wf, selected, upstream),
        **history(wf, now),
        "schedules": schedules(wf, now),
        **not_run(wf, now),
        "fields": param_fields(wf.spec, submitted, errors),
        "unknown_errors": {k: v for k, v in (errors or {}).items() if k not in wf.spec.get("params", {})},
        "form_error": form_error,
        "poll": "3s" if any(r.is_active for r in runs) else None,
        # The list under the grid (operators tick runs there for the runs list's bulk actions).
        "recent_runs": recent_runs(runs, now),
        "bulk_actions": RUN_BULK_ACTIONS,
    }


def recent_runs(runs: list[Run], now: datetime) -> list[Run]:
    """The grid's runs, newest first, each with its duration so far."""
    for run in runs:
        run.seconds = seconds(run.started_at, run.finished_at, now)
    return list(reversed(runs))


def _page_context(request, wf: Workflow, **form) -> dict:
    context = workflow_context(
        wf, clock.now(), grid_size=query_int(request, "runs", grid.RUNS, 1, grid.SIZES[-1]),
        grid_before=query_int(request, "before", None, 1, MAX_ID), run=query_int(request, "run", None, 1, MAX_ID),
        readable=access.visible(request.user, Workflow.objects.all()),
        grid_filters=grid.filters_from(request.GET, zones.for_request(request).zone), **form,
    )
    # The live part polls the workflow's GET view, also when this page answers a POST (a trigger
    # with bad params) whose own URL takes no GET.
    context["live_url"] = reverse("orchestrator:web:workflow", args=[wf.name]) + (
        f"?{request.GET.urlencode()}" if request.GET else "")
    return context


def grid_panel(request, wf: Workflow) -> TaskRun | None:
    """The task run picked in the grid (``?run=<id>&task=<name>``), with the actions that apply."""
    run_id = query_int(request, "run", None, 1, MAX_ID)
    task = request.GET.get("task")
    if not run_id or not task:
        return None
    tr = (TaskRun.objects.select_related("run").filter(run__workflow=wf, run_id=run_id, task=task, map_index=-1)
          .first())
    if tr is not None:
        tr.seconds = seconds(tr.started_at, tr.finished_at, clock.now())
        tr.actions = task_actions(tr)
    return tr


@viewer_required
def workflow_detail(request, name):
    wf = get_object_or_404(access.visible(request.user, Workflow.objects.select_related("current_version")), name=name)
    if is_htmx(request) and request.GET.get("panel"):
        # A grid cell was picked: only the panel under the grid.
        return page(request, "orchestrator/web/workflow.html#task_panel", {"wf": wf, "panel": grid_panel(request, wf)})
    context = _page_context(request, wf)
    context["can_operate"] = access.can_operate(request.user, wf)
    context["panel"] = grid_panel(request, wf)
    context["backfill_form"] = BackfillForm(workflow=wf)
    return page(request, "orchestrator/web/workflow.html", context, partial="live")


def _refused(request, wf: Workflow, values: dict, date_text: str, *, errors=None, form_error="", date_error=""):
    """The workflow page again with the trigger form as it was sent and what is wrong with it (400)."""
    context = _page_context(request, wf, submitted=values, errors=errors, form_error=form_error)
    context.update({"logical_date_text": date_text, "logical_date_error": date_error})
    return page(request, "orchestrator/web/workflow.html", context, status=400)


@operator_action
def workflow_trigger(request, name):
    wf = get_object_or_404(access.visible(request.user, Workflow.objects.select_related("current_version")), name=name)
    access.require_operate(request.user, wf)
    values = submitted_params(wf.spec.get("params", {}), request.POST)
    date_text = request.POST.get("logical_date", "")
    try:
        logical_date = logical_date_of(date_text)
        run, _created = trigger_workflow(wf, values, trigger=Trigger.MANUAL, created_by=request.user,
                                         logical_date=logical_date)
    except ParamError as exc:
        return _refused(request, wf, values, date_text, errors=exc.errors)
    except RunError as exc:
        if getattr(exc, "field", None) == "logical_date":
            return _refused(request, wf, values, date_text, date_error=str(exc))
        return _refused(request, wf, values, date_text, form_error=str(exc))
    except ValueError as exc:
        return _refused(request, wf, values, date_text, date_error=str(exc))
    # The params as the run holds them (typed and with defaults), not the form's strings.
    audit.record("trigger", request=request, target=run, workflow=wf.name, params=run.params,
                 logical_date=run.logical_date.isoformat())
    messages.success(request, f"Triggered run #{run.pk} of {wf.name}.")
    return HttpResponseRedirect(reverse("orchestrator:web:run", args=[run.pk]))


@operator_action
def workflow_pause(request, name):
    wf = get_object_or_404(access.visible(request.user, Workflow.objects.all()), name=name)
    access.require_operate(request.user, wf)
    control.pause_workflow(wf)
    audit.record("pause", request=request, target=wf)
    messages.success(request, f"Paused {wf.name}: its schedules fire no new runs until resumed.")
    return back(request, reverse("orchestrator:web:workflow", args=[wf.name]))


@operator_action
def workflow_resume(request, name):
    wf = get_object_or_404(access.visible(request.user, Workflow.objects.all()), name=name)
    access.require_operate(request.user, wf)
    control.resume_workflow(wf)
    audit.record("resume", request=request, target=wf)
    messages.success(request, f"Resumed {wf.name}.")
    return back(request, reverse("orchestrator:web:workflow", args=[wf.name]))


@operator_action
def workflow_backfill(request, name):
    """The workflow page's backfill dialog (operators): the dates (UTC), schedule, reprocessing
    and params → a dry run (how many runs, the first fire times) → start, only with the digest
    of the values previewed (values edited since preview again); recorded in the audit log.
    htmx swaps the dialog in place; without script the same dialog is a page of its own."""
    wf = get_object_or_404(access.visible(request.user, Workflow.objects.select_related("current_version")), name=name)
    access.require_operate(request.user, wf)
    form = BackfillForm(request.POST, workflow=wf)
    preview = None
    status = 200
    if form.is_valid():
        started, preview = backfill_step(request, wf, form)
        if started is not None:
            messages.success(request, f"Started a backfill of {wf.name}: {started.total} run(s).")
            runs = reverse("orchestrator:web:runs") + "?" + urlencode({"workflow": wf.name,
                                                                       "trigger": Trigger.BACKFILL})
            return back(request, runs)
    if form.errors:
        status = 400
    return page(request, "orchestrator/web/backfill.html", {"wf": wf, "backfill_form": form, "preview": preview},
                status=status, partial="dialog")
