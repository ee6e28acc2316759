"""The task-run pages: a task run with its attempts and the log of one (paged, following the tail
while it runs), the actions that apply in its state (retry, clear, mark), the log's download,
and a mapped task's instances."""

from __future__ import annotations

from datetime import datetime

from django.contrib import messages
from django.http import FileResponse, Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.http import urlencode

from orchestrator import access, audit, clock, control, logs, tracing
from orchestrator.conf import app_settings
from orchestrator.limits import MAX_ID, MAX_LOG_OFFSET
from orchestrator.models import Attempt, TaskRun
from orchestrator.states import (
    FINISHED_TASK_STATES,
    MARKABLE_TASK_STATES,
    RETRYABLE_TASK_STATES,
    AttemptOutcome,
    TaskState,
)
from orchestrator.web import actions, mapped
from orchestrator.web.errors import InvalidInput, query_int
from orchestrator.web.kit import POLL, back, is_htmx, operator_action, page, seconds, viewer_required

LOG_PAGE = 64 * 1024
AUDIT_NAMES = 50  # task names an audit record lists (its ids list them all)
LIVE_STATES = (TaskState.WAITING, TaskState.SCHEDULED, TaskState.QUEUED, TaskState.RUNNING, TaskState.SENSING)

# The task-level actions: what each one does, and the question the button asks first.
TASK_ACTIONS = {
    "retry": "Retry {task} of run #{run}? It gets a fresh set of attempts.",
    "clear": "Clear {task} of run #{run} and every task downstream of it? They run again; earlier attempts "
             "stay in the history.",
    "mark-succeeded": "Mark {task} of run #{run} succeeded? Its downstream tasks follow their trigger rules.",
    "mark-failed": "Mark {task} of run #{run} failed? Its downstream tasks follow their trigger rules.",
}


def read_log(attempt: Attempt, offset: int) -> dict:
    """One page of an attempt's log from ``offset``, and whether to load more or follow the tail."""
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


def task_actions(tr: TaskRun) -> list[tuple[str, str, str]]:
    """The actions that apply to a task run in its state: (action, button label, question)."""
    mapped_row = mapped.is_mapped(tr)
    labels = []
    if tr.state in RETRYABLE_TASK_STATES and not mapped_row:
        labels.append(("retry", "Retry"))
    if tr.state in FINISHED_TASK_STATES:
        labels.append(("clear", "Clear with downstream"))
    if tr.state in MARKABLE_TASK_STATES and not mapped_row:
        labels += [(f"mark-{state}", f"Mark {state}") for state in (TaskState.SUCCEEDED.value, TaskState.FAILED.value)
                   if tr.state != state]
    questions = [(action, label, TASK_ACTIONS[action].format(task=tr.task, run=tr.run_id)) for action, label in labels]
    if tr.state == TaskState.RUNNING:
        # Said before the operator confirms: the attempt in progress is stopped.
        questions = [(action, label, question.replace("? ", "? Its running attempt is stopped. ", 1))
                     for action, label, question in questions]
    return questions


def task_run_context(tr: TaskRun, now: datetime, attempt: int | None = None, offset: int = 0) -> dict:
    """A task run's page: its attempts, and the log of attempt number ``attempt`` (the last one
    when absent) from ``offset``."""
    attempts = list(tr.attempt_set.select_related("worker").order_by("number"))
    selected = attempts[-1] if attempts else None
    if attempt:
        selected = next((a for a in attempts if a.number == attempt), selected)
    for each in attempts:
        each.seconds = seconds(each.started_at, each.finished_at, now)
    trace_id = tracing.trace_id_of(tr.spec)
    # A mapped task's own task run never runs: its instances do. Its page counts them by state.
    summary = mapped.task_summary(tr.run_id, tr.task) if mapped.is_mapped(tr) else None
    return {
        "summary": summary,
        "trace_id": trace_id,
        "trace_url": app_settings.TRACE_URL.replace("{trace_id}", trace_id) if trace_id else "",
        "tr": tr, "run": tr.run, "attempts": attempts, "selected": selected,
        "log": read_log(selected, offset) if selected else None,
        "poll": POLL if tr.state in LIVE_STATES else None,
        "seconds": seconds(tr.started_at, tr.finished_at, now),
        "actions": task_actions(tr),
    }


@viewer_required
def task_run_detail(request, task_run_id):
    # The result when shown, which a mapped task's never is: the list of its instances' results.
    tr = get_object_or_404(access.visible(request.user, TaskRun.objects.select_related("run__workflow", "worker")
                                          .defer("result")), pk=task_run_id)
    attempt = query_int(request, "attempt", None, 1, MAX_ID)
    offset = query_int(request, "offset", 0, 0, MAX_LOG_OFFSET)
    context = task_run_context(tr, clock.now(), attempt, offset)
    context["can_operate"] = access.can_operate(request.user, tr)
    context.update(actions.page_extras(tr.run, tr))
    return page(request, "orchestrator/web/task_run.html", context, partial="live")


def act(request, tr: TaskRun, action: str) -> tuple[list[int], str]:
    """Do ``action`` to ``tr``: the ids it changed, and what to tell the user when it did."""
    if action == "retry":
        return ([tr.pk] if control.retry_task_runs([tr.pk]) else []), f"Retrying {tr.task}."
    if action == "clear":
        changed = control.clear_task_runs([tr.pk])
        below = len(changed) - 1
        if below > 0:
            return changed, f"Cleared {tr.task} and {below} downstream: they run again."
        return changed, f"Cleared {tr.task}: it runs again."
    state = action.removeprefix("mark-")
    return control.mark_task_runs([tr.pk], state, by=request.user), f"Marked {tr.task} {state}."


@operator_action
def task_run_action(request, task_run_id, action):
    """Retry, clear (with everything downstream) or mark one task run; the button asks first
    (hx-confirm) and the action is written to the audit log."""
    if action not in TASK_ACTIONS:
        raise InvalidInput("action", f"no task-run action {action!r}: use one of {', '.join(TASK_ACTIONS)}")
    tr = get_object_or_404(access.visible(request.user, TaskRun.objects.select_related("run__workflow")),
                           pk=task_run_id)
    access.require_operate(request.user, tr)
    was = tr.state
    changed, done = act(request, tr, action)
    detail = {"state": action.removeprefix("mark-"), "was": was} if action.startswith("mark-") else {}
    # The record names what it touched, so it reads without looking the ids up.
    names = sorted(TaskRun.objects.filter(pk__in=changed[:AUDIT_NAMES]).values_list("task", flat=True))
    audit.record(action.split("-")[0], request=request, target=tr, changed=changed,
                 workflow=tr.run.workflow.name if tr.run.workflow_id else "", task=tr.task, run=tr.run_id,
                 changed_tasks=names, **detail)
    if changed:
        messages.success(request, done)
    else:
        tr.refresh_from_db()
        messages.warning(request, f"{tr.task} is {tr.state.replace('_', ' ')}: nothing to {action.replace('-', ' ')}.")
    return back(request, reverse("orchestrator:web:task_run", args=[tr.pk]))


@viewer_required
def attempt_log(request, attempt_id):
    """One page of an attempt's log from ``offset``: the "load more" button and the tail
    follower ask for this fragment and append it. A browser that opens the address itself (a
    link copied, a new tab) gets the task run's page at that attempt and offset, where the log
    sits in its box, not a bare fragment as wide as its longest line."""
    attempt = get_object_or_404(access.visible(request.user, Attempt.objects.select_related("task_run")),
                                pk=attempt_id)
    offset = query_int(request, "offset", 0, 0, MAX_LOG_OFFSET)
    if not is_htmx(request):
        query = urlencode({"attempt": attempt.number, **({"offset": offset} if offset else {})})
        return HttpResponseRedirect(f"{reverse('orchestrator:web:task_run', args=[attempt.task_run_id])}?{query}")
    return page(request, "orchestrator/web/task_run.html#log_chunk", {"log": read_log(attempt, offset)})


@viewer_required
def attempt_log_download(request, attempt_id):
    attempt = get_object_or_404(access.visible(request.user, Attempt.objects.select_related("task_run")),
                                pk=attempt_id)
    try:
        handle = logs.open_for_download(attempt)
    except FileNotFoundError:
        raise Http404("This attempt has no log.") from None
    filename = f"run{attempt.task_run.run_id}-{attempt.task_run.task}-attempt{attempt.number}.log"
    return FileResponse(handle, as_attachment=True, filename=filename, content_type="text/plain; charset=utf-8")


@viewer_required
def mapped_instances(request, task_run_id):
    get_object_or_404(access.visible(request.user, TaskRun.objects.values("pk")), pk=task_run_id)
    return page(request, "orchestrator/web/mapped_instances.html", mapped.instances_context(request, task_run_id),
                partial="rows")
