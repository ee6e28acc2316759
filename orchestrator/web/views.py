"""The operator's pages: dashboard, workflows, runs, task runs with their logs, and the
dead-letter queue.

Every page is server-rendered; htmx requests for the live parts get a partial of the same
template (``"orchestrator/web/run.html#live"``). Viewers read everything; operators also trigger, cancel,
retry, discard and pause (``access``). Lists of runs never use OFFSET: they page by id
(keyset), so the millionth run costs what the first one does.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, time, timedelta
from functools import wraps

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Count, Prefetch, Q
from django.http import FileResponse, Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_POST

from orchestrator import access, audit, clock, cron
from orchestrator.conf import app_settings
from orchestrator.limits import MAX_ID, MAX_LOG_OFFSET
from orchestrator.models import (
    ACTIVE_RUN_STATES,
    Attempt,
    AttemptOutcome,
    Lease,
    Run,
    RunState,
    TaskRun,
    TaskState,
    Trigger,
    UserPreference,
    Worker,
    Workflow,
)
from orchestrator.params import ParamError
from orchestrator.runs import RunError
from orchestrator.web import mapped, svg, zones
from orchestrator.web.errors import InvalidInput, bad_request, query_int
from orchestrator.web.forms import (
    JOBS,
    BulkTaskRunForm,
    DeadLetterFilterForm,
    RunFilterForm,
    param_fields,
    submitted_params,
)

log = logging.getLogger(__name__)

PAGE_SIZE = 50
GRID_RUNS = 25
GRID_SIZES = (25, 50, 100, 200)
GRID_BAR = 24  # px: the height of a grid cell, its bar the task run's share of the longest one
CHART_RUNS = 40
NOT_RUN_SHOWN = 10
LOG_PAGE = 64 * 1024
POLL = "2s"


# ---------------------------------------------------------------- access


def viewer_required(view):
    """Anonymous users go to the login page; a logged-in user who is not a viewer gets 403, and
    so does any write (POST) by a user who is not an operator, before the view runs."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), login_url=app_settings.LOGIN_URL)
        if not access.is_viewer(request.user):
            raise PermissionDenied("You need to be in the Viewers or Operators group to see these pages.")
        if request.method not in ("GET", "HEAD", "OPTIONS") and not access.is_operator(request.user):
            raise PermissionDenied("Only operators can change anything here.")
        return view(request, *args, **kwargs)

    return wrapper


def operator_action(view):
    return viewer_required(require_POST(view))


def is_htmx(request) -> bool:
    # The header itself rather than django-htmx's middleware, which a project may leave out.
    return request.headers.get("HX-Request") == "true"


def page(request, template: str, context: dict, status: int = 200, partial: str | None = None):
    """Render a page, or only its partial when htmx asks for it."""
    context.setdefault("can_operate", access.is_operator(request.user))
    context.setdefault("now", clock.now())
    context.setdefault("clock", zones.for_request(request))
    if partial and is_htmx(request):
        template = f"{template}#{partial}"
    return render(request, template, context, status=status)


def safe_next(request, default: str) -> str:
    target = request.POST.get("next") or request.GET.get("next") or default
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        return default
    return target


def back(request, default: str) -> HttpResponse:
    """Redirect to ``next`` when it is a local URL; htmx gets an HX-Redirect instead."""
    target = safe_next(request, default)
    if is_htmx(request):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = target
        return response
    return HttpResponseRedirect(target)


def _dur(start: datetime | None, end: datetime | None, now: datetime) -> float | None:
    if start is None:
        return None
    return max(0.0, ((end or now) - start).total_seconds())


def _day_bounds(since, until, zone=UTC):
    """The instants from the start of day ``since`` to the end of day ``until`` in ``zone`` (the
    user's clock: the date filters take dates in the zone the pages show)."""
    lo = datetime.combine(since, time.min, tzinfo=zone) if since else None
    # Up to the last day of the calendar means no upper bound (the day after it does not exist).
    hi = datetime.combine(until + timedelta(days=1), time.min, tzinfo=zone) if until and until < date.max else None
    return lo, hi


# ---------------------------------------------------------------- the clock switch


@require_POST
def clock_choice(request):
    """The header's switch: times in local time or UTC, remembered for this user on every page.
    Any viewer may choose (it changes nothing but how they read the pages)."""
    if not request.user.is_authenticated:
        return redirect_to_login(reverse("orchestrator:web:dashboard"), login_url=app_settings.LOGIN_URL)
    if not access.is_viewer(request.user):
        raise PermissionDenied("You need to be in the Viewers or Operators group to see these pages.")
    choice = request.POST.get("clock", "")
    if choice not in UserPreference.Clock.values:
        return bad_request(request, "clock", f'clock must be "local" or "utc", got {choice[:40]!r}')
    zones.choose(request, choice)
    return back(request, reverse("orchestrator:web:dashboard"))


# ---------------------------------------------------------------- dashboard


@viewer_required
def dashboard(request):
    now = clock.now()
    day_ago, hour_ago = now - timedelta(hours=24), now - timedelta(hours=1)
    states = dict.fromkeys(RunState.values, 0)
    # Finished runs through the finished_at index, active ones through the state index:
    # neither scans the whole history.
    for row in Run.objects.filter(finished_at__gte=day_ago).values("state").annotate(n=Count("id")):
        states[row["state"]] += row["n"]
    for row in Run.objects.filter(state__in=ACTIVE_RUN_STATES).values("state").annotate(n=Count("id")):
        states[row["state"]] += row["n"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY schedule_delay),"
            " percentile_cont(0.95) WITHIN GROUP (ORDER BY schedule_delay), count(*)"
            " FROM orchestrator_run WHERE started_at >= %s AND started_at <= %s AND schedule_delay IS NOT NULL"
            # A backfill's runs start long after their logical dates by design: their delay says
            # nothing about the scheduler (/metrics leaves them out too).
            " AND trigger <> %s",
            [hour_ago, now, Trigger.BACKFILL.value],
        )
        p50, p95, delayed = cursor.fetchone()
    queues: dict[str, dict[str, int]] = {}
    busy = TaskRun.objects.filter(state__in=[TaskState.QUEUED, TaskState.RUNNING])
    for row in busy.values("queue", "state").annotate(n=Count("id")):
        queues.setdefault(row["queue"], {"queued": 0, "running": 0, "due": 0})[row["state"]] = row["n"]
    due = TaskRun.objects.filter(state=TaskState.SCHEDULED, due_at__lte=now)
    for row in due.values("queue").annotate(n=Count("id")):
        queues.setdefault(row["queue"], {"queued": 0, "running": 0, "due": 0})["due"] = row["n"]
    timeout = app_settings.HEARTBEAT_TIMEOUT_SECONDS
    workers = list(Worker.objects.filter(state__in=[Worker.State.RUNNING, Worker.State.DRAINING])
                   .order_by("-heartbeat_at")[:50])
    for worker in workers:
        worker.silent_for = (now - worker.heartbeat_at).total_seconds()
        worker.stale = worker.silent_for > timeout
    leases = list(Lease.objects.order_by("name"))
    for lease in leases:
        lease.expired = lease.expires_at < now
    context = {
        "states": [(state, states[state]) for state in RunState.values],
        "runs_24h": sum(states.values()),
        "failed_24h": states[RunState.FAILED],
        "delay": {"p50": p50, "p95": p95, "count": delayed},
        "queues": sorted(queues.items()),
        "workers": workers,
        "leases": leases,
        "dead": TaskRun.objects.filter(state=TaskState.DEAD).count(),
        "recent_failures": Run.objects.filter(state=RunState.FAILED).select_related("workflow")
        .order_by("-id")[:8],
        "recent": Run.objects.select_related("workflow").order_by("-id")[:10],
        # Runs that missed their deadline in the last day (the deadline_missed_at index).
        "deadline_misses": Run.objects.filter(deadline_missed_at__gte=day_ago).select_related("workflow")
        .order_by("-deadline_missed_at")[:8],
        "deadline_missed_24h": Run.objects.filter(deadline_missed_at__gte=day_ago).count(),
        "poll": "10s",
    }
    return page(request, "orchestrator/web/dashboard.html", context, partial="stats")


# ---------------------------------------------------------------- workflows


def last_run_states(workflow_ids: list[int], per_workflow: int = 14) -> dict[int, list[tuple[int, str]]]:
    """The newest runs of each workflow in one query: a LATERAL join that walks the
    (workflow, -id) index of each workflow for a few rows instead of ranking the whole table."""
    strips: dict[int, list[tuple[int, str]]] = {wid: [] for wid in workflow_ids}
    if not workflow_ids:
        return strips
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT w.id, r.id, r.state FROM unnest(%s::bigint[]) AS w(id) CROSS JOIN LATERAL ("
            " SELECT id, state FROM orchestrator_run WHERE workflow_id = w.id ORDER BY id DESC LIMIT %s) r",
            [workflow_ids, per_workflow],
        )
        for workflow_id, run_id, state in cursor.fetchall():
            strips[workflow_id].append((run_id, state))
    for runs in strips.values():
        runs.reverse()  # oldest left, newest right
    return strips


def _describe(expr: str) -> str:
    try:
        return cron.describe(expr)
    except cron.CronError as exc:
        return f"invalid: {exc}"


@viewer_required
def workflow_list(request):
    workflows = list(Workflow.objects.select_related("current_version").prefetch_related("schedules")
                     .order_by("-present", "name"))
    strips = last_run_states([wf.pk for wf in workflows])
    now = clock.now()
    for wf in workflows:
        wf.strip = strips[wf.pk]
        wf.schedule_list = [(s, _describe(s.cron)) for s in wf.schedules.all()]
        wf.task_count = len(wf.spec.get("tasks", {}))
        # The scheduler's own next_fire_at first (it knows catch-up and jitter), then what cron says.
        upcoming = {s.next_fire_at for s in wf.schedules.all() if s.next_fire_at and not s.paused}
        for schedule in wf.schedules.all():
            if not schedule.paused:
                try:
                    upcoming.update(at for at, _local in cron.preview(schedule.cron, schedule.timezone, now, count=3))
                except cron.CronError:
                    pass
        wf.next_fires = sorted(upcoming)[:3]
    return page(request, "orchestrator/web/workflows.html", {"workflows": workflows})


def _upstream_of(spec: dict) -> dict[str, list[str]]:
    return {name: list(task.get("upstream", [])) for name, task in spec.get("tasks", {}).items()}


def _grid(request, wf: Workflow, upstream: dict[str, list[str]], now: datetime) -> dict:
    """The grid: the workflow's runs as columns by logical date (newest right; ``?runs=`` shows
    more of them, ``?before=<run id>`` the ones before that run), a row per task, and in each
    cell a bar as tall as the task run took (against the longest one shown)."""
    size = query_int(request, "runs", GRID_RUNS, 1, GRID_SIZES[-1])
    before = query_int(request, "before", None, 1, MAX_ID)
    runs = Run.objects.filter(workflow=wf)
    pivot = Run.objects.filter(workflow=wf, pk=before).values_list("logical_date", "id").first() if before else None
    if pivot:
        runs = runs.filter(Q(logical_date__lt=pivot[0]) | Q(logical_date=pivot[0], pk__lt=pivot[1]))
    # The (workflow, logical_date, id) index: a page costs the same however long the history.
    runs = list(runs.order_by("-logical_date", "-id")[: size + 1])
    has_older = len(runs) > size
    runs = runs[:size]
    runs.reverse()
    cells = {
        (tr.run_id, tr.task): tr
        for tr in TaskRun.objects.filter(run_id__in=[r.pk for r in runs], map_index=-1)
        .only("id", "run_id", "task", "state", "attempts", "started_at", "finished_at")
    }
    for key, summary in mapped.summaries([r.pk for r in runs if r.dynamic]).items():
        if key in cells:
            cells[key].mapped = summary
    for tr in cells.values():
        tr.seconds = _dur(tr.started_at, tr.finished_at, now)
    longest = max((tr.seconds for tr in cells.values() if tr.seconds), default=0.0)
    for tr in cells.values():
        # Never started (waiting, upstream failed, ...): a low block; else at least 3 px.
        height = GRID_BAR // 4 if tr.seconds is None else max(3, round(GRID_BAR * tr.seconds / longest)) if longest else 3
        tr.bar_y, tr.bar_h = GRID_BAR - height, height
    order = svg.task_order(upstream)
    extra = sorted({task for (_run, task) in cells} - set(order))
    query = {"runs": size} if size != GRID_RUNS else {}
    return {
        "runs": runs,
        "grid_rows": [(task, [(run, cells.get((run.pk, task))) for run in runs]) for task in order + extra],
        "grid_bar": GRID_BAR,
        "grid_size": size,
        "grid_sizes": GRID_SIZES,
        "grid_paged": bool(pivot),
        "grid_query": urlencode({**query, **({"before": before} if pivot else {})}),
        "grid_older": urlencode({**query, "before": runs[0].pk}) if has_older and runs else None,
        "grid_newest": urlencode(query),
    }


def _workflow_context(request, wf: Workflow, *, submitted=None, errors=None, form_error="") -> dict:
    now = clock.now()
    upstream = _upstream_of(wf.spec)
    grid = _grid(request, wf, upstream, now)
    runs = grid["runs"]

    selected = None
    wanted = query_int(request, "run", None, 1, MAX_ID)
    if wanted:
        selected = Run.objects.filter(workflow=wf, pk=wanted).select_related("version").first()
    if selected is None and runs:
        selected = runs[-1]
    graph_upstream = upstream
    states, links, notes = {}, {}, {}
    if selected is not None:
        if selected.version_id and selected.version_id != wf.current_version_id:
            graph_upstream = _upstream_of(selected.version.spec)
        for tr in TaskRun.objects.filter(run=selected, map_index=-1).only("id", "task", "state"):
            states[tr.task] = tr.state
            links[tr.task] = reverse("orchestrator:web:task_run", args=[tr.pk])
        notes = {task: (summary.short, summary.words)
                 for (_run, task), summary in mapped.summaries([selected.pk] if selected.dynamic else []).items()}

    finished = list(Run.objects.filter(workflow=wf, finished_at__isnull=False)
                    .exclude(state__in=[RunState.SKIPPED, RunState.MISSED])
                    .order_by("-id").only("id", "state", "started_at", "created_at", "finished_at")[:CHART_RUNS])
    finished.reverse()
    bars = [svg.Bar(r.pk, r.state, _dur(r.started_at or r.created_at, r.finished_at, now) or 0.0,
                    reverse("orchestrator:web:run", args=[r.pk])) for r in finished]
    succeeded = sum(1 for r in finished if r.state == RunState.SUCCEEDED)

    # Fire times of the last day that did not run (catchup, overlap, deadline, bad params): each is
    # a skipped or missed run with its reason; a long gap is one summary row.
    not_run = Run.objects.filter(workflow=wf, trigger=Trigger.SCHEDULE, state__in=[RunState.SKIPPED, RunState.MISSED],
                                 finished_at__gte=now - timedelta(hours=24))

    schedules = []
    for schedule in wf.schedules.all():
        try:
            # The local wall-clock time in the schedule's own zone, next to the viewer's time.
            upcoming = [(at, local.strftime("%a %H:%M %Z"))
                        for at, local in cron.preview(schedule.cron, schedule.timezone, now, count=5)]
        except cron.CronError as exc:
            upcoming, schedule.error = [], str(exc)
        schedules.append((schedule, _describe(schedule.cron), upcoming))

    from orchestrator.web import lineage

    return {
        "wf": wf,
        "data": lineage.of_workflow(wf),
        "spec": wf.spec,
        **grid,
        "selected": selected,
        "graph": svg.graph(graph_upstream, states, links, notes),
        "chart": svg.history_chart(bars),
        "success_rate": (100.0 * succeeded / len(finished)) if finished else None,
        "finished_count": len(finished),
        "schedules": schedules,
        "not_run": list(not_run.order_by("-logical_date").only("id", "state", "logical_date", "reason")[:NOT_RUN_SHOWN]),
        "not_run_count": not_run.count(),
        "fields": param_fields(wf.spec, submitted, errors),
        "unknown_errors": {k: v for k, v in (errors or {}).items() if k not in wf.spec.get("params", {})},
        "form_error": form_error,
        "poll": "3s" if any(run.is_active for run in runs) else None,
        # The live part polls the workflow's GET view, also when this page answers a POST (a
        # trigger with bad params) whose own URL takes no GET.
        "live_url": reverse("orchestrator:web:workflow", args=[wf.name])
        + (f"?{request.GET.urlencode()}" if request.GET else ""),
    }


def _grid_panel(request, wf: Workflow) -> TaskRun | None:
    """The task run picked in the grid (``?run=<id>&task=<name>``), with the actions that apply."""
    run_id = query_int(request, "run", None, 1, MAX_ID)
    task = request.GET.get("task")
    if not run_id or not task:
        return None
    tr = (TaskRun.objects.select_related("run").filter(run__workflow=wf, run_id=run_id, task=task, map_index=-1)
          .first())
    if tr is not None:
        tr.seconds = _dur(tr.started_at, tr.finished_at, clock.now())
        tr.actions = task_actions(tr)
    return tr


@viewer_required
def workflow_detail(request, name):
    wf = get_object_or_404(Workflow.objects.select_related("current_version"), name=name)
    if is_htmx(request) and request.GET.get("panel"):
        # A grid cell was picked: only the panel under the grid.
        return page(request, "orchestrator/web/workflow.html#task_panel", {"wf": wf, "panel": _grid_panel(request, wf)})
    context = _workflow_context(request, wf)
    context["panel"] = _grid_panel(request, wf)
    return page(request, "orchestrator/web/workflow.html", context, partial="live")


@operator_action
def workflow_trigger(request, name):
    from orchestrator.runs import trigger_workflow

    wf = get_object_or_404(Workflow.objects.select_related("current_version"), name=name)
    declared = wf.spec.get("params", {})
    values = submitted_params(declared, request.POST)
    try:
        run, _created = trigger_workflow(wf, values, trigger="manual", created_by=request.user)
    except ParamError as exc:
        context = _workflow_context(request, wf, submitted=values, errors=exc.errors)
        return page(request, "orchestrator/web/workflow.html", context, status=400)
    except RunError as exc:
        context = _workflow_context(request, wf, submitted=values, form_error=str(exc))
        return page(request, "orchestrator/web/workflow.html", context, status=400)
    audit.record("trigger", request=request, target=run, workflow=wf.name, params=values)
    messages.success(request, f"Triggered run #{run.pk} of {wf.name}.")
    return HttpResponseRedirect(reverse("orchestrator:web:run", args=[run.pk]))


@operator_action
def workflow_pause(request, name):
    from orchestrator import control

    wf = get_object_or_404(Workflow, name=name)
    control.pause_workflow(wf)
    audit.record("pause", request=request, target=wf)
    messages.success(request, f"Paused {wf.name}: its schedules fire no new runs until resumed.")
    return back(request, reverse("orchestrator:web:workflow", args=[wf.name]))


@operator_action
def workflow_resume(request, name):
    from orchestrator import control

    wf = get_object_or_404(Workflow, name=name)
    control.resume_workflow(wf)
    audit.record("resume", request=request, target=wf)
    messages.success(request, f"Resumed {wf.name}.")
    return back(request, reverse("orchestrator:web:workflow", args=[wf.name]))


# ---------------------------------------------------------------- runs


def filter_runs(data: dict, zone=UTC):
    """The runs matching the list's filters, newest first, without pagination; dates are days in
    ``zone``."""
    runs = Run.objects.all()
    if data.get("workflow") == JOBS:
        runs = runs.filter(workflow__isnull=True)
    elif data.get("workflow"):
        # By id, not by a join on the name: the planner then sees one workflow_id and can walk
        # the (workflow, -id) index instead of joining a million rows.
        workflow_id = Workflow.objects.filter(name=data["workflow"]).values_list("id", flat=True).first()
        runs = runs.filter(workflow_id=workflow_id) if workflow_id else runs.none()
    if data.get("state"):
        runs = runs.filter(state=data["state"])
    if data.get("trigger"):
        runs = runs.filter(trigger=data["trigger"])
    lo, hi = _day_bounds(data.get("since"), data.get("until"), zone)
    if lo:
        runs = runs.filter(logical_date__gte=lo)
    if hi:
        runs = runs.filter(logical_date__lt=hi)
    return runs


def keyset_page(queryset, before: int | None, after: int | None, size: int = PAGE_SIZE):
    """One page of ``queryset`` by id, newest first, and whether older/newer rows exist.
    ``before``: rows older than that id; ``after``: rows newer than it (fetched ascending, then
    flipped). One extra row tells whether there is a next page; no COUNT, no OFFSET."""
    if after:
        rows = list(queryset.filter(pk__gt=after).order_by("id")[: size + 1])
        has_newer = len(rows) > size
        rows = rows[:size][::-1]
        has_older = bool(rows) and queryset.filter(pk__lt=rows[-1].pk).exists()
        return rows, has_older, has_newer
    if before:
        queryset = queryset.filter(pk__lt=before)
    rows = list(queryset.order_by("-id")[: size + 1])
    has_older = len(rows) > size
    rows = rows[:size]
    has_newer = bool(before) and bool(rows)
    return rows, has_older, has_newer


@viewer_required
def run_list(request):
    form = RunFilterForm(request.GET or None)
    data = form.cleaned_data if form.is_valid() else {}
    if form.is_bound and not form.is_valid():
        # Drop only the bad filters; the rest still apply.
        data = {key: value for key, value in form.cleaned_data.items() if key not in form.errors}
    rows, has_older, has_newer = keyset_page(
        filter_runs(data, zones.for_request(request).zone).select_related("workflow", "created_by"),
        data.get("before"), data.get("after")
    )
    now = clock.now()
    for run in rows:
        run.seconds = _dur(run.started_at, run.finished_at, now)
    params = request.GET.copy()
    for key in ("before", "after"):
        params.pop(key, None)
    base = params.urlencode()
    return page(request, "orchestrator/web/runs.html", {
        "form": form, "runs": rows, "has_older": has_older, "has_newer": has_newer,
        "older_qs": f"{base}&before={rows[-1].pk}".lstrip("&") if rows and has_older else "",
        "newer_qs": f"{base}&after={rows[0].pk}".lstrip("&") if rows and has_newer else "",
        "first_qs": base,
    })


def _run_context(run: Run) -> dict:
    now = clock.now()
    attempts = Prefetch("attempt_set", queryset=Attempt.objects.order_by("number"))
    # A mapped task is its own row here; its instances are counted (mapped.summaries), not loaded.
    task_runs = list(run.task_runs.filter(map_index=-1).prefetch_related(attempts))
    instance_summaries = {task: summary for (_run, task), summary in mapped.summaries([run.pk]).items()}
    spec = run.version.spec if run.version_id else {"tasks": {tr.task: {"upstream": tr.upstream} for tr in task_runs}}
    upstream = _upstream_of(spec)
    for tr in task_runs:
        upstream.setdefault(tr.task, list(tr.upstream))
    order = {name: index for index, name in enumerate(svg.task_order(upstream))}
    task_runs.sort(key=lambda tr: (order.get(tr.task, len(order)), tr.task))

    starts = [a.started_at for tr in task_runs for a in tr.attempt_set.all()]
    ends = [a.finished_at or now for tr in task_runs for a in tr.attempt_set.all()]
    starts += [s.first_start for s in instance_summaries.values() if s.first_start]
    ends += [s.last_end or now for s in instance_summaries.values() if s.first_start]
    span_start = min(starts) if starts else None
    span = max(((max(ends) - span_start).total_seconds() if starts else 0.0), 0.001)
    for tr in task_runs:
        tr.seconds = _dur(tr.started_at, tr.finished_at, now)
        tr.bars = []
        for attempt in tr.attempt_set.all():
            offset = (attempt.started_at - span_start).total_seconds()
            length = _dur(attempt.started_at, attempt.finished_at, now) or 0.0
            tr.bars.append({
                "attempt": attempt,
                "left": round(100 * offset / span, 3),
                "width": round(max(100 * length / span, 0.4), 3),
                "seconds": length,
            })
    _add_instances(task_runs, instance_summaries, run.pk, span_start, span, now)
    states = {tr.task: tr.state for tr in task_runs}
    links = {tr.task: reverse("orchestrator:web:task_run", args=[tr.pk]) for tr in task_runs}
    counts: dict[str, int] = {}
    for tr in task_runs:
        counts[tr.state] = counts.get(tr.state, 0) + 1
    return {
        "run": run,
        "task_runs": task_runs,
        "counts": sorted(counts.items()),
        "graph": svg.graph(upstream, states, links,
                           {task: (summary.short, summary.words) for task, summary in instance_summaries.items()}),
        "span_start": span_start,
        "span": span if starts else None,
        "seconds": _dur(run.started_at or (span_start if starts else None), run.finished_at, now),
        "retryable": any(tr.state in (TaskState.DEAD, TaskState.FAILED, TaskState.UPSTREAM_FAILED)
                         for tr in task_runs),
        "poll": POLL if run.is_active else None,
    }


def _add_instances(task_runs, summaries: dict, run_id: int, span_start, span: float, now) -> None:
    """Mapped tasks on the run page: their counts, the first instances under their row, and one
    timeline bar from the first instance's start to the last one's end."""
    shown = mapped.first_instances(run_id, sorted(summaries))
    for tr in task_runs:
        tr.mapped = summaries.get(tr.task)
        if tr.mapped is None:
            continue
        tr.instances = shown.get(tr.task, [])
        for instance in tr.instances:
            instance.seconds = _dur(instance.started_at, instance.finished_at, now)
        if tr.mapped.first_start and span_start:
            tr.seconds = _dur(tr.mapped.first_start, tr.mapped.last_end if tr.state != TaskState.MAPPED else None, now)
            offset = (tr.mapped.first_start - span_start).total_seconds()
            tr.span_bar = {"left": round(100 * offset / span, 3),
                           "width": round(max(100 * (tr.seconds or 0.0) / span, 0.4), 3), "seconds": tr.seconds}


@viewer_required
def mapped_instances(request, task_run_id):
    return page(request, "orchestrator/web/mapped_instances.html", mapped.instances_context(request, task_run_id),
                partial="rows")


@viewer_required
def run_detail(request, run_id):
    run = get_object_or_404(Run.objects.select_related("workflow", "version", "created_by", "schedule"), pk=run_id)
    return page(request, "orchestrator/web/run.html", _run_context(run), partial="live")


@operator_action
def run_cancel(request, run_id):
    from orchestrator import control

    run = get_object_or_404(Run, pk=run_id)
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
    from orchestrator import control

    run = get_object_or_404(Run, pk=run_id)
    count = control.retry_run(run)
    audit.record("retry", request=request, target=run, changed=count)
    if count:
        messages.success(request, f"Retrying {count} task run{'s' if count != 1 else ''} of run #{run.pk}.")
    else:
        messages.warning(request, f"Run #{run.pk} has no dead, failed or upstream-failed task to retry.")
    return back(request, reverse("orchestrator:web:run", args=[run.pk]))


# ---------------------------------------------------------------- task runs and logs


def _read_log(attempt: Attempt, offset: int) -> dict:
    from orchestrator import logs

    try:
        text, next_offset, eof = logs.read(attempt, offset, LOG_PAGE)
    except FileNotFoundError:
        text, next_offset, eof = "", offset, True
    # A running attempt's log never reports eof: a short page means "caught up with the writer",
    # so the page follows the tail; a full page means there is more to load right now.
    running = attempt.outcome == AttemptOutcome.RUNNING
    caught_up = next_offset - offset < LOG_PAGE - 3
    follow = POLL if running and caught_up else None
    return {
        "attempt": attempt, "text": text, "offset": offset, "next_offset": next_offset, "eof": eof,
        "follow": follow, "more": not eof and not follow,
    }


@viewer_required
def task_run_detail(request, task_run_id):
    tr = get_object_or_404(TaskRun.objects.select_related("run__workflow", "worker"), pk=task_run_id)
    attempts = list(tr.attempt_set.select_related("worker").order_by("number"))
    selected = attempts[-1] if attempts else None
    wanted = query_int(request, "attempt", None, 1, MAX_ID)
    if wanted:
        selected = next((a for a in attempts if a.number == wanted), selected)
    offset = query_int(request, "offset", 0, 0, MAX_LOG_OFFSET)
    now = clock.now()
    for attempt in attempts:
        attempt.seconds = _dur(attempt.started_at, attempt.finished_at, now)
    context = {
        "tr": tr, "run": tr.run, "attempts": attempts, "selected": selected,
        "log": _read_log(selected, offset) if selected else None,
        "poll": POLL if tr.state in (TaskState.WAITING, TaskState.SCHEDULED, TaskState.QUEUED, TaskState.RUNNING)
        else None,
        "seconds": _dur(tr.started_at, tr.finished_at, now),
        "actions": task_actions(tr),
    }
    return page(request, "orchestrator/web/task_run.html", context, partial="live")


# The task-level actions: what each one does, and the question the button asks first.
TASK_ACTIONS = {
    "retry": "Retry {task} of run #{run}? It gets a fresh set of attempts.",
    "clear": "Clear {task} of run #{run} and every task downstream of it? They run again; earlier attempts "
             "stay in the history.",
    "mark-succeeded": "Mark {task} of run #{run} succeeded? Its downstream tasks follow their trigger rules.",
    "mark-failed": "Mark {task} of run #{run} failed? Its downstream tasks follow their trigger rules.",
}


def task_actions(tr: TaskRun) -> list[tuple[str, str, str]]:
    """The actions that apply to a task run in its state: (action, button label, question)."""
    from orchestrator.states import FINISHED_TASK_STATES, MARKABLE_TASK_STATES, RETRYABLE_TASK_STATES

    mapped_row = tr.map_index == -1 and "map_over" in (tr.spec or {})
    labels = []
    if tr.state in RETRYABLE_TASK_STATES and not mapped_row:
        labels.append(("retry", "Retry"))
    if tr.state in FINISHED_TASK_STATES:
        labels.append(("clear", "Clear with downstream"))
    if tr.state in MARKABLE_TASK_STATES and not mapped_row:
        if tr.state != TaskState.SUCCEEDED:
            labels.append(("mark-succeeded", "Mark succeeded"))
        if tr.state != TaskState.FAILED:
            labels.append(("mark-failed", "Mark failed"))
    return [(action, label, TASK_ACTIONS[action].format(task=tr.task, run=tr.run_id)) for action, label in labels]


@operator_action
def task_run_action(request, task_run_id, action):
    """Retry, clear (with everything downstream) or mark one task run; the button asks first
    (hx-confirm) and the action is written to the audit log."""
    from orchestrator import control

    if action not in TASK_ACTIONS:
        raise InvalidInput("action", f"no task-run action {action!r}: use one of {', '.join(TASK_ACTIONS)}")
    tr = get_object_or_404(TaskRun, pk=task_run_id)
    if action == "retry":
        changed = [tr.pk] if control.retry_task_runs([tr.pk]) else []
        done = f"Retrying {tr.task}."
    elif action == "clear":
        changed = control.clear_task_runs([tr.pk])
        below = len(changed) - 1
        done = f"Cleared {tr.task}{f' and {below} downstream' if below > 0 else ''}: {'they run' if below > 0 else 'it runs'} again."
    else:
        changed = control.mark_task_runs([tr.pk], action.removeprefix("mark-"), by=request.user)
        done = f"Marked {tr.task} {action.removeprefix('mark-')}."
    audit.record(action.split("-")[0], request=request, target=tr, changed=changed,
                 **({"state": action.removeprefix("mark-")} if action.startswith("mark-") else {}))
    if changed:
        messages.success(request, done)
    else:
        tr.refresh_from_db()
        messages.warning(request, f"{tr.task} is {tr.state.replace('_', ' ')}: nothing to {action.replace('-', ' ')}.")
    return back(request, reverse("orchestrator:web:task_run", args=[tr.pk]))


@viewer_required
def attempt_log(request, attempt_id):
    """One page of an attempt's log from ``offset``: the "load more" button and the tail
    follower ask for this fragment and append it."""
    attempt = get_object_or_404(Attempt.objects.select_related("task_run"), pk=attempt_id)
    offset = query_int(request, "offset", 0, 0, MAX_LOG_OFFSET)
    return page(request, "orchestrator/web/task_run.html#log_chunk", {"log": _read_log(attempt, offset)})


@viewer_required
def attempt_log_download(request, attempt_id):
    from orchestrator import logs

    attempt = get_object_or_404(Attempt.objects.select_related("task_run"), pk=attempt_id)
    try:
        handle = logs.open_for_download(attempt)
    except FileNotFoundError:
        raise Http404("This attempt has no log.") from None
    filename = f"run{attempt.task_run.run_id}-{attempt.task_run.task}-attempt{attempt.number}.log"
    return FileResponse(handle, as_attachment=True, filename=filename, content_type="text/plain; charset=utf-8")


# ---------------------------------------------------------------- dead-letter queue


def dead_task_runs(data: dict, zone=UTC):
    rows = TaskRun.objects.filter(state=TaskState.DEAD)
    if data.get("workflow") == JOBS:
        rows = rows.filter(run__workflow__isnull=True)
    elif data.get("workflow"):
        rows = rows.filter(run__workflow__name=data["workflow"])
    if data.get("queue"):
        rows = rows.filter(queue=data["queue"])
    if data.get("error"):
        rows = rows.filter(error__icontains=data["error"])
    lo, hi = _day_bounds(data.get("since"), data.get("until"), zone)
    if lo:
        rows = rows.filter(finished_at__gte=lo)
    if hi:
        rows = rows.filter(finished_at__lt=hi)
    return rows


@viewer_required
def dead_letter(request):
    if request.method == "POST":
        return _dead_letter_action(request)
    form = DeadLetterFilterForm(request.GET or None)
    data = {}
    if form.is_bound:
        form.is_valid()
        data = {key: value for key, value in form.cleaned_data.items() if key not in form.errors}
    rows, has_older, _has_newer = keyset_page(
        dead_task_runs(data, zones.for_request(request).zone).select_related("run__workflow"), data.get("before"), None
    )
    params = request.GET.copy()
    params.pop("before", None)
    base = params.urlencode()
    return page(request, "orchestrator/web/dead_letter.html", {
        "form": form, "rows": rows, "has_older": has_older,
        "older_qs": f"{base}&before={rows[-1].pk}".lstrip("&") if rows and has_older else "",
        "first_qs": base, "paged": bool(data.get("before")),
        "queues": TaskRun.objects.filter(state=TaskState.DEAD).values_list("queue", flat=True).distinct()
        .order_by("queue"),
    })


def _dead_letter_action(request):
    """Retry or discard the selected dead task runs: the first POST shows what will change and
    asks for confirmation; only the confirmed POST acts."""
    from orchestrator import control

    form = BulkTaskRunForm(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            for error in errors:
                messages.error(request, error if field in ("ids", "__all__") else f"{field}: {error}")
        return back(request, reverse("orchestrator:web:dead_letter"))
    action, ids = form.cleaned_data["action"], sorted(set(form.cleaned_data["ids"]))
    rows = list(TaskRun.objects.filter(pk__in=ids, state=TaskState.DEAD).select_related("run__workflow"))
    if not rows:
        messages.warning(request, "None of the selected task runs is in the dead-letter queue any more.")
        return back(request, reverse("orchestrator:web:dead_letter"))
    if not form.cleaned_data["confirmed"]:
        return page(request, "orchestrator/web/dead_letter_confirm.html", {
            "action": action, "rows": rows, "next": safe_next(request, reverse("orchestrator:web:dead_letter")),
            "gone": len(ids) - len(rows),
        })
    ids = [tr.pk for tr in rows]
    if action == "retry":
        count = control.retry_task_runs(ids)
        messages.success(request, f"Retrying {count} task run{'s' if count != 1 else ''}.")
    else:
        count = control.discard_task_runs(ids)
        messages.success(request, f"Discarded {count} task run{'s' if count != 1 else ''} (now failed).")
    audit.record_each(action, "taskrun", ids, request=request, changed=count)
    return back(request, reverse("orchestrator:web:dead_letter"))
