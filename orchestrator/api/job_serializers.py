"""The API's job serializers: what ``POST /api/jobs/`` takes and what the job endpoints answer (a
job is a run of one task; its serializer flattens the two)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from orchestrator.api.fields import (
    AwareDateTimeField,
    IdempotencyKeyField,
    JSONListField,
    JSONObjectField,
    Number,
    TextMatching,
    WholeNumber,
)
from orchestrator.api.result_fields import STORED_RESULT_HELP, listed_result
from orchestrator.limits import (
    MAX_ATTEMPTS,
    MAX_REF_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE,
    QUEUE_RE,
    REF_RE,
    REF_RULE,
)
from orchestrator.models import Run
from orchestrator.states import TaskState

PRIORITY_RANGE = (PRIORITY_MIN, PRIORITY_MAX)
_DATETIME = serializers.DateTimeField()  # a model's datetime as the API writes it


class JobRequestSerializer(serializers.Serializer):
    ref = TextMatching(REF_RE.pattern, max_length=MAX_REF_LENGTH,
                       error_messages={"invalid": f"{REF_RULE}, e.g. 'myapp.jobs:send_welcome_email'"},
                       help_text='The registered function to call, "package.module:function" (a @job function, a '
                                 'django.tasks task or a workflow task); any other reference is refused.')
    args = JSONListField(required=False, default=list)
    kwargs = JSONObjectField(required=False, default=dict)
    run_after = AwareDateTimeField(required=False, allow_null=True, default=None,
                                   help_text="Not before this time (with timezone); now when omitted.")
    queue = TextMatching(QUEUE_RE.pattern, max_length=QUEUE, required=False, default="default")
    priority = WholeNumber(required=False, default=0, min_value=PRIORITY_RANGE[0], max_value=PRIORITY_RANGE[1])
    max_attempts = WholeNumber(required=False, default=1, min_value=1, max_value=MAX_ATTEMPTS)
    timeout = Number(required=False, allow_null=True, default=None, min_value=0.001, max_value=7 * 24 * 3600,
                     help_text="seconds before the attempt is killed")
    idempotency_key = IdempotencyKeyField()


class JobSerializer(serializers.ModelSerializer):
    """A job is a run of one task; this flattens the two."""

    ref = serializers.SerializerMethodField()
    args = serializers.SerializerMethodField()
    kwargs = serializers.SerializerMethodField()
    run_state = serializers.CharField(source="state")
    state = serializers.SerializerMethodField(help_text="the state of the job's task run")
    queue = serializers.SerializerMethodField()
    due_at = serializers.SerializerMethodField()
    attempts = serializers.SerializerMethodField()
    max_attempts = serializers.SerializerMethodField()
    result = serializers.SerializerMethodField(help_text=STORED_RESULT_HELP)
    error = serializers.SerializerMethodField()
    task_run = serializers.SerializerMethodField()
    started_at = serializers.SerializerMethodField(
        help_text="when it started: its run's start, or, while its worker has not written that yet (at most "
                  "0.2 s after its claim), its running task run's")

    class Meta:
        model = Run
        fields = ["id", "ref", "args", "kwargs", "state", "run_state", "queue", "priority", "due_at", "attempts",
                  "max_attempts", "result", "error", "idempotency_key", "task_run", "created_at", "started_at",
                  "finished_at"]

    @staticmethod
    def _task_run(run):
        cached = getattr(run, "_job_task_run", None)
        if cached is None:
            cached = next(iter(run.task_runs.all()), None)  # prefetched by the views: no query per job
            run._job_task_run = cached
        return cached

    def get_ref(self, run) -> str:
        task_run = self._task_run(run)
        return task_run.spec.get("ref", "") if task_run else ""

    @extend_schema_field({"type": "array", "items": {}})
    def get_args(self, run):
        task_run = self._task_run(run)
        return task_run.spec.get("args", []) if task_run else []

    @extend_schema_field({"type": "object", "additionalProperties": True})
    def get_kwargs(self, run):
        task_run = self._task_run(run)
        return task_run.spec.get("kwargs", {}) if task_run else {}

    @extend_schema_field(serializers.ChoiceField(choices=TaskState.choices))
    def get_state(self, run):
        task_run = self._task_run(run)
        return task_run.state if task_run else run.state

    def get_queue(self, run) -> str:
        task_run = self._task_run(run)
        return task_run.queue if task_run else "default"

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_due_at(self, run):
        task_run = self._task_run(run)
        return task_run.due_at.isoformat() if task_run and task_run.due_at else None

    def get_attempts(self, run) -> int:
        task_run = self._task_run(run)
        return task_run.attempts if task_run else 0

    def get_max_attempts(self, run) -> int:
        task_run = self._task_run(run)
        return task_run.max_attempts if task_run else 1

    @extend_schema_field(OpenApiTypes.ANY)
    def get_result(self, run):
        # Kept in the log storage: its size and URL, never the value (a page of jobs stays small).
        task_run = self._task_run(run)
        return listed_result(task_run.result) if task_run else None

    def get_error(self, run) -> str:
        task_run = self._task_run(run)
        return task_run.error if task_run else ""

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_started_at(self, run):
        started = run.started_at
        if started is None:
            task_run = self._task_run(run)
            started = task_run.started_at if task_run and task_run.state == TaskState.RUNNING else None
        return _DATETIME.to_representation(started) if started else None

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_task_run(self, run):
        task_run = self._task_run(run)
        return task_run.pk if task_run else None
