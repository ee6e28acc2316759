"""The data model: workflows and their graph versions, schedules, runs, task runs, attempts,
workers and the scheduler lease.

Every state change of a run, task run or attempt is a guarded update
(``filter(id=…, state=<expected>).update(...)``) whose row count says whether this process won;
the constraints below make duplicates impossible rather than unlikely.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import Q

from orchestrator.counts import TaskRunCount  # noqa: F401 - the app's model, defined with its triggers
from orchestrator.dataset_models import (  # noqa: F401 - the datasets' tables, in a module of their own
    ConsumerRun,
    Dataset,
    DatasetEvent,
)
from orchestrator.people import (  # noqa: F401 - the app's models, defined in a module of their own
    Approval,
    Note,
    Notification,
    NotificationMessage,
    NotificationRule,
    UserPreference,
)
from orchestrator.run_days import RunDay  # noqa: F401 - the app's model, defined with its triggers
from orchestrator.secret_models import Secret  # noqa: F401 - the secrets store's table, in a module of its own
from orchestrator.states import (  # noqa: F401 - the state names, importable from here too
    ACTIVE_RUN_STATES,
    ACTIVE_TASK_STATES,
    BUSY_TASK_STATES,
    FAILED_TASK_STATES,
    FINISHED_RUN_STATES,
    FINISHED_TASK_STATES,
    LIVE_WORKER_STATES,
    AttemptOutcome,
    Catchup,
    Lane,
    Overlap,
    RunState,
    TaskState,
    Trigger,
    WorkerState,
)
from orchestrator.tenancy import TenantGrant  # noqa: F401 - the app's model, defined in a module of its own


class WorkflowQuerySet(models.QuerySet):
    def active(self):
        return self.filter(present=True)


class Workflow(models.Model):
    name = models.CharField(max_length=200, unique=True)
    module = models.CharField(max_length=300, blank=True)
    description = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True)
    owner = models.CharField(max_length=200, blank=True)
    tenant = models.CharField(max_length=200, default="default")
    max_active_runs = models.PositiveIntegerField(null=True, blank=True)
    webhooks = models.JSONField(default=list, blank=True, help_text="URLs called when a run ends.")
    paused = models.BooleanField(default=False)
    current_version = models.ForeignKey(
        "WorkflowVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # A workflow that was valid and is now broken keeps its last good version and says why.
    broken = models.BooleanField(default=False)
    sync_error = models.TextField(blank=True)
    # False once its module no longer defines it; its history stays.
    present = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    synced_at = models.DateTimeField(null=True, blank=True)

    objects = WorkflowQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def spec(self) -> dict:
        return self.current_version.spec if self.current_version_id else {}


class WorkflowVersion(models.Model):
    """One graph of a workflow: tasks, edges and options, identified by their hash."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    hash = models.CharField(max_length=64)
    spec = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["workflow", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "hash"], name="version_unique_hash"),
            models.UniqueConstraint(fields=["workflow", "number"], name="version_unique_number"),
        ]

    def __str__(self):
        return f"{self.workflow.name} v{self.number}"


class Schedule(models.Model):
    class Source(models.TextChoices):
        CODE = "code", "declared in code"
        ADMIN = "admin", "added in the admin"

    Catchup = Catchup
    Overlap = Overlap

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="schedules")
    name = models.CharField(max_length=100, default="default")
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.ADMIN)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, default="UTC")
    catchup = models.CharField(max_length=10, choices=Catchup.choices, default=Catchup.LATEST)
    max_catchup = models.PositiveIntegerField(
        null=True, blank=True, help_text="With catchup=all: at most this many missed runs; the rest are skipped."
    )
    overlap = models.CharField(max_length=12, choices=Overlap.choices, default=Overlap.ALLOW)
    start_deadline = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds after the fire time after which a run that has not started is missed."
    )
    jitter = models.PositiveIntegerField(default=0, help_text="Spread starts by up to this many seconds.")
    params = models.JSONField(default=dict, blank=True)
    paused = models.BooleanField(default=False)
    # The fire time (logical date) of the next run; the scheduler reads only due rows.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fire_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["workflow__name", "name"]
        constraints = [models.UniqueConstraint(fields=["workflow", "name"], name="schedule_unique_name")]
        indexes = [models.Index(fields=["next_fire_at"], condition=Q(paused=False), name="schedule_due")]

    def __str__(self):
        return f"{self.workflow.name}/{self.name} ({self.cron} {self.timezone})"


class Backfill(models.Model):
    class Reprocess(models.TextChoices):
        NONE = "none", "skip fire times that already have a run"
        FAILED = "failed", "re-run failed runs"
        ALL = "all", "re-run every existing run"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="backfills")
    schedule = models.ForeignKey(Schedule, null=True, blank=True, on_delete=models.SET_NULL)
    start = models.DateTimeField()
    end = models.DateTimeField()
    reprocess = models.CharField(max_length=10, choices=Reprocess.choices, default=Reprocess.NONE)
    params = models.JSONField(default=dict, blank=True)
    total = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self):
        return f"backfill {self.workflow.name} {self.start:%Y-%m-%d}..{self.end:%Y-%m-%d}"


class Run(models.Model):
    # No index of their own on the foreign keys: the indexes below lead with them, and only for
    # the rows that have one (a job's run has none), so a run's writes update fewer indexes.
    workflow = models.ForeignKey(Workflow, null=True, blank=True, on_delete=models.CASCADE, related_name="runs",
                                 db_index=False)
    version = models.ForeignKey(WorkflowVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="runs",
                                db_index=False)
    schedule = models.ForeignKey(Schedule, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs",
                                 db_index=False)
    backfill = models.ForeignKey(Backfill, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs",
                                 db_index=False)
    logical_date = models.DateTimeField()
    trigger = models.CharField(max_length=10, choices=Trigger.choices)
    params = models.JSONField(default=dict, blank=True)
    tenant = models.CharField(max_length=200, default="default")
    priority = models.IntegerField(default=0)
    lane = models.SmallIntegerField(choices=Lane.choices, default=Lane.LIVE)
    state = models.CharField(max_length=10, choices=RunState.choices, default=RunState.RUNNING)
    reason = models.TextField(blank=True, help_text="Why the run was skipped, missed, cancelled or timed out.")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL: no key, unique when set
    # sha256 of the request that created the run, to tell a retry from a conflicting reuse of a key.
    payload_hash = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   db_index=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Fire time to the start of the first task, in seconds.
    schedule_delay = models.FloatField(null=True, blank=True)
    # The workflow's deadline (logical date + deadline): a run not finished by then is late.
    deadline_at = models.DateTimeField(null=True, blank=True)
    deadline_missed_at = models.DateTimeField(null=True, blank=True)
    # The workflow's run timeout (start + run_timeout): a run still active then is cancelled.
    timeout_at = models.DateTimeField(null=True, blank=True)
    # The graph maps or branches: the resolver's mapping and branch steps apply to this run.
    dynamic = models.BooleanField(default=False, db_default=False)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "logical_date"], condition=Q(schedule__isnull=False),
                                    name="run_one_per_fire_time"),
            models.UniqueConstraint(
                fields=["idempotency_key"], condition=Q(idempotency_key__isnull=False), name="run_unique_idempotency_key"
            ),
        ]
        indexes = [
            # Partial (only runs that have one) wherever a column is empty for most runs: a job's
            # run then costs no entry in them, at its insert and at each of its updates.
            models.Index(fields=["workflow", "-id"], condition=Q(workflow__isnull=False), name="run_of_workflow"),
            # The workflow page's grid: a workflow's runs by logical date.
            models.Index(fields=["workflow", "-logical_date", "-id"], condition=Q(workflow__isnull=False),
                         name="run_of_workflow_by_date"),
            models.Index(fields=["version"], condition=Q(version__isnull=False), name="run_of_version"),
            models.Index(fields=["backfill"], condition=Q(backfill__isnull=False), name="run_of_backfill"),
            models.Index(fields=["created_by"], condition=Q(created_by__isnull=False), name="run_of_creator"),
            models.Index(fields=["state", "-id"], name="run_by_state"),
            # Admission (admission.py): a workflow's running runs, counted against its
            # max_active_runs, and its waiting runs in the order they start.
            models.Index(fields=["workflow"], condition=Q(state=RunState.RUNNING, workflow__isnull=False),
                         name="run_running_of_workflow"),
            models.Index(fields=["workflow", "lane", "id"], condition=Q(state=RunState.PENDING, workflow__isnull=False),
                         name="run_pending_of_workflow"),
            # Active runs of a schedule (overlap policies). Like the deadline and timeout indexes
            # below, only rows that can match: a job's run (no schedule, deadline or timeout) takes
            # no entry in them at its insert and at its start.
            models.Index(fields=["schedule", "state"], condition=Q(state__in=[*ACTIVE_RUN_STATES], schedule__isnull=False),
                         name="run_active_of_schedule"),
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False), name="run_finished_at"),
            # /metrics and the dashboard: the schedule delay of runs started in the last hour. A
            # BRIN index (a summary per range of pages; runs start roughly in the order they were
            # inserted): PostgreSQL 16 and later keep a run's start, which writes started_at, a
            # HOT update, where a B-tree on started_at gave it an index entry of its own.
            BrinIndex(fields=["started_at"], condition=Q(schedule_delay__isnull=False), name="run_schedule_delay"),
            # The runs list filters by trigger and by logical date and pages by id (keyset).
            models.Index(fields=["trigger", "-id"], name="run_by_trigger"),
            models.Index(fields=["logical_date"], name="run_by_logical_date"),
            # The scheduler's reads of active runs past their deadline or timeout.
            models.Index(fields=["deadline_at"], name="run_deadline_pending",
                         condition=Q(state__in=[*ACTIVE_RUN_STATES], deadline_missed_at__isnull=True,
                                     deadline_at__isnull=False)),
            models.Index(fields=["timeout_at"], name="run_timeout_pending",
                         condition=Q(state__in=[*ACTIVE_RUN_STATES], timeout_at__isnull=False)),
            # The dashboard's recent deadline misses.
            models.Index(fields=["deadline_missed_at"], name="run_deadline_missed",
                         condition=Q(deadline_missed_at__isnull=False)),
        ]

    def __str__(self):
        label = self.workflow.name if self.workflow_id else "job"
        return f"{label} #{self.pk}"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_RUN_STATES


class TaskRun(models.Model):
    # Found by run on taskrun_unique_task, which leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="task_runs", db_index=False)
    task = models.CharField(max_length=255)
    # -1: the task itself. A mapped task has that row (its summary: state "mapped", then the
    # list of results) plus one instance per item, numbered from 0.
    map_index = models.IntegerField(default=-1, db_default=-1)
    state = models.CharField(max_length=16, choices=TaskState.choices, default=TaskState.WAITING)
    # What to execute, copied from the graph version (or the job request) when the run is created,
    # so a worker needs no other row: {"kind": "python"|"shell", "ref"|"command", "args", "kwargs",
    # "timeout", "retry_delay", "retry_backoff", "retry_max_delay", "trigger_rule", "env"}.
    spec = models.JSONField(default=dict)
    upstream = ArrayField(models.CharField(max_length=255), default=list, blank=True)
    # Its children's names, so the resolver finds a finished task run's children by the unique
    # index, not by reading every waiting task run of the run. NULL: not known (made before).
    downstream = ArrayField(models.CharField(max_length=255), null=True, blank=True)
    queue = models.CharField(max_length=100, default="default")
    priority = models.IntegerField(default=0)
    tenant = models.CharField(max_length=200, default="default")
    lane = models.SmallIntegerField(choices=Lane.choices, default=Lane.LIVE)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    due_at = models.DateTimeField(null=True, blank=True)  # a sensor's next check while it is sensing
    timeout = models.FloatField(null=True, blank=True, help_text="Seconds before the attempt is killed.")
    # A sensor's checks (no attempts: one attempt spans its try) and its latest "not yet" answer.
    checks = models.PositiveIntegerField(default=0, db_default=0)
    last_answer = models.CharField(max_length=200, blank=True, default="", db_default="")
    # Looked up by worker only while running (taskrun_running): a full index would take an entry
    # at every change of state of every task run ever claimed. No constraint in the database:
    # its check at every claim read the worker's row and locked it (FOR KEY SHARE, a write to that
    # row) once per claimed job; workers are never deleted, and one that is unknown (the reaper
    # joins with LEFT JOIN) only means "no such worker any more".
    worker = models.ForeignKey("Worker", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                               db_index=False, db_constraint=False)
    result = models.JSONField(null=True, blank=True)
    # A mapped instance's item, copied from the mapped-over list when the instance is created, so
    # a claimed instance reads its own item and never the parent's whole list. NULL on the others.
    item = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["run", "task", "map_index"], name="taskrun_unique_task")]
        indexes = [
            # Due work in dispatch order (orchestrator.due): the distinct (queue, lane, tenant,
            # priority) of scheduled work, then each one's rows in due order; the next due time.
            models.Index(
                fields=["queue", "lane", "tenant", "priority", "due_at", "id"], condition=Q(state=TaskState.SCHEDULED),
                name="taskrun_due_by_queue",
            ),
            # The workers' read of admitted work: queued work of a queue by priority.
            models.Index(fields=["queue", "-priority", "id"], condition=Q(state=TaskState.QUEUED), name="taskrun_queued"),
            models.Index(fields=["queue", "tenant"], condition=Q(state__in=[*BUSY_TASK_STATES]), name="taskrun_busy"),
            models.Index(fields=["finished_at"], condition=Q(state=TaskState.DEAD), name="taskrun_dead"),
            # A worker's own running task runs (what it claimed but runs in no child, after an outage).
            models.Index(fields=["worker"], condition=Q(state=TaskState.RUNNING), name="taskrun_running"),
            # /metrics: task outcomes of the last minutes.
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False), name="taskrun_finished"),
            # A mapped task's active instances: every completion batch of a mapping run asks whether
            # any is left (mapping.FINISH_MAPPED), which must not read every instance. It asks from
            # the last index down: instances are claimed from the first, so the entries that ended
            # instances leave behind until a vacuum are not on its way.
            models.Index(fields=["run", "task", "map_index"],
                         condition=Q(map_index__gte=0, state__in=[*ACTIVE_TASK_STATES]),
                         name="taskrun_active_instances"),
            # A run's unfinished task runs. Whether any is left is one probe (resolver.FINISH_RUNS,
            # in every completion batch), and the resolver's steps read the run's unfinished tasks
            # (map_index -1: waiting children, mapped tasks) without the instances, whatever the
            # run's size.
            models.Index(fields=["run", "map_index"], condition=Q(state__in=[*ACTIVE_TASK_STATES]),
                         name="taskrun_unfinished"),
            # Approvals waiting for an answer, by their timeout (approvals.expire reads the due ones).
            models.Index(fields=["due_at"], condition=Q(state=TaskState.AWAITING), name="taskrun_awaiting"),
            # A run's tasks (its task runs but a mapped task's instances) in the order they were
            # created, a page at a time: the run page and its graph (reads.run_tasks).
            models.Index(fields=["run", "id"], condition=Q(map_index=-1), name="taskrun_tasks_of_run"),
            # A run's task runs of one state, by task and map index: the API's task-run pages and
            # the instances page filtered by state, and a run's counts by state (reads.run_counts),
            # read from the index alone.
            models.Index(fields=["run", "state", "task", "map_index"], name="taskrun_run_state"),
            # A task's failed task runs, by run: a clear of only failed ones over past or future runs
            # (clearing.SELECT_FAILED) reads the failures, not the history. Rows enter it only as
            # they fail, so the job path's writes of other states do not touch it.
            models.Index(fields=["task", "run"], condition=Q(state__in=[*FAILED_TASK_STATES]), name="taskrun_failed"),
            # Waiting sensors of a queue by their next check (the workers' check claim, worker.batch).
            models.Index(fields=["queue", "due_at"], condition=Q(state=TaskState.SENSING), name="taskrun_sensing"),
            # Mapped tasks whose instances run: the reaper settles those whose instances all ended
            # where the worker that ended the last ones died before settling (reaper.SETTLE_MAPS).
            models.Index(fields=["run"], condition=Q(state=TaskState.MAPPED, map_index=-1), name="taskrun_mapped"),
        ]

    def __str__(self):
        return f"{self.task} of run #{self.run_id}"


class DeadTaskRunManager(models.Manager):
    def get_queryset(self):
        return super().get_queryset().filter(state=TaskState.DEAD)


class DeadTaskRun(TaskRun):
    """The dead-letter queue as its own admin page: task runs that used every attempt."""

    objects = DeadTaskRunManager()

    class Meta:
        proxy = True
        verbose_name = "dead-letter task run"
        verbose_name_plural = "dead-letter queue"


class Attempt(models.Model):
    # Found by task run on attempt_unique_number, which leads with it. The running ones are found
    # from their task runs (taskrun_running): no B-tree here names the outcome or the end time,
    # which change when an attempt ends, so that update is a HOT update (fill factor 70, see
    # migration 0029) that writes no index.
    task_run = models.ForeignKey(TaskRun, on_delete=models.CASCADE, related_name="attempt_set", db_index=False)
    number = models.PositiveIntegerField()
    # No constraint in the database, as TaskRun.worker (the same check at every claim).
    worker = models.ForeignKey("Worker", null=True, blank=True, on_delete=models.SET_NULL, related_name="attempts",
                               db_index=False, db_constraint=False)
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices, default=AttemptOutcome.RUNNING)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    # The dotted path of the exception's class, taken from the exception object itself (empty when
    # the attempt ended without one: timed out, lost, cancelled). A database default, so that the
    # workers' inserts, and those of a version still running during an upgrade, need not name it.
    exception_class = models.CharField(max_length=300, blank=True, default="", db_default="")
    log_path = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["task_run", "number"]
        constraints = [models.UniqueConstraint(fields=["task_run", "number"], name="attempt_unique_number")]
        indexes = [
            # /metrics: attempts the reaper ended recently. BRIN, as run_schedule_delay: attempts
            # end roughly in the order they were inserted, and it leaves the end a HOT update.
            BrinIndex(fields=["finished_at"], condition=Q(outcome__in=[AttemptOutcome.LOST, AttemptOutcome.TIMED_OUT]),
                      name="attempt_reaped"),
        ]

    def __str__(self):
        return f"attempt {self.number} of {self.task_run}"

    @property
    def duration(self):
        if self.finished_at and self.started_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class Worker(models.Model):
    State = WorkerState

    name = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    queues = ArrayField(models.CharField(max_length=100), default=list)
    concurrency = models.PositiveIntegerField(default=1)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-heartbeat_at"]
        indexes = [models.Index(fields=["heartbeat_at"], condition=Q(state__in=[*LIVE_WORKER_STATES]), name="worker_live")]

    def __str__(self):
        return self.name


class Lease(models.Model):
    """A named lease (the scheduler's leadership). Times come from the database clock."""

    name = models.CharField(max_length=100, primary_key=True)
    holder = models.CharField(max_length=200)
    epoch = models.BigIntegerField(default=0)
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    def __str__(self):
        return f"{self.name} held by {self.holder} (epoch {self.epoch})"


class CodeGeneration(models.Model):
    """One row counting the syncs of the project's code: every ``sync_workflows`` bumps it, and
    a worker that reads a new value (NOTIFY on ``orchestrator_code``, or with its heartbeat)
    replaces its children, so they run the code now on disk (see ``orchestrator.reload``)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    generation = models.BigIntegerField(default=0)
    changed_at = models.DateTimeField()

    def __str__(self):
        return f"code generation {self.generation}"


class QueueLimit(models.Model):
    queue = models.CharField(max_length=100, unique=True)
    max_running = models.PositiveIntegerField(help_text="At most this many task runs queued or running at once.")

    def __str__(self):
        return f"{self.queue}: {self.max_running}"


class TenantLimit(models.Model):
    tenant = models.CharField(max_length=200, unique=True)
    max_running = models.PositiveIntegerField(help_text="At most this many task runs queued or running at once.")

    def __str__(self):
        return f"{self.tenant}: {self.max_running}"


class WebhookDelivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="webhook_deliveries")
    url = models.URLField(max_length=500)
    event = models.CharField(max_length=30)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"

    def __str__(self):
        return f"{self.event} webhook to {self.url} for run #{self.run_id}"


class AuditEvent(models.Model):
    """One operator action: who did what to which object, when, and from where.

    Never deleted by retention, and tied to nothing that retention deletes: the target is named
    by type and id, not by a foreign key, so the record outlives the run it is about."""

    class Source(models.TextChoices):
        UI = "ui", "web UI"
        API = "api", "API"
        ADMIN = "admin", "admin"
        CLI = "cli", "command line"
        TASK = "task", "a task"  # a task run's read of a secret

    at = models.DateTimeField()
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    # The user name at the time, kept when the user is deleted.
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=50)
    source = models.CharField(max_length=10, choices=Source.choices)
    ip = models.GenericIPAddressField(null=True, blank=True)
    target_type = models.CharField(max_length=50, blank=True)
    target_id = models.CharField(max_length=255, blank=True)
    target_label = models.CharField(max_length=300, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    # The target's tenant and workflow when it has them: a tenant's operators read its records.
    tenant = models.CharField(max_length=200, blank=True, default="", db_default="")
    workflow = models.CharField(max_length=200, blank=True, default="", db_default="")

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The audit page and API page by id, filtered by action, actor or target.
            models.Index(fields=["action", "-id"], name="audit_by_action"),
            models.Index(fields=["actor_name", "-id"], name="audit_by_actor"),
            models.Index(fields=["target_type", "target_id", "-id"], name="audit_by_target"),
            models.Index(fields=["at"], name="audit_by_time"),
        ]

    def __str__(self):
        return f"{self.actor_name or 'system'} {self.action} {self.target_type} {self.target_id} ({self.source})"
