"""What the API reads and writes; together they are the OpenAPI schema's components. Input
serializers are made of the field types of ``api.fields``, which check everything PostgreSQL or
our modules would otherwise reject late, so a bad request is a 400 naming the field and changes
nothing stored."""

from __future__ import annotations

from urllib.parse import urlencode

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from orchestrator import backfill as backfills
from orchestrator import counts, cron, reads
from orchestrator.api.fields import (
    AwareDateTimeField,
    Flag,
    IdempotencyKeyField,
    JSONObjectField,
    QueryInteger,
    Text,
    WholeNumber,
)
from orchestrator.api.result_fields import STORED_RESULT_HELP, ResultField, listed_result, result_url
from orchestrator.limits import (
    MAX_ID,
    MAX_LOG_OFFSET,
    PRIORITY_MAX,
    PRIORITY_MIN,
)
from orchestrator.models import (
    Attempt,
    AuditEvent,
    Backfill,
    DatasetEvent,
    Note,
    Run,
    Schedule,
    TaskRun,
    Workflow,
)
from orchestrator.states import RunState, TaskState, Trigger

PRIORITY_RANGE = (PRIORITY_MIN, PRIORITY_MAX)


# --- workflows ------------------------------------------------------------------------------------


class ScheduleSerializer(serializers.ModelSerializer):
    description = serializers.SerializerMethodField()
    next_fire_times = serializers.SerializerMethodField(help_text="The next five fire times, in UTC.")

    class Meta:
        model = Schedule
        fields = ["name", "source", "cron", "timezone", "description", "catchup", "max_catchup", "overlap",
                  "start_deadline", "jitter", "params", "paused", "next_fire_at", "last_fire_at", "next_fire_times"]

    def get_description(self, schedule) -> str:
        try:
            return cron.describe(schedule.cron)
        except cron.CronError as exc:
            return str(exc)

    @extend_schema_field({"type": "array", "items": {"type": "string", "format": "date-time"}})
    def get_next_fire_times(self, schedule):
        now = self.context.get("now")
        try:
            return [utc.isoformat() for utc, _local in cron.preview(schedule.cron, schedule.timezone, now, count=5)]
        except cron.CronError:
            return []


class TaskNodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.CharField(help_text="python or shell")
    ref = serializers.CharField(required=False, help_text="module:function of a Python task")
    command = serializers.CharField(required=False, help_text="the command of a shell task")
    upstream = serializers.ListField(child=serializers.CharField())
    queue = serializers.CharField()
    priority = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    timeout = serializers.FloatField(allow_null=True)
    trigger_rule = serializers.CharField()
    group = serializers.CharField(allow_null=True, help_text="the innermost task group it is in, or null")
    group_path = serializers.ListField(child=serializers.CharField(), help_text="its task groups, outermost first")


class GraphSerializer(serializers.Serializer):
    tasks = TaskNodeSerializer(many=True)
    edges = serializers.ListField(
        child=serializers.ListField(child=serializers.CharField(), min_length=2, max_length=2),
        help_text="[parent, child] pairs",
    )
    groups = serializers.DictField(child=serializers.DictField(), help_text="task groups: {name: {parent, tooltip}}")


class WorkflowSerializer(serializers.ModelSerializer):
    version = serializers.IntegerField(source="current_version.number", allow_null=True, default=None)

    class Meta:
        model = Workflow
        fields = ["name", "description", "tags", "owner", "tenant", "paused", "broken", "sync_error", "present",
                  "max_active_runs", "version", "updated_at"]


class WorkflowDetailSerializer(WorkflowSerializer):
    params = serializers.SerializerMethodField(help_text="The declared params: type, default, required, choices.")
    graph = serializers.SerializerMethodField()
    schedules = ScheduleSerializer(many=True, read_only=True)

    class Meta(WorkflowSerializer.Meta):
        fields = [*WorkflowSerializer.Meta.fields, "module", "webhooks", "params", "graph", "schedules"]

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "object", "additionalProperties": True}})
    def get_params(self, workflow):
        return workflow.spec.get("params", {})

    @extend_schema_field(GraphSerializer)
    def get_graph(self, workflow):
        tasks = []
        edges = []
        for name, spec in workflow.spec.get("tasks", {}).items():
            node = {"name": name, "kind": spec.get("kind", "python"), "upstream": spec.get("upstream", []),
                    "queue": spec.get("queue", "default"), "priority": spec.get("priority", 0),
                    "max_attempts": spec.get("max_attempts", 1), "timeout": spec.get("timeout"),
                    "trigger_rule": spec.get("trigger_rule", "all_success"),
                    "group": (spec.get("group") or [None])[-1], "group_path": spec.get("group", [])}
            if "ref" in spec:
                node["ref"] = spec["ref"]
            if "command" in spec:
                node["command"] = spec["command"]
            tasks.append(node)
            edges.extend([parent, name] for parent in spec.get("upstream", []))
        return {"tasks": tasks, "edges": edges, "groups": workflow.spec.get("groups", {})}


# --- runs ---------------------------------------------------------------------------------------


class RunSerializer(serializers.ModelSerializer):
    workflow = serializers.CharField(source="workflow.name", allow_null=True, default=None)
    schedule = serializers.CharField(source="schedule.name", allow_null=True, default=None)
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)
    version = serializers.IntegerField(
        source="version.number", allow_null=True, default=None,
        help_text="the number of the workflow's graph version this run follows (null for a job)")

    class Meta:
        model = Run
        fields = ["id", "workflow", "version", "trigger", "state", "logical_date", "params", "priority", "tenant",
                  "schedule", "backfill", "idempotency_key", "reason", "created_by", "created_at", "started_at",
                  "finished_at"]


class SensorSerializer(serializers.Serializer):
    """A sensor's waiting: its checks are no attempts."""

    waiting = serializers.BooleanField(help_text="Between checks (state sensing), holding no worker.")
    checks = serializers.IntegerField(help_text="Checks made so far, over all its attempts.")
    last_answer = serializers.CharField(help_text="The latest \"not yet\" answer, as short JSON text.")
    next_check_at = serializers.DateTimeField(allow_null=True, help_text="When it is checked next, while waiting.")


class TaskRunSerializer(serializers.ModelSerializer):
    result = ResultField(read_only=True, allow_null=True)
    map_index = serializers.IntegerField(
        read_only=True, help_text="-1 for a task's own task run; a mapped task's instances are numbered from 0")
    sensor = serializers.SerializerMethodField(help_text="A sensor's waiting (null for other tasks).")

    class Meta:
        model = TaskRun
        fields = ["id", "task", "map_index", "state", "upstream", "queue", "priority", "attempts", "max_attempts",
                  "due_at", "timeout", "result", "error", "created_at", "queued_at", "started_at", "finished_at",
                  "sensor"]

    @extend_schema_field(SensorSerializer(allow_null=True))
    def get_sensor(self, task_run) -> dict | None:
        if "sensor" not in (task_run.spec or {}):
            return None
        waiting = task_run.state == TaskState.SENSING
        return {"waiting": waiting, "checks": task_run.checks, "last_answer": task_run.last_answer,
                "next_check_at": task_run.due_at if waiting else None}


class RunTaskRunSerializer(TaskRunSerializer):
    result = ResultField(source="listed_result", read_only=True, allow_null=True,
                         help_text="null for a mapped task's own task run: its result, the list of "
                                   "every instance's result, is GET /api/task-runs/{id}/result/; "
                                   + STORED_RESULT_HELP)

    class Meta(TaskRunSerializer.Meta):
        pass


class TaskCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="the run's tasks: one per task of its graph, a mapped task once")
    by_state = serializers.DictField(child=serializers.IntegerField())


class MappedTaskSerializer(serializers.Serializer):
    task = serializers.CharField()
    task_run = serializers.IntegerField(help_text="the mapped task's own task run (map_index -1)")
    state = serializers.ChoiceField(choices=TaskState.choices, help_text="the mapped task's own state")
    instances = serializers.IntegerField(help_text="how many instances it has")
    by_state = serializers.DictField(child=serializers.IntegerField(), help_text="its instances by state")
    instances_url = serializers.CharField(help_text="its instances, a page at a time")


class RunTaskRunFilterSerializer(serializers.Serializer):
    task = serializers.CharField(required=False, max_length=255, trim_whitespace=False,
                                 help_text="one task's task runs (a mapped task's: its own and its instances)")
    state = serializers.ChoiceField(choices=TaskState.choices, required=False)


class NoteSerializer(serializers.Serializer):
    text = serializers.CharField(help_text="empty when there is no note")
    author = serializers.CharField(allow_null=True, help_text="who wrote it last")
    created_at = serializers.DateTimeField(allow_null=True)
    updated_at = serializers.DateTimeField(allow_null=True)


def note_data(note) -> dict:
    """A note as the API shows it; no note is an empty text."""
    if note is None:
        return {"text": "", "author": None, "created_at": None, "updated_at": None}
    return {"text": note.text, "author": note.author_name or None, "created_at": note.created_at,
            "updated_at": note.updated_at}


@extend_schema_field(NoteSerializer)
class NoteField(serializers.Field):
    """The note of a run (or, with ``task_run``, of a task run): one query, on detail answers only."""

    def __init__(self, task_run: bool = False, **kwargs):
        self.of_task_run = task_run
        super().__init__(source="*", read_only=True, help_text="the operators' note (orchestrator.notes)", **kwargs)

    def to_representation(self, value):
        where = {"run_id": value.run_id, "task_run_id": value.pk} if self.of_task_run else {
            "run_id": value.pk, "task_run_id": None}
        return NoteSerializer(note_data(Note.objects.filter(**where).first())).data


class RunDetailSerializer(RunSerializer):
    """A run with its counts, never a list of its task runs (a run may have 100,000): those are
    paged at ``task_runs_url``."""

    tasks = serializers.SerializerMethodField()
    mapped = serializers.SerializerMethodField(help_text="every mapped task of the run, with its instances' counts")
    task_runs_url = serializers.SerializerMethodField(
        help_text="the run's task runs, instances too, by task and map index, a page at a time")
    note = NoteField()

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "tasks", "mapped", "task_runs_url", "note"]

    def to_representation(self, run):
        # Both counts come from one statement (reads.run_counts), asked once per run.
        self._counts = reads.run_counts(run)
        return super().to_representation(run)

    @extend_schema_field(TaskCountsSerializer)
    def get_tasks(self, run) -> dict:
        return {"total": self._counts.total_tasks, "by_state": self._counts.tasks}

    @extend_schema_field(MappedTaskSerializer(many=True))
    def get_mapped(self, run) -> list[dict]:
        instances = self._counts.instances
        if not instances:
            return []
        own = {task: (pk, state) for task, pk, state in TaskRun.objects.filter(
            run_id=run.pk, map_index=-1, task__in=sorted(instances)).values_list("task", "id", "state")}
        url = reverse("orchestrator:api:run-task-runs", args=[run.pk])
        return [{"task": task, "task_run": own[task][0], "state": own[task][1], "instances": sum(counts.values()),
                 "by_state": counts, "instances_url": f"{url}?{urlencode({'task': task})}"}
                for task, counts in sorted(instances.items()) if task in own]

    def get_task_runs_url(self, run) -> str:
        return reverse("orchestrator:api:run-task-runs", args=[run.pk])


class AttemptSerializer(serializers.ModelSerializer):
    worker = serializers.CharField(source="worker.name", allow_null=True, default=None)
    duration = serializers.FloatField(read_only=True, allow_null=True, help_text="seconds")
    log_url = serializers.SerializerMethodField()

    class Meta:
        model = Attempt
        fields = ["number", "outcome", "worker", "started_at", "finished_at", "duration", "error", "traceback",
                  "log_url"]

    def get_log_url(self, attempt) -> str:
        return reverse("orchestrator:api:attempt-log", args=[attempt.task_run_id, attempt.number])


HIDDEN = "(hidden)"


class MappedResultsSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="how many instances (and results) the mapped task has")
    by_state = serializers.DictField(child=serializers.IntegerField(), help_text="its instances by state")
    results_url = serializers.CharField(help_text="its instances with their results, in map-index order, "
                                                  "a page at a time")
    result_url = serializers.CharField(help_text="the mapped task's result, the list of every instance's "
                                                 "result in map-index order, streamed whole")


class TaskRunDetailSerializer(TaskRunSerializer):
    run = serializers.IntegerField(source="run_id")
    workflow = serializers.CharField(source="run.workflow.name", allow_null=True, default=None)
    spec = serializers.SerializerMethodField(
        help_text="What the task runs; the values of a shell task's declared `env` are hidden (names only).")
    attempt_list = AttemptSerializer(source="attempt_set", many=True, read_only=True)
    result = serializers.SerializerMethodField(
        help_text="null for a mapped task's own task run: its results are its instances', paged at "
                  "mapped.results_url, and all of them in one list at GET /api/task-runs/{id}/result/; "
                  + STORED_RESULT_HELP)
    mapped = serializers.SerializerMethodField(
        help_text="a mapped task's own task run: its instances counted, and where their results are (null otherwise)")

    note = NoteField(task_run=True)

    class Meta(TaskRunSerializer.Meta):
        fields = ["run", "workflow", *TaskRunSerializer.Meta.fields, "mapped", "spec", "attempt_list", "note"]

    @staticmethod
    def _is_mapped(task_run) -> bool:
        return task_run.map_index == -1 and "map_over" in (task_run.spec or {})

    @extend_schema_field(OpenApiTypes.ANY)
    def get_result(self, task_run):
        # A mapped task's own result is every instance's (100,000 of them, possibly): never loaded
        # here (the view defers it), never sent in one answer.
        if self._is_mapped(task_run):
            return None
        return listed_result(task_run.listed_result if hasattr(task_run, "listed_result") else task_run.result)

    @extend_schema_field(MappedResultsSerializer(allow_null=True))
    def get_mapped(self, task_run) -> dict | None:
        if not self._is_mapped(task_run):
            return None
        by_state = counts.task_instance_counts(task_run.run_id, task_run.task)
        url = reverse("orchestrator:api:run-task-runs", args=[task_run.run_id])
        return {"count": sum(by_state.values()), "by_state": by_state,
                "results_url": f"{url}?{urlencode({'task': task_run.task})}", "result_url": result_url(task_run.pk)}

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_spec(self, task_run) -> dict:
        spec = dict(task_run.spec or {})
        if isinstance(spec.get("env"), dict):
            # Declared values may be credentials: the names say what the command gets, never the values.
            spec["env"] = dict.fromkeys(spec["env"], HIDDEN)
        return spec


class RunFilterSerializer(serializers.Serializer):
    workflow = serializers.CharField(required=False, max_length=200, trim_whitespace=False, help_text="workflow name")
    state = serializers.ChoiceField(choices=RunState.choices, required=False)
    trigger = serializers.ChoiceField(choices=Trigger.choices, required=False)
    created_after = AwareDateTimeField(required=False, help_text="created at or after (with timezone)")
    created_before = AwareDateTimeField(required=False, help_text="created before (with timezone)")
    logical_after = AwareDateTimeField(required=False, help_text="logical date at or after (with timezone)")
    logical_before = AwareDateTimeField(required=False, help_text="logical date before (with timezone)")


class TriggerSerializer(serializers.Serializer):
    params = JSONObjectField(required=False, default=dict, help_text="Values for the workflow's declared params.")
    logical_date = AwareDateTimeField(required=False, allow_null=True, default=None,
                                      help_text="The run's logical date; now when omitted.")
    priority = WholeNumber(required=False, default=0, min_value=PRIORITY_RANGE[0], max_value=PRIORITY_RANGE[1])
    idempotency_key = IdempotencyKeyField()


class CancelSerializer(serializers.Serializer):
    reason = Text(required=False, default="", allow_blank=True, max_length=2000)


class CancelResultSerializer(serializers.Serializer):
    cancelled = serializers.BooleanField(help_text="false when the run had already finished")
    run = RunSerializer()


class RunRetriedSerializer(serializers.Serializer):
    retried = serializers.IntegerField(help_text="task runs that got a fresh attempt")
    run = RunSerializer()


class LogQuerySerializer(serializers.Serializer):
    offset = QueryInteger(required=False, default=0, min_value=0, max_value=MAX_LOG_OFFSET,
                          help_text="a byte offset into the log (up to 1 TiB)")
    limit = QueryInteger(required=False, default=65536, min_value=1, max_value=1024 * 1024)


class LogPageSerializer(serializers.Serializer):
    text = serializers.CharField(allow_blank=True)
    next_offset = serializers.IntegerField()
    eof = serializers.BooleanField()


# --- dead-letter queue ---------------------------------------------------------------------------


class DeadTaskRunSerializer(TaskRunSerializer):
    run = serializers.IntegerField(source="run_id")
    workflow = serializers.CharField(source="run.workflow.name", allow_null=True, default=None)

    class Meta(TaskRunSerializer.Meta):
        fields = ["run", "workflow", *TaskRunSerializer.Meta.fields]


class DeadLetterFilterSerializer(serializers.Serializer):
    workflow = serializers.CharField(required=False, max_length=200, trim_whitespace=False, help_text="workflow name")
    queue = serializers.CharField(required=False, max_length=100, trim_whitespace=False)


class TaskRunIdsSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=WholeNumber(min_value=1, max_value=MAX_ID), min_length=1, max_length=1000,
        help_text="Task run ids (one or many).",
    )


class MarkSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=["succeeded", "failed"], help_text="The outcome to set.")


class TaskRunActionSerializer(serializers.Serializer):
    changed = serializers.ListField(child=serializers.IntegerField(),
                                    help_text="ids of the task runs the action changed (none when it did not apply)")
    task_run = TaskRunDetailSerializer()


class RetriedSerializer(serializers.Serializer):
    requested = serializers.IntegerField()
    retried = serializers.IntegerField(help_text="how many were dead or failed and got a fresh attempt")


class DiscardedSerializer(serializers.Serializer):
    requested = serializers.IntegerField()
    discarded = serializers.IntegerField(help_text="how many were dead and left the dead-letter queue")


# --- backfills ----------------------------------------------------------------------------------


class BackfillRequestSerializer(serializers.Serializer):
    workflow = Text(max_length=200)
    start = AwareDateTimeField(help_text="first logical date, inclusive (with timezone); from 1900-01-01")
    end = AwareDateTimeField(help_text="last logical date, inclusive (with timezone); before 2200-01-01")
    schedule = Text(required=False, allow_null=True, default=None, max_length=100,
                    help_text="schedule name; may be omitted when the workflow has one schedule")
    cron = Text(required=False, allow_null=True, default=None, max_length=200,
                help_text="backfill these fire times instead of a schedule's")
    timezone = Text(required=False, default="UTC", max_length=64, help_text="the timezone of cron (IANA name)")
    reprocess = serializers.ChoiceField(choices=Backfill.Reprocess.choices, required=False,
                                        default=Backfill.Reprocess.NONE,
                                        help_text="what to do with fire times that already have a run")
    params = JSONObjectField(required=False, default=dict, help_text="override the schedule's params")
    dry_run = Flag(required=False, default=False, help_text="only list the fire times and counts; create nothing")

    # What validate() refuses, in the schema too (api.schema.cross_field_rules): a schedule and a cron
    # expression are two answers to one question.
    schema_rules = {"not": {"required": ["schedule", "cron"],
                            "properties": {"schedule": {"type": "string"}, "cron": {"type": "string"}}}}

    def validate(self, data):
        if data["end"] < data["start"]:
            raise serializers.ValidationError({"end": ["must not be before start"]})
        if data["cron"] is not None and data["schedule"] is not None:
            raise serializers.ValidationError({"cron": ["give a schedule or a cron expression, not both"]})
        return data


class BackfillPlanSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    workflow = serializers.CharField()
    schedule = serializers.CharField(allow_null=True)
    cron = serializers.CharField()
    timezone = serializers.CharField()
    count = serializers.IntegerField(help_text="fire times in the range")
    existing = serializers.IntegerField(help_text="fire times that already have a run")
    to_create = serializers.IntegerField(help_text="runs the backfill would create")
    to_reprocess = serializers.IntegerField(help_text="existing runs the backfill would run again")
    fire_times = serializers.ListField(child=serializers.DateTimeField())


class BackfillSerializer(serializers.ModelSerializer):
    workflow = serializers.CharField(source="workflow.name")
    schedule = serializers.CharField(source="schedule.name", allow_null=True, default=None)
    done = serializers.SerializerMethodField(help_text="runs of the backfill that have finished")

    class Meta:
        model = Backfill
        fields = ["id", "workflow", "schedule", "start", "end", "reprocess", "params", "total", "done", "created_at"]

    def get_done(self, backfill) -> int:
        done, _total = backfills.progress(backfill)
        return done


# --- audit log ---------------------------------------------------------------------------------


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", help_text="the user name at the time (or the OS user of a command)")
    detail = serializers.JSONField()

    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor", "action", "source", "ip", "target_type", "target_id", "target_label", "detail"]


class AuditFilterSerializer(serializers.Serializer):
    action = serializers.CharField(required=False, max_length=50, trim_whitespace=False,
                                   help_text="e.g. trigger, cancel, retry")
    actor = serializers.CharField(required=False, max_length=150, trim_whitespace=False, help_text="user name")
    source = serializers.ChoiceField(choices=AuditEvent.Source.choices, required=False)
    target_type = serializers.CharField(required=False, max_length=50, trim_whitespace=False,
                                        help_text="run, taskrun, workflow, ...")
    target_id = serializers.CharField(required=False, max_length=255, trim_whitespace=False)
    since = AwareDateTimeField(required=False, help_text="at or after (with timezone)")
    until = AwareDateTimeField(required=False, help_text="before (with timezone)")

    def validate(self, data):
        for key, value in data.items():
            if isinstance(value, str) and "\x00" in value:
                raise serializers.ValidationError({key: ["contains a NUL character"]})
        return data


# --- dataset events ------------------------------------------------------------------------------


class DatasetEventSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="dataset.name", help_text="the dataset's name")
    workflow = serializers.CharField(help_text="the producing workflow (by name; empty for a job)")
    task = serializers.CharField(help_text="the producing task")
    run = serializers.IntegerField(source="run_id", allow_null=True,
                                   help_text="the producer's run (null once retention pruned it)")
    task_run = serializers.IntegerField(source="task_run_id", allow_null=True, help_text="the producing task run")
    metadata = serializers.JSONField(help_text="what the producer put in ctx.metadata[dataset]")
    consumer_runs = serializers.SerializerMethodField(help_text="the runs of consumer workflows this event started "
                                                                "(or that a pending consumer will start)")

    class Meta:
        model = DatasetEvent
        fields = ["id", "dataset", "workflow", "task", "run", "task_run", "logical_date", "metadata", "created_at",
                  "handled", "consumer_runs"]

    @extend_schema_field({"type": "array", "items": {"type": "object", "properties": {
        "workflow": {"type": "string"}, "run": {"type": "integer", "nullable": True},
        "consumed_at": {"type": "string", "format": "date-time", "nullable": True}}}})
    def get_consumer_runs(self, event) -> list[dict]:
        return [{"workflow": c.workflow.name, "run": c.run_id, "consumed_at": c.consumed_at}
                for c in event.consumers.all()]


class DatasetEventFilterSerializer(serializers.Serializer):
    dataset = serializers.CharField(required=False, max_length=200, trim_whitespace=False,
                                    help_text="only this dataset's events (exact name)")
    workflow = serializers.CharField(required=False, max_length=200, trim_whitespace=False,
                                     help_text="only events produced by this workflow")
    since = AwareDateTimeField(required=False, help_text="created at or after (with timezone)")
    until = AwareDateTimeField(required=False, help_text="created before (with timezone)")

    def validate(self, data):
        for key, value in data.items():
            if isinstance(value, str) and "\x00" in value:
                raise serializers.ValidationError({key: ["contains a NUL character"]})
        return data


# --- errors, for the schema ----------------------------------------------------------------------


class ErrorSerializer(serializers.Serializer):
    """Every error: ``detail`` says what went wrong; for bad input each field has its messages."""

    detail = serializers.CharField()
