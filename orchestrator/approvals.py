"""Approvals: a task that asks a person and waits for the answer, holding no worker.

    pay_ok = wf.approval("pay_ok", ask="Pay out {params[amount]} EUR?", options=["approve", "reject"],
                         form={"comment": Param(str, default="")}, timeout=3600, groups=["payments"])
    check >> pay_ok >> pay

**Asking** is a short attempt like any task's (so the task is released, retried, cleared and
cancelled as every task is): a worker's child runs ``ask``, which fills the question in (params,
parents' results) and records the ``Approval``; the attempt's outcome ``asked`` puts the task run
in the state ``awaiting``, due at its timeout, and the event ``approval_requested`` goes to the
notification rules. Waiting costs a row, no worker.

**Answering** (the "Waiting for you" page, the run's page, the API, or a signed link in an
email) is one transaction: the run's row is locked as every writer does, the approval is closed
with a guarded update (``state = open``), which exactly one of two people answering at once
wins (the other is told who answered what and when), the task run goes ``awaiting`` →
``succeeded`` (or ``failed`` for an answer in ``reject``) with the answer as its result, the
audit log records it, and the children are released. Operators may answer, and members of the
groups the approval names.

**No answer in time**: the scheduler's leader ends the approvals past their timeout
(``expire``) through the retry rule: with asks left the task asks again, otherwise it is ``dead``
(the dead-letter queue; retrying it there asks again) and its children follow their trigger rules.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction

from orchestrator import access, approval_links, audit, callbacks, clock, limits, resolver, tracing
from orchestrator.channels import wake_due
from orchestrator.models import Approval, Run, TaskRun
from orchestrator.params import ParamError, clean_params
from orchestrator.people import ApprovalState
from orchestrator.registry import job
from orchestrator.states import FINISHED_TASK_STATES, TaskState
from orchestrator.taskcontext import TaskContext


class AnswerRefused(Exception):
    """An answer that does not count; the message says why (already answered, by whom and when;
    no longer open; an option or a form value that is not allowed). ``status``: the HTTP status."""

    def __init__(self, message: str, status: int = 409, errors: dict | None = None):
        super().__init__(message)
        self.status = status
        self.errors = errors or {}


# --- asking ---------------------------------------------------------------------------------------

def render(template: str, ctx: TaskContext) -> str:
    """The question with the run's values filled in (``{params[x]}``, ``{upstream[task]}``,
    ``{run_id}``, ``{logical_date}``, ``{workflow}``, ``{task}``). A placeholder that cannot be
    filled stays as written, with the reason, rather than failing the ask."""
    fields = dict(params=ctx.params, upstream=ctx.upstream, run_id=ctx.run_id, workflow=ctx.workflow,
                     task=ctx.task, logical_date=ctx.logical_date.isoformat() if ctx.logical_date else "")
    try:
        return string.Formatter().vformat(template, (), fields)
    except (KeyError, IndexError, AttributeError, ValueError, TypeError) as exc:
        return f"{template} (could not fill in {limits.safe_repr(exc.args[0] if exc.args else exc)})"


@job
def ask(ctx: TaskContext) -> None:
    """An approval task's attempt: record the question, filled in. The worker then records the
    outcome ``asked``, and the task run awaits the answer."""
    task_run = TaskRun.objects.select_related("run").get(pk=ctx.task_run_id)
    spec = task_run.spec.get("approval") or {}
    now = clock.now()
    timeout = spec.get("timeout")
    # An earlier ask of this task run (timed out, or lost with its worker) no longer counts.
    Approval.objects.filter(task_run=task_run, state=ApprovalState.OPEN).exclude(number=ctx.attempt).update(
        state=ApprovalState.CLOSED)
    Approval.objects.get_or_create(task_run=task_run, number=ctx.attempt, defaults={
        "run_id": task_run.run_id, "workflow": ctx.workflow, "task": task_run.task, "tenant": task_run.tenant,
        "question": render(spec.get("ask", ""), ctx), "options": spec.get("options", []),
        "reject": spec.get("reject", []), "form": spec.get("form", {}), "groups": spec.get("groups", []),
        "asked_at": now, "due_at": now + timedelta(seconds=float(timeout)) if timeout else None,
    })


# --- who may answer, and what is open ------------------------------------------------------------

def may_answer(user, approval: Approval, groups: set[str] | None = None) -> bool:
    """Operators of its tenant (or workflow), and the members of the groups the approval names
    (``groups``: the user's, when the caller read them already)."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    if access.can_operate(user, approval):
        return True
    if groups is None:
        groups = set(user.groups.values_list("name", flat=True))
    return bool(groups & set(approval.groups))


def open_approvals():
    """The approvals a person can answer now: open, and their task runs awaiting this ask."""
    return (Approval.objects.filter(state=ApprovalState.OPEN, task_run__state=TaskState.AWAITING)
            .select_related("task_run", "run").order_by("asked_at", "id"))


def waiting_for(user, run: Run | None = None) -> list[Approval]:
    """The open approvals ``user`` may answer (of one run, when given)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return []
    found = open_approvals()
    if run is not None:
        found = found.filter(run=run)
    groups = set(user.groups.values_list("name", flat=True))
    return [approval for approval in found if may_answer(user, approval, groups)]


# --- answering ------------------------------------------------------------------------------------

@dataclass
class Answer:
    option: str
    values: dict
    by: object = None  # the user, when a person logged in answered
    by_name: str = ""
    via: str = "page"  # page, api or link


def clean(approval: Approval, option, values) -> dict:
    """The form's values, checked against its fields; raises AnswerRefused (400) naming each fault."""
    if option not in approval.options:
        raise AnswerRefused(f"{limits.safe_repr(option)} is not an answer to this question: choose one of "
                            f"{', '.join(approval.options)}", status=400, errors={"answer": "not one of the options"})
    try:
        return clean_params(approval.form, values or {})
    except ParamError as exc:
        raise AnswerRefused(f"the form is not filled in right: {exc}", status=400, errors=exc.errors) from None


def answer(approval_id: int, given: Answer, *, request=None, now: datetime | None = None) -> Approval:
    """Record ``given`` as the answer, if it is the first: the task run ends with it and the run
    goes on. Raises AnswerRefused when the approval was answered already (saying by whom, what and
    when), is no longer open, or the answer is not valid."""
    now = now or clock.now()
    approval = Approval.objects.filter(pk=approval_id).first()
    if approval is None:
        raise AnswerRefused(f"there is no approval #{approval_id}", status=404)
    values = clean(approval, given.option, given.values)
    rejected = given.option in approval.reject
    result = {"answer": given.option, "form": values, "by": given.by_name, "at": now.isoformat()}
    with transaction.atomic(), connection.cursor() as cursor:
        resolver.lock_runs(cursor, [approval.run_id])
        # The guarded update: of two answers at once, the second waits for the first's commit and
        # then finds the approval answered.
        won = Approval.objects.filter(pk=approval.pk, state=ApprovalState.OPEN).update(
            state=ApprovalState.ANSWERED, answer=given.option, values=values, answered_by=given.by,
            answered_by_name=given.by_name[:254], answered_via=given.via, answered_at=now)
        if not won:
            raise AnswerRefused(refusal(Approval.objects.get(pk=approval.pk)))
        awaiting = TaskRun.objects.filter(pk=approval.task_run_id, state=TaskState.AWAITING, attempts=approval.number)
        if rejected:
            ended = awaiting.update(state=TaskState.FAILED, result=result, finished_at=now,
                                    error=f"rejected by {given.by_name or 'someone'}: {given.option}")
        else:
            ended = awaiting.update(state=TaskState.SUCCEEDED, result=result, finished_at=now, error="")
        if not ended:
            # Rolled back with the answer: the task run was cancelled, timed out or not asking yet.
            raise AnswerRefused("this approval is no longer waiting for an answer (its task was cancelled, "
                                "timed out or asked again)")
        audit.record("answer", request=request, user=given.by, actor_name=given.by_name,
                     source="api" if given.via == "api" else "ui", target=approval.task_run,
                     approval=approval.pk, answer=given.option, form=values, via=given.via)
        state = TaskState.FAILED if rejected else TaskState.SUCCEEDED
        callbacks.task_ended([(approval.task_run_id, state)], now=now)
        tracing.task_runs_ended([(approval.task_run_id, approval.run_id, state)], FINISHED_TASK_STATES)
        resolver.resolve_runs([approval.run_id], now=now)
    approval.refresh_from_db()
    return approval


def refusal(approval: Approval) -> str:
    """Why an approval takes no more answers, for the person whose answer came too late."""
    if approval.state == ApprovalState.ANSWERED:
        return (f"already answered: {approval.answered_by_name or 'someone'} chose {approval.answer!r} at "
                f"{approval.answered_at:%Y-%m-%d %H:%M:%S} UTC")
    if approval.state == ApprovalState.TIMED_OUT:
        return "no longer open: no answer came before its timeout"
    return "no longer open: its task was cancelled, cleared or asked again"


# --- signed links -----------------------------------------------------------------------------------

def read_token(token: str) -> tuple[Approval, str, str]:
    """(approval, option, recipient) of a link's token; AnswerRefused (400/404) for a bad one."""
    try:
        approval_id, option, recipient = approval_links.read(token)
    except approval_links.BadLink as exc:
        raise AnswerRefused(str(exc), status=400) from None
    approval = Approval.objects.select_related("task_run", "run").filter(pk=approval_id).first()
    if approval is None:
        raise AnswerRefused("this approval no longer exists", status=404)
    return approval, option, recipient


# --- no answer in time ----------------------------------------------------------------------------

# The awaiting task runs past their timeout, oldest first (taskrun_awaiting), each ended through
# the retry rule: asked again with asks left, dead otherwise. Runs are locked first, in id order,
# as every writer does (resolver.LOCK_RUNS).
DUE = f"""
SELECT id, run_id FROM orchestrator_taskrun
WHERE state = '{TaskState.AWAITING}' AND due_at <= %(now)s ORDER BY due_at LIMIT %(limit)s
"""
EXPIRE = f"""
UPDATE orchestrator_taskrun t SET
    state = CASE WHEN t.attempts < t.max_attempts THEN '{TaskState.SCHEDULED}' ELSE '{TaskState.DEAD}' END,
    due_at = CASE WHEN t.attempts < t.max_attempts THEN %(now)s ELSE t.due_at END,
    finished_at = CASE WHEN t.attempts < t.max_attempts THEN NULL ELSE %(now)s END,
    error = 'no answer within ' || (t.spec->'approval'->>'timeout') || 's'
WHERE t.id = ANY (%(ids)s) AND (t.state = '{TaskState.AWAITING}') IS TRUE AND t.due_at <= %(now)s
RETURNING t.id, t.run_id, t.state
"""


def expire(now: datetime, limit: int = 200) -> int:
    """End the approvals past their timeout (the scheduler's leader, each tick); returns how many."""
    with connection.cursor() as cursor:
        cursor.execute(DUE, {"now": now, "limit": limit})
        due = cursor.fetchall()
    if not due:
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        resolver.lock_runs(cursor, {run_id for _, run_id in due})
        cursor.execute(EXPIRE, {"ids": [task_run_id for task_run_id, _ in due], "now": now})
        ended = cursor.fetchall()
        Approval.objects.filter(task_run_id__in=[row[0] for row in ended], state=ApprovalState.OPEN).update(
            state=ApprovalState.TIMED_OUT)
        callbacks.task_ended([(task_run_id, state) for task_run_id, _, state in ended], now=now)
        dead = {run_id for _, run_id, state in ended if state in FINISHED_TASK_STATES}
        if dead:
            resolver.resolve_runs(dead, now=now)
        if any(state == TaskState.SCHEDULED for *_, state in ended):
            wake_due()
    return len(ended)
