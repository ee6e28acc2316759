"""The API's operator actions with options: clear a task run with upstream, downstream, only
failed, past and future runs; clear or mark a whole run; act on many runs at once; notes on runs
and task runs. Each clear and mark answers a dry run with ``dry_run: true`` (exactly which task
runs, and how many), and each action is recorded in the audit log with the workflow's and the
tasks' names. The web pages call the same functions (``orchestrator.clearing``,
``orchestrator.notes``)."""

from __future__ import annotations

from django.db.models import Prefetch
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from orchestrator import access, audit, clearing, notes, reads
from orchestrator.api import serializers as s
from orchestrator.api.base import APIBase, body, errors, get_run, validated
from orchestrator.api.fields import Flag, Text
from orchestrator.api.schema import extend_schema
from orchestrator.limits import MAX_ID
from orchestrator.models import Attempt, Run, TaskRun
from orchestrator.people import NOTE_LENGTH

BULK_MOST = 100  # runs one bulk request takes
BULK_ACTIONS = ["clear", "clear-failed", "mark-succeeded", "mark-failed"]

# --- request and answer shapes ----------------------------------------------------------------------


class TaskClearSerializer(serializers.Serializer):
    downstream = Flag(required=False, default=True, help_text="Also the tasks downstream of it, transitively.")
    upstream = Flag(required=False, default=False, help_text="Also the tasks upstream of it, transitively.")
    only_failed = Flag(required=False, default=False,
                       help_text="Only task runs that failed, died or were upstream-failed.")
    past = Flag(required=False, default=False,
                help_text="Also these tasks in the workflow's runs with an earlier logical date.")
    future = Flag(required=False, default=False,
                  help_text="Also these tasks in the workflow's runs with a later logical date.")
    dry_run = Flag(required=False, default=False, help_text="Change nothing: answer which task runs it would clear.")


class RunClearSerializer(serializers.Serializer):
    only_failed = Flag(required=False, default=False, help_text="Only the run's failed, dead or upstream-failed tasks.")
    dry_run = Flag(required=False, default=False, help_text="Change nothing: answer which task runs it would clear.")


class RunMarkSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=["succeeded", "failed"], help_text="The outcome to set.")
    dry_run = Flag(required=False, default=False, help_text="Change nothing: answer which task runs it would mark.")


class RunBulkSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=BULK_ACTIONS)
    ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=MAX_ID), min_length=1,
                                max_length=BULK_MOST, help_text=f"Run ids (1 to {BULK_MOST}).")
    dry_run = Flag(required=False, default=False, help_text="Change nothing: answer what it would touch.")


class NoteRequestSerializer(serializers.Serializer):
    # Not trimmed here: the schema's maxLength is of the text as sent (orchestrator.notes trims it).
    text = Text(allow_blank=True, trim_whitespace=False, max_length=NOTE_LENGTH,
                help_text="The note; empty deletes it.")


class ClearRowSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    run = serializers.IntegerField()
    logical_date = serializers.DateTimeField()
    task = serializers.CharField()
    map_index = serializers.IntegerField()
    state = serializers.CharField()


class ClearAnswerSerializer(serializers.Serializer):
    """The answer of a clear (``task_run``: the task run cleared, as it is now; not in a dry run
    nor for a whole run)."""

    dry_run = serializers.BooleanField()
    count = serializers.IntegerField(help_text="how many task runs it touches (or touched)")
    runs = serializers.IntegerField(help_text="in how many runs")
    too_many = serializers.BooleanField(help_text=f"more than {clearing.MOST} match: the clear is refused")
    task_runs = ClearRowSerializer(many=True, help_text=f"the first {clearing.SHOWN}, by logical date")
    changed = serializers.ListField(child=serializers.IntegerField(), help_text="ids cleared (empty in a dry run)")
    task_run = s.TaskRunDetailSerializer(required=False, help_text="the task run asked for, after the clear")


class MarkAnswerSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    count = serializers.IntegerField(help_text=f"how many task runs it changes (or changed); {clearing.MOST} + 1 "
                                               "when more than that match")
    too_many = serializers.BooleanField(help_text=f"more than {clearing.MOST} match: the mark is refused")
    task_runs = serializers.ListField(child=serializers.IntegerField(), help_text="ids marked (or to mark)")
    runs = serializers.ListField(child=serializers.IntegerField(), help_text="runs that changed state")


class BulkAnswerSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    action = serializers.CharField()
    runs = serializers.ListField(child=serializers.IntegerField())
    count = serializers.IntegerField(help_text="task runs touched (or to touch)")
    task_runs = serializers.ListField(child=serializers.IntegerField(), help_text="their ids")


# --- helpers -----------------------------------------------------------------------------------------


def workflow_name(run: Run) -> str:
    return run.workflow.name if run.workflow_id else ""


def plan_answer(plan: clearing.ClearPlan, dry_run: bool, changed=()) -> dict:
    return {"dry_run": dry_run, "count": len(changed) if not dry_run else plan.count, "runs": plan.runs,
            "too_many": plan.too_many, "task_runs": plan.rows, "changed": list(changed)}


def do_clear(plan: clearing.ClearPlan) -> list[int]:
    try:
        return clearing.clear(plan)
    except clearing.ClearError as exc:
        raise ValidationError({"non_field_errors": [str(exc)]}) from None


def task_run_detail(pk: int) -> dict:
    task_run = (reads.listed_result(TaskRun.objects.select_related("run__workflow"))
                .prefetch_related(Prefetch("attempt_set", Attempt.objects.select_related("worker"))).get(pk=pk))
    return s.TaskRunDetailSerializer(task_run).data


def get_task_run(pk: int, user) -> TaskRun:
    """The task run ``pk`` that ``user`` may read, or a 404."""
    task_run = access.visible(user, TaskRun.objects.select_related("run__workflow")).filter(pk=pk).first()
    if task_run is None:
        raise NotFound(f"no task run {pk}")
    return task_run


# --- views -------------------------------------------------------------------------------------------


class TaskRunClearView(APIBase):
    @extend_schema(tags=["runs"], summary="Clear a task run, with its options; dry_run lists what it would clear",
                   description="The task run and, as asked, the tasks upstream and downstream of it, only failed "
                               "task runs, and the same tasks in the workflow's earlier (past) or later (future) "
                               "runs, run again. Only finished task runs of runs not held back are cleared. With "
                               f"`dry_run` nothing changes. More than {clearing.MOST} task runs is a 400.",
                   request=TaskClearSerializer, responses={200: ClearAnswerSerializer, **errors(400, 401, 403, 404)})
    def post(self, request, pk):
        task_run = get_task_run(pk, request.user)
        access.require_operate(request.user, task_run)
        data = validated(TaskClearSerializer, body(request))
        options = {key: value for key, value in data.items() if key != "dry_run"}
        plan = clearing.plan_task_clear(task_run, clearing.ClearScope(**options))
        if data["dry_run"]:
            return Response(plan_answer(plan, True))
        changed = do_clear(plan)
        audit.record("clear", request=request, target=task_run, workflow=workflow_name(task_run.run),
                     task=task_run.task, run=task_run.run_id, options=options, **clearing.audit_names(changed))
        return Response({**plan_answer(plan, False, changed), "task_run": task_run_detail(pk)})


class RunClearView(APIBase):
    @extend_schema(tags=["runs"], summary="Clear a whole run (or only its failed tasks); dry_run lists what it would",
                   request=RunClearSerializer, responses={200: ClearAnswerSerializer, **errors(400, 401, 403, 404)})
    def post(self, request, pk):
        run = get_run(pk, request.user)
        access.require_operate(request.user, run)
        data = validated(RunClearSerializer, body(request))
        plan = clearing.plan_run_clear([run.pk], only_failed=data["only_failed"])
        if data["dry_run"]:
            return Response(plan_answer(plan, True))
        changed = do_clear(plan)
        audit.record("clear", request=request, target=run, workflow=workflow_name(run), run=run.pk,
                     options={"only_failed": data["only_failed"]}, **clearing.audit_names(changed))
        return Response(plan_answer(plan, False, changed))


class RunMarkView(APIBase):
    @extend_schema(tags=["runs"], summary="Mark a whole run succeeded or failed; running attempts are stopped",
                   description="succeeded: every task run that did not end well is marked succeeded; failed: the "
                               "unfinished ones are marked failed (a run that had ended well is marked failed "
                               "itself). With `dry_run` nothing changes.",
                   request=RunMarkSerializer, responses={200: MarkAnswerSerializer, **errors(400, 401, 403, 404)})
    def post(self, request, pk):
        run = get_run(pk, request.user)
        access.require_operate(request.user, run)
        data = validated(RunMarkSerializer, body(request))
        return Response(mark(request, [run], data["state"], data["dry_run"]))


def mark(request, runs: list[Run], state: str, dry_run: bool, bulk: int | None = None) -> dict:
    ids = [run.pk for run in runs]
    if dry_run:
        # As a clear's dry run: counted up to MOST + 1, flagged past MOST (where the mark refuses).
        touched = clearing.markable_of_runs(ids, state)
        return {"dry_run": True, "count": len(touched), "too_many": len(touched) > clearing.MOST,
                "task_runs": touched[:clearing.MOST], "runs": []}
    try:
        result = clearing.mark_runs(ids, state, by=request.user)
    except clearing.ClearError as exc:
        raise ValidationError({"non_field_errors": [str(exc)]}) from None
    mine = clearing.by_run(result["task_runs"])
    for run in runs:
        extra = {"bulk": bulk} if bulk else {}
        audit.record("mark", request=request, target=run, workflow=workflow_name(run), run=run.pk, state=state,
                     **extra, **clearing.audit_names(mine.get(run.pk, [])))
    return {"dry_run": False, "count": len(result["task_runs"]), "too_many": False, "task_runs": result["task_runs"],
            "runs": result["runs"]}


class RunBulkView(APIBase):
    @extend_schema(tags=["runs"], summary="Clear or mark many runs at once; dry_run answers what it would touch",
                   description=f"1 to {BULK_MOST} run ids. Actions: clear (every task), clear-failed, "
                               "mark-succeeded, mark-failed, as for one run. One audit record per run.",
                   request=RunBulkSerializer, responses={200: BulkAnswerSerializer, **errors(400, 401, 403)})
    def post(self, request):
        data = validated(RunBulkSerializer, body(request))
        ids = sorted(set(data["ids"]))
        # Another tenant's run reads as one that does not exist.
        runs = list(access.operable(request.user, Run.objects.filter(pk__in=ids)).select_related("workflow")
                    .order_by("id"))
        missing = sorted(set(ids) - {run.pk for run in runs})
        if missing:
            raise ValidationError({"ids": [f"no run {', '.join(map(str, missing[:10]))}"]})
        action = data["action"]
        if action.startswith("mark-"):
            answer = mark(request, runs, action.removeprefix("mark-"), data["dry_run"], bulk=len(runs))
            if answer["too_many"]:
                raise ValidationError({"ids": [f"more than {clearing.MOST} task runs would be marked: fewer runs"]})
            return Response({"action": action, "dry_run": answer["dry_run"], "runs": ids, "count": answer["count"],
                             "task_runs": answer["task_runs"]})
        plan = clearing.plan_run_clear(ids, only_failed=action == "clear-failed")
        if data["dry_run"]:
            if plan.too_many:
                raise ValidationError({"ids": [f"more than {clearing.MOST} task runs would be cleared: fewer runs"]})
            return Response({"action": action, "dry_run": True, "runs": ids, "count": plan.count,
                             "task_runs": plan.ids})
        changed = do_clear(plan)
        by_run = clearing.by_run(changed)
        for run in runs:
            audit.record("clear", request=request, target=run, workflow=workflow_name(run), run=run.pk, bulk=len(runs),
                         options={"only_failed": action == "clear-failed"}, **clearing.audit_names(by_run.get(run.pk, [])))
        return Response({"action": action, "dry_run": False, "runs": ids, "count": len(changed), "task_runs": changed})


class NoteView(APIBase):
    """The note of a run or of a task run: read it (viewers), write or delete it (operators)."""

    def target(self, pk) -> tuple[Run, TaskRun | None]:
        """The run (and task run) of the note, which the user may read (or a 404)."""
        raise NotImplementedError

    def answer(self, run: Run, task_run: TaskRun | None) -> Response:
        return Response(s.note_data(notes.note_of(run.pk, task_run.pk if task_run else None)))

    def get(self, request, pk):
        return self.answer(*self.target(pk))

    def put(self, request, pk):
        run, task_run = self.target(pk)
        access.require_operate(request.user, task_run or run)
        data = validated(NoteRequestSerializer, body(request))
        was = notes.note_of(run.pk, task_run.pk if task_run else None)
        try:
            note = notes.set_note(run, data["text"], task_run=task_run, by=request.user)
        except notes.NoteError as exc:
            raise ValidationError({"text": [str(exc)]}) from None
        audit.record("note", request=request, target=task_run or run, workflow=workflow_name(run), run=run.pk,
                     task=task_run.task if task_run else "", text=note.text if note else "",
                     was=was.text if was else "")
        return self.answer(run, task_run)


NOTE_DOC = {"request": NoteRequestSerializer, "responses": {200: s.NoteSerializer, **errors(400, 401, 403, 404)}}


class RunNoteView(NoteView):
    def target(self, pk):
        return get_run(pk, self.request.user), None

    @extend_schema(tags=["runs"], summary="A run's note (text empty when it has none)",
                   responses={200: s.NoteSerializer, **errors(401, 403, 404)})
    def get(self, request, pk):
        return super().get(request, pk)

    @extend_schema(tags=["runs"], summary="Write a run's note (empty text deletes it)", **NOTE_DOC)
    def put(self, request, pk):
        return super().put(request, pk)


class TaskRunNoteView(NoteView):
    def target(self, pk):
        task_run = get_task_run(pk, self.request.user)
        return task_run.run, task_run

    @extend_schema(tags=["runs"], summary="A task run's note (text empty when it has none)",
                   responses={200: s.NoteSerializer, **errors(401, 403, 404)})
    def get(self, request, pk):
        return super().get(request, pk)

    @extend_schema(tags=["runs"], summary="Write a task run's note (empty text deletes it)", **NOTE_DOC)
    def put(self, request, pk):
        return super().put(request, pk)
