"""Operator actions with options, on the pages: the clear dialog (of a task run, with upstream,
downstream, only failed, past and future runs; of a whole run, all or only failed tasks), marking
a whole run, actions on many runs at once from the runs list, and notes on runs and task runs.

Every clear and bulk action shows its dry run first (exactly which task runs it touches, and how
many) and acts only when the confirm button carries the digest of what was shown: a selection that
changed since (a task ended, a run started) is shown again instead. Every action is recorded in
the audit log with the workflow's and the tasks' names. Viewers see none of these and are refused
each, reading the dialogs included.
"""

from __future__ import annotations

import hashlib
from functools import wraps

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404
from django.urls import reverse

from orchestrator import access, audit, clearing, notes
from orchestrator.models import Run, TaskRun
from orchestrator.states import FINISHED_TASK_STATES, TaskState
from orchestrator.web.errors import InvalidInput
from orchestrator.web.forms import RUN_BULK_ACTIONS, ClearForm, RunBulkForm
from orchestrator.web.kit import back, page, safe_next, viewer_required

MARK_STATES = (TaskState.SUCCEEDED.value, TaskState.FAILED.value)


def operator_only(view):
    """A dialog of operators: viewers are refused reading it too (they see no action). An
    operator of some tenants passes here; each view then checks its object's tenant."""

    @viewer_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not access.operates_anything(request.user):
            raise PermissionDenied("Only operators can change anything here.")
        return view(request, *args, **kwargs)

    return wrapper


def operated(request, queryset, pk: int):
    """The object ``pk`` of ``queryset`` that the user acts on: a 404 when they may not read it,
    a 403 when they may read it but not act on it."""
    obj = get_object_or_404(access.visible(request.user, queryset), pk=pk)
    access.require_operate(request.user, obj)
    return obj


def scope_of(data: dict) -> clearing.ClearScope:
    return clearing.ClearScope(upstream=data.get("upstream", False), downstream=data.get("downstream", False),
                               only_failed=data.get("only_failed", False), past=data.get("past", False),
                               future=data.get("future", False))


def clear_step(request, form: ClearForm, plan_of, done: str, record: dict):
    """The dialog's step for a posted form: the dry run, or the clear when the form confirms the
    digest of the task runs the dry run listed. Returns (response or None, plan, stale)."""
    plan = plan_of(form.cleaned_data)
    if "go" not in request.POST:
        return None, plan, False
    if form.cleaned_data.get("confirm") != plan.digest or not plan.ids:
        return None, plan, True
    try:
        cleared = clearing.clear(plan)
    except clearing.ClearError as exc:
        form.add_error(None, str(exc))
        return None, plan, False
    options = {name: value for name, value in form.cleaned_data.items() if name != "confirm"}
    audit.record("clear", request=request, **record, options=options, **clearing.audit_names(cleared))
    if cleared:
        messages.success(request, f"Cleared {len(cleared)} task run{'s' if len(cleared) != 1 else ''}: they run again.")
    else:
        messages.warning(request, "Nothing was cleared: the task runs had started again meanwhile.")
    return back(request, done), plan, False


def clear_dialog(request, context: dict, plan_of, done: str, record: dict, whole_run: bool = False):
    """The clear dialog of a task run or a run: the options, the dry run, the clear."""
    plan, stale = None, False
    if request.method == "POST":
        form = ClearForm(request.POST, whole_run=whole_run)
        if form.is_valid():
            response, plan, stale = clear_step(request, form, plan_of, done, record)
            if response is not None:
                return response
    else:
        form = ClearForm(whole_run=whole_run)
    context.update({"form": form, "plan": plan, "stale": stale, "most": clearing.MOST})
    return page(request, "orchestrator/web/clear.html", context, status=400 if form.errors else 200,
                partial="dialog")


@operator_only
def task_run_clear(request, task_run_id):
    """The clear dialog of a task run (Airflow's "Clear" with its options)."""
    tr = operated(request, TaskRun.objects.select_related("run__workflow"), task_run_id)
    workflow = tr.run.workflow.name if tr.run.workflow_id else ""
    task = tr.task if tr.map_index < 0 else f"{tr.task}[{tr.map_index}]"

    def plan_of(data):
        return clearing.plan_task_clear(tr, scope_of(data))

    record = {"target": tr, "workflow": workflow, "task": tr.task, "run": tr.run_id}
    context = {"tr": tr, "run": tr.run, "subject": f"{task} of run #{tr.run_id}",
               "action_url": reverse("orchestrator:web:task_run_clear", args=[tr.pk]),
               "back_url": reverse("orchestrator:web:task_run", args=[tr.pk])}
    return clear_dialog(request, context, plan_of, context["back_url"], record)


@operator_only
def run_clear(request, run_id):
    """The clear dialog of a whole run: every task, or only the failed ones."""
    run = operated(request, Run.objects.select_related("workflow"), run_id)

    def plan_of(data):
        return clearing.plan_run_clear([run.pk], only_failed=data.get("only_failed", False))

    record = {"target": run, "workflow": run.workflow.name if run.workflow_id else "", "run": run.pk}
    context = {"run": run, "subject": f"run #{run.pk}", "whole_run": True,
               "action_url": reverse("orchestrator:web:run_clear", args=[run.pk]),
               "back_url": reverse("orchestrator:web:run", args=[run.pk])}
    return clear_dialog(request, context, plan_of, context["back_url"], record, whole_run=True)


@operator_only
def run_mark(request, run_id, state):
    """Mark a whole run succeeded or failed (the button asks first); audited."""
    if request.method != "POST":
        raise InvalidInput("method", "marking a run takes a POST (the run page's button)")
    if state not in MARK_STATES:
        raise InvalidInput("state", f"a run can be marked {' or '.join(MARK_STATES)}, not {state!r}")
    run = operated(request, Run.objects.select_related("workflow"), run_id)
    try:
        result = clearing.mark_runs([run.pk], state, by=request.user)
    except clearing.ClearError as exc:
        messages.error(request, str(exc))
        return back(request, reverse("orchestrator:web:run", args=[run.pk]))
    audit.record("mark", request=request, target=run, workflow=run.workflow.name if run.workflow_id else "",
                 run=run.pk, state=state, **clearing.audit_names(result["task_runs"]))
    run.refresh_from_db()
    messages.success(request, f"Marked run #{run.pk} {state}: {len(result['task_runs'])} task run"
                              f"{'s' if len(result['task_runs']) != 1 else ''} changed; the run is "
                              f"{run.state.replace('_', ' ')}.")
    return back(request, reverse("orchestrator:web:run", args=[run.pk]))


# --- Many runs at once ---------------------------------------------------------------------------


def bulk_preview(action: str, ids: list[int]) -> dict:
    """What a bulk action on runs touches: the task runs (ids), and a digest of action and ids."""
    if action.startswith("clear"):
        plan = clearing.plan_run_clear(ids, only_failed=action == "clear-failed")
        touched, too_many, rows = plan.ids, plan.too_many, plan.rows
    else:
        touched = clearing.markable_of_runs(ids, action.removeprefix("mark-"))
        too_many, rows = len(touched) > clearing.MOST, []
    count = len(touched)
    digest = hashlib.sha256(f"{action}:{ids}:{touched}".encode()).hexdigest()[:24]
    return {"ids": touched, "count": count, "too_many": too_many, "rows": rows, "digest": digest}


def bulk_do(request, action: str, runs: list[Run]) -> str:
    """Do a bulk action; returns what to tell the user. One audit record per run."""
    ids = [run.pk for run in runs]
    if action.startswith("clear"):
        cleared = clearing.clear(clearing.plan_run_clear(ids, only_failed=action == "clear-failed"))
        by_run = clearing.by_run(cleared)
        for run in runs:
            audit.record("clear", request=request, target=run, workflow=run.workflow.name if run.workflow_id else "",
                         run=run.pk, options={"only_failed": action == "clear-failed"}, bulk=len(runs),
                         **clearing.audit_names(by_run.get(run.pk, [])))
        return f"Cleared {len(cleared)} task run{'s' if len(cleared) != 1 else ''} in {len(by_run)} run(s)."
    state = action.removeprefix("mark-")
    result = clearing.mark_runs(ids, state, by=request.user)
    by_run = clearing.by_run(result["task_runs"])
    for run in runs:
        audit.record("mark", request=request, target=run, workflow=run.workflow.name if run.workflow_id else "",
                     run=run.pk, state=state, bulk=len(runs), **clearing.audit_names(by_run.get(run.pk, [])))
    return (f"Marked {len(runs)} run(s) {state}: {len(result['task_runs'])} task run(s) changed, "
            f"{len(result['runs'])} run(s) changed state.")


@operator_only
def runs_bulk(request):
    """The runs list's action on the runs ticked: a dry run first (which runs, how many task runs
    it touches), then the action when confirmed with that dry run's digest."""
    if request.method != "POST":
        raise InvalidInput("method", "an action on runs takes a POST (the runs list's form)")
    form = RunBulkForm(request.POST)
    if not form.is_valid():
        return page(request, "orchestrator/web/runs_bulk.html", {"form": form}, status=400)
    action, ids = form.cleaned_data["action"], form.cleaned_data["ids"]
    # Another tenant's run reads as one that does not exist.
    runs = list(access.operable(request.user, Run.objects.filter(pk__in=ids)).select_related("workflow").order_by("-id"))
    missing = sorted(set(ids) - {run.pk for run in runs})
    if missing:
        form.add_error("ids", f"no run {', '.join(f'#{i}' for i in missing[:10])}")
        return page(request, "orchestrator/web/runs_bulk.html", {"form": form}, status=400)
    preview = bulk_preview(action, ids)
    stale = "go" in request.POST and form.cleaned_data["confirm"] != preview["digest"]
    if "go" in request.POST and not stale and not preview["too_many"]:
        try:
            messages.success(request, bulk_do(request, action, runs))
        except clearing.ClearError as exc:
            messages.error(request, str(exc))
        return back(request, reverse("orchestrator:web:runs"))
    return page(request, "orchestrator/web/runs_bulk.html", {
        "form": form, "runs": runs, "action": action, "action_label": dict(RUN_BULK_ACTIONS)[action],
        "preview": preview, "stale": stale, "most": clearing.MOST,
        "next": safe_next(request, reverse("orchestrator:web:runs")),
    })


# --- Notes ---------------------------------------------------------------------------------------


def page_extras(run: Run, tr: TaskRun | None = None) -> dict:
    """What the run and task-run pages add for these actions: the note and where to save it, and
    the states the clear dialog applies to."""
    if tr is None:
        return {"note": notes.note_of(run.pk), "run_note_url": reverse("orchestrator:web:run_note", args=[run.pk])}
    return {"note": notes.note_of(run.pk, tr.pk), "clearable_states": FINISHED_TASK_STATES,
            "task_run_note_url": reverse("orchestrator:web:task_run_note", args=[tr.pk])}


def save_note(request, run: Run, task_run: TaskRun | None, done: str):
    if request.method != "POST":
        raise InvalidInput("method", "a note is saved with a POST (the page's note form)")
    was = notes.note_of(run.pk, task_run.pk if task_run else None)
    try:
        note = notes.set_note(run, request.POST.get("text", ""), task_run=task_run, by=request.user)
    except notes.NoteError as exc:
        raise InvalidInput("text", f"note: {exc}") from None
    audit.record("note", request=request, target=task_run or run,
                 workflow=run.workflow.name if run.workflow_id else "", run=run.pk,
                 task=task_run.task if task_run else "", text=note.text if note else "",
                 was=was.text if was else "")
    messages.success(request, "Note saved." if note else "Note deleted.")
    return back(request, done)


@operator_only
def run_note(request, run_id):
    run = operated(request, Run.objects.select_related("workflow"), run_id)
    return save_note(request, run, None, reverse("orchestrator:web:run", args=[run.pk]))


@operator_only
def task_run_note(request, task_run_id):
    tr = operated(request, TaskRun.objects.select_related("run__workflow"), task_run_id)
    return save_note(request, tr.run, tr, reverse("orchestrator:web:task_run", args=[tr.pk]))
