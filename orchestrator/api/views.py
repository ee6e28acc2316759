"""The REST API: workflows, runs, task runs and their logs, jobs, the dead-letter queue and
backfills. Views only translate HTTP to the product's functions (``runs.trigger_workflow``,
``jobs.enqueue``, ``control.*``, ``backfill.*``, ``logs.read``), so the API,
the web UI and the admin behave the same."""

from __future__ import annotations

from django.db.models import Prefetch
from django.urls import reverse
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from orchestrator import access, audit, clock, control, jobs, logs, reads
from orchestrator import backfill as backfills
from orchestrator.api import job_serializers as js
from orchestrator.api import serializers as s
from orchestrator.api.base import (
    IDEMPOTENCY_400,
    IDEMPOTENCY_HEADER,
    APIBase,
    body,
    errors,
    filter_workflow,
    get_run,
    get_workflow,
    idempotency_key,
    paginated_schema,
    validated,
)
from orchestrator.api.errors import field_errors
from orchestrator.api.parsing import (
    CURSOR,
    LIMIT,
    RUN_TASK_RUN_CURSOR,
    TIME_CURSOR,
    DeadLetterPagination,
    RunTaskRunPagination,
    validated_query,
)
from orchestrator.api.permissions import TenantOperators
from orchestrator.api.schema import extend_schema
from orchestrator.models import (
    Attempt,
    AuditEvent,
    Backfill,
    ConsumerRun,
    Dataset,
    DatasetEvent,
    Run,
    Schedule,
    TaskRun,
    Workflow,
)
from orchestrator.params import clean_params
from orchestrator.runs import trigger_workflow
from orchestrator.states import Trigger

# --- workflows ------------------------------------------------------------------------------------


class WorkflowListView(APIBase):
    @extend_schema(tags=["workflows"], operation_id="workflows_list", summary="List workflows", responses={200: s.WorkflowSerializer(many=True),
                                                                             **errors(401, 403)})
    def get(self, request):
        workflows = access.visible(request.user, Workflow.objects.select_related("current_version")).order_by("name")
        return Response(s.WorkflowSerializer(workflows, many=True).data)


def workflow_detail(workflow: Workflow) -> dict:
    schedules = Schedule.objects.filter(workflow=workflow).order_by("name")
    workflow._prefetched_objects_cache = {"schedules": schedules}
    return s.WorkflowDetailSerializer(workflow, context={"now": clock.now()}).data


class WorkflowDetailView(APIBase):
    @extend_schema(tags=["workflows"], summary="A workflow: graph, params, schedules with next fire times",
                   responses={200: s.WorkflowDetailSerializer, **errors(401, 403, 404)})
    def get(self, request, name):
        return Response(workflow_detail(get_workflow(name, request.user)))


class WorkflowPauseView(APIBase):
    @extend_schema(tags=["workflows"], summary="Pause a workflow: its schedules stop creating runs",
                   request=None, responses={200: s.WorkflowDetailSerializer, **errors(401, 403, 404)})
    def post(self, request, name):
        workflow = get_workflow(name, request.user)
        access.require_operate(request.user, workflow)
        control.pause_workflow(workflow)
        audit.record("pause", request=request, target=workflow)
        workflow.refresh_from_db()
        return Response(workflow_detail(workflow))


class WorkflowResumeView(APIBase):
    @extend_schema(tags=["workflows"], summary="Resume a paused workflow",
                   request=None, responses={200: s.WorkflowDetailSerializer, **errors(401, 403, 404)})
    def post(self, request, name):
        workflow = get_workflow(name, request.user)
        access.require_operate(request.user, workflow)
        control.resume_workflow(workflow)
        audit.record("resume", request=request, target=workflow)
        workflow.refresh_from_db()
        return Response(workflow_detail(workflow))


# --- runs -----------------------------------------------------------------------------------------


def filtered_runs(request, workflow=reads.ANY):
    """The runs a list's query asks for (``reads.runs``); ``workflow`` the id of the one in the path."""
    filters = validated_query(s.RunFilterSerializer, request.query_params)
    if workflow is reads.ANY and "workflow" in filters:
        workflow = filter_workflow(filters["workflow"], request.user)
    return access.visible(request.user, reads.runs(
        workflow=workflow, state=filters.get("state"), trigger=filters.get("trigger"),
        logical_from=filters.get("logical_after"), logical_before=filters.get("logical_before"),
        created_from=filters.get("created_after"), created_before=filters.get("created_before"),
    )).select_related("workflow", "version", "schedule", "created_by")


def run_detail(run: Run) -> dict:
    return s.RunDetailSerializer(run).data


class RunListView(APIBase):
    @extend_schema(tags=["runs"], operation_id="runs_list", summary="List runs, newest first (cursor pagination)",
                   parameters=[s.RunFilterSerializer, CURSOR, LIMIT],
                   responses={200: paginated_schema(s.RunSerializer), **errors(400, 401, 403, 404)})
    def get(self, request):
        return self.page(filtered_runs(request), s.RunSerializer)


class WorkflowRunsView(APIBase):
    @extend_schema(tags=["runs"], operation_id="workflows_runs_list", summary="List the runs of one workflow",
                   parameters=[s.RunFilterSerializer, CURSOR, LIMIT],
                   responses={200: paginated_schema(s.RunSerializer), **errors(400, 401, 403, 404)})
    def get(self, request, name):
        return self.page(filtered_runs(request, get_workflow(name, request.user).pk), s.RunSerializer)

    @extend_schema(
        tags=["runs"], summary="Trigger a run",
        description="Params are checked against the workflow's declared params. With an idempotency key "
                    "(field or Idempotency-Key header) a retry returns the run it created (200).",
        request=s.TriggerSerializer, parameters=[IDEMPOTENCY_HEADER],
        responses={201: s.RunDetailSerializer, 200: s.RunDetailSerializer,
                   **errors(400, 401, 403, 404, 409, bad_input=IDEMPOTENCY_400)},
    )
    def post(self, request, name):
        workflow = get_workflow(name, request.user)
        access.require_operate(request.user, workflow)
        data = validated(s.TriggerSerializer, body(request))
        key = idempotency_key(request, data)
        run, created = trigger_workflow(
            workflow, data["params"], trigger=Trigger.API, created_by=request.user, idempotency_key=key,
            logical_date=data["logical_date"], priority=data["priority"],
        )
        if created:
            audit.record("trigger", request=request, target=run, workflow=workflow.name, params=data["params"])
        run = get_run(run.pk, request.user)
        headers = {"Location": reverse("orchestrator:api:run", args=[run.pk])}
        return Response(run_detail(run), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                        headers=headers)


class RunDetailView(APIBase):
    @extend_schema(tags=["runs"], summary="A run with its tasks' and its mapped tasks' instances' counts by state",
                   responses={200: s.RunDetailSerializer, **errors(401, 403, 404)})
    def get(self, request, pk):
        return Response(run_detail(get_run(pk, request.user)))


class RunTaskRunsView(APIBase):
    @extend_schema(tags=["runs"], operation_id="runs_task_runs_list",
                   summary="A run's task runs, a page at a time, by task and map index",
                   description="Every task run of the run, a mapped task's instances too, ordered by task name "
                               "and map index; filtered by task and state. Pages go forward only (`next`; "
                               "`previous` is always null). The run's counts are in the run itself.",
                   parameters=[s.RunTaskRunFilterSerializer, RUN_TASK_RUN_CURSOR, LIMIT],
                   responses={200: paginated_schema(s.RunTaskRunSerializer), **errors(400, 401, 403, 404)})
    def get(self, request, pk):
        filters = validated_query(s.RunTaskRunFilterSerializer, request.query_params)
        run = get_run(pk, request.user)
        paginator = RunTaskRunPagination(run.pk, filters.get("task"), filters.get("state"))
        rows = paginator.paginate_queryset(TaskRun.objects.filter(run_id=run.pk), request, view=self)
        return paginator.get_paginated_response(s.RunTaskRunSerializer(rows, many=True).data)


class RunCancelView(APIBase):
    @extend_schema(tags=["runs"], summary="Cancel a run: its unfinished task runs are cancelled",
                   request=s.CancelSerializer, responses={200: s.CancelResultSerializer, **errors(400, 401, 403, 404)})
    def post(self, request, pk):
        run = get_run(pk, request.user)
        access.require_operate(request.user, run)
        data = validated(s.CancelSerializer, body(request))
        cancelled = control.cancel_run(run, reason=data["reason"], by=request.user)
        audit.record("cancel", request=request, target=run, reason=data["reason"], changed=bool(cancelled))
        return Response({"cancelled": bool(cancelled), "run": s.RunSerializer(get_run(pk, request.user)).data})


class RunRetryView(APIBase):
    @extend_schema(tags=["runs"], summary="Retry every dead, failed or upstream-failed task run of a run",
                   request=None, responses={200: s.RunRetriedSerializer, **errors(401, 403, 404)})
    def post(self, request, pk):
        run = get_run(pk, request.user)
        access.require_operate(request.user, run)
        retried = control.retry_run(run)
        audit.record("retry", request=request, target=run, changed=retried)
        return Response({"retried": retried, "run": s.RunSerializer(get_run(pk, request.user)).data})


# --- task runs and logs -----------------------------------------------------------------------------


class TaskRunDetailView(APIBase):
    @extend_schema(tags=["runs"], summary="A task run with its attempts",
                   responses={200: s.TaskRunDetailSerializer, **errors(401, 403, 404)})
    def get(self, request, pk):
        return Response(s.TaskRunDetailSerializer(get_task_run(pk, request.user)).data)


def get_task_run(pk: int, user) -> TaskRun:
    """The task run ``pk`` with its attempts, that ``user`` may read, or a 404. Its result as the
    pages list it (reads.listed_result): a mapped task's own, every instance's result, is not read."""
    task_run = (reads.listed_result(access.visible(user, TaskRun.objects.select_related("run__workflow")))
                .prefetch_related(Prefetch("attempt_set", Attempt.objects.select_related("worker")))
                .filter(pk=pk).first())
    if task_run is None:
        raise NotFound(f"no task run {pk}")
    return task_run


def names_of(task_run: TaskRun) -> dict:
    """An audit record's names for a task run: its workflow, task and run."""
    return {"workflow": task_run.run.workflow.name if task_run.run.workflow_id else "", "task": task_run.task,
            "run": task_run.run_id}


class TaskRunRetryView(APIBase):
    @extend_schema(tags=["runs"], summary="Retry a dead or failed task run: it gets a fresh set of attempts",
                   request=None, responses={200: s.TaskRunActionSerializer, **errors(401, 403, 404)})
    def post(self, request, pk):
        task_run = get_task_run(pk, request.user)
        access.require_operate(request.user, task_run)
        changed = [pk] if control.retry_task_runs([pk]) else []
        audit.record("retry", request=request, target=task_run, changed=len(changed), **names_of(task_run))
        return Response({"changed": changed, "task_run": s.TaskRunDetailSerializer(get_task_run(pk, request.user)).data})


class TaskRunMarkView(APIBase):
    @extend_schema(tags=["runs"], summary="Mark a task run succeeded or failed; its downstream follows its rules",
                   request=s.MarkSerializer, responses={200: s.TaskRunActionSerializer, **errors(400, 401, 403, 404)})
    def post(self, request, pk):
        task_run = get_task_run(pk, request.user)
        access.require_operate(request.user, task_run)
        was = task_run.state
        data = validated(s.MarkSerializer, body(request))
        changed = control.mark_task_runs([pk], data["state"], by=request.user)
        audit.record("mark", request=request, target=task_run, state=data["state"], changed=changed,
                     was=was, **names_of(task_run))
        return Response({"changed": changed, "task_run": s.TaskRunDetailSerializer(get_task_run(pk, request.user)).data})


class AttemptLogView(APIBase):
    @extend_schema(tags=["runs"], summary="The log of an attempt, one page of text at a time",
                   description="Read from `offset` up to `limit` bytes; continue at `next_offset` until `eof`.",
                   parameters=[s.LogQuerySerializer],
                   responses={200: s.LogPageSerializer, **errors(400, 401, 403, 404)})
    def get(self, request, pk, number):
        query = validated_query(s.LogQuerySerializer, request.query_params)
        attempt = access.visible(request.user, Attempt.objects.filter(task_run_id=pk, number=number)).first()
        if attempt is None:
            raise NotFound(f"task run {pk} has no attempt {number}")
        text, next_offset, eof = logs.read(attempt, query["offset"], query["limit"])
        return Response({"text": text, "next_offset": next_offset, "eof": eof})


# --- jobs -----------------------------------------------------------------------------------------


# POST /api/jobs/ with a list: the most jobs one request enqueues (one statement, one response).
MAX_JOBS_PER_REQUEST = 1000


def jobs_queryset():
    return Run.objects.filter(trigger=Trigger.JOB, workflow__isnull=True).prefetch_related("task_runs")


def job_data(run: Run) -> dict:
    return js.JobSerializer(run).data


class JobListView(APIBase):
    @extend_schema(tags=["jobs"], operation_id="jobs_list", summary="List jobs, newest first (cursor pagination)",
                   parameters=[CURSOR, LIMIT],
                   responses={200: paginated_schema(js.JobSerializer), **errors(400, 401, 403)})
    def get(self, request):
        return self.page(access.visible(request.user, jobs_queryset()), js.JobSerializer)

    @extend_schema(
        tags=["jobs"], summary="Enqueue a one-off or delayed job (or a list of them)",
        description="Calls `ref` (`package.module:function`, a function the project registered: `@job`, a "
                    "`django.tasks` task or a workflow task) with `args` and `kwargs` on a worker of `queue`, "
                    "not before `run_after`; an unregistered ref is a 400. Jobs run at least once: make them "
                    "idempotent. A JSON list of such objects (1 to 1000, each with its own `idempotency_key`) "
                    "enqueues them all or none, and answers the list of jobs in the same order; errors are "
                    "keyed `jobs[i].field`.",
        request=js.JobRequestSerializer, parameters=[IDEMPOTENCY_HEADER],
        responses={201: js.JobSerializer, 200: js.JobSerializer, **errors(400, 401, 403, 409, bad_input=IDEMPOTENCY_400)},
    )
    def post(self, request):
        # A job runs in the default tenant: its operators (and global ones) enqueue.
        access.require_operate_tenant(request.user, access.JOB_TENANT)
        if isinstance(request.data, list):
            return self.post_many(request, request.data)
        data = validated(js.JobRequestSerializer, body(request))
        key = idempotency_key(request, data)
        # JobError (a RunError naming its field) and IdempotencyConflict become 400 and 409 in
        # orchestrator.api.errors.
        run, created = jobs.enqueue(
            data["ref"], args=data["args"], kwargs=data["kwargs"], run_after=data["run_after"],
            queue=data["queue"], priority=data["priority"], idempotency_key=key,
            max_attempts=data["max_attempts"], timeout=data["timeout"], created_by=request.user,
        )
        if created:
            audit.record("enqueue", request=request, target=run, ref=data["ref"], queue=data["queue"])
        run = jobs_queryset().get(pk=run.pk)
        return Response(job_data(run), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                        headers={"Location": reverse("orchestrator:api:job", args=[run.pk])})


    def post_many(self, request, items: list):
        """A JSON list of jobs: each item checked (errors keyed ``jobs[i].field``), then the batch
        enqueued by ``jobs.enqueue_many`` (one statement), all or nothing; 201 when any job was
        created, else 200 (every item's idempotency key named a stored job)."""
        if request.headers.get("Idempotency-Key") is not None:
            raise ValidationError({"idempotency_key": ["a list of jobs takes no Idempotency-Key header: give each "
                                                       "job its own idempotency_key"]})
        if not items or len(items) > MAX_JOBS_PER_REQUEST:
            raise ValidationError({"non_field_errors": [
                f"a list of jobs holds 1 to {MAX_JOBS_PER_REQUEST} jobs, got {len(items)}"]})
        results = jobs.enqueue_many(checked_jobs(items), created_by=request.user)
        created = [run.pk for run, was_created in results if was_created]
        if created:
            audit.record_each("enqueue", "run", created, request=request, jobs=len(created))
        found = jobs_queryset().in_bulk([run.pk for run, _ in results])
        return Response([job_data(found[run.pk]) for run, _ in results],
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def checked_jobs(items: list) -> list[dict]:
    """Each item of a list of jobs checked by the request serializer: enqueue_many's items, or
    a 400 with every item's errors keyed ``jobs[i].field``."""
    problems, checked = {}, []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            problems[f"jobs[{index}]"] = [f"expected a JSON object, got {type(item).__name__}"]
            continue
        serializer = js.JobRequestSerializer(data=item)
        if not serializer.is_valid():
            problems.update({f"jobs[{index}].{field}": messages for field, messages in serializer.errors.items()})
            continue
        data = serializer.validated_data
        checked.append({"ref": data["ref"], "args": data["args"], "kwargs": data["kwargs"],
                        "run_after": data["run_after"], "queue": data["queue"], "priority": data["priority"],
                        "idempotency_key": data.get("idempotency_key") or None,
                        "max_attempts": data["max_attempts"], "timeout": data["timeout"]})
    if problems:
        raise ValidationError(problems)
    return checked


class JobDetailView(APIBase):
    @extend_schema(tags=["jobs"], summary="A job's state and result",
                   responses={200: js.JobSerializer, **errors(401, 403, 404)})
    def get(self, request, pk):
        run = access.visible(request.user, jobs_queryset()).filter(pk=pk).first()
        if run is None:
            raise NotFound(f"no job {pk}")
        return Response(job_data(run))


# --- dead-letter queue ----------------------------------------------------------------------------


class DeadLetterListView(APIBase):
    @extend_schema(tags=["dead-letter queue"], operation_id="dlq_list", summary="Task runs that used every attempt, last failed first",
                   parameters=[s.DeadLetterFilterSerializer, TIME_CURSOR, LIMIT],
                   responses={200: paginated_schema(s.DeadTaskRunSerializer), **errors(400, 401, 403, 404)})
    def get(self, request):
        filters = validated_query(s.DeadLetterFilterSerializer, request.query_params)
        workflow = filter_workflow(filters["workflow"], request.user) if "workflow" in filters else reads.ANY
        dead = access.visible(request.user, reads.dead_letters(workflow=workflow, queue=filters.get("queue"))
                              ).select_related("run__workflow")
        return self.page(dead, s.DeadTaskRunSerializer, DeadLetterPagination)


def own_task_runs(request, ids: list[int]) -> list[int]:
    """The ids of a bulk action that this user acts on: another tenant's task run counts as one
    that does not exist (it is not changed); one the user reads but may not act on is a 403."""
    ids = sorted(set(ids))
    if access.operating(request.user).everything:
        return ids
    rows = list(access.visible(request.user, TaskRun.objects.filter(pk__in=ids).select_related("run__workflow")))
    for row in rows:
        access.require_operate(request.user, row)
    return sorted(row.pk for row in rows)


class DeadLetterRetryView(APIBase):
    @extend_schema(tags=["dead-letter queue"], summary="Retry task runs: each gets a fresh attempt",
                   request=s.TaskRunIdsSerializer, responses={200: s.RetriedSerializer, **errors(400, 401, 403)})
    def post(self, request):
        ids = own_task_runs(request, validated(s.TaskRunIdsSerializer, body(request))["ids"])
        retried = control.retry_task_runs(ids)
        audit.record_each("retry", "taskrun", ids, request=request, changed=retried)
        return Response({"requested": len(ids), "retried": retried})


class DeadLetterDiscardView(APIBase):
    @extend_schema(tags=["dead-letter queue"], summary="Discard task runs: they fail and leave the queue",
                   request=s.TaskRunIdsSerializer, responses={200: s.DiscardedSerializer, **errors(400, 401, 403)})
    def post(self, request):
        ids = own_task_runs(request, validated(s.TaskRunIdsSerializer, body(request))["ids"])
        discarded = control.discard_task_runs(ids)
        audit.record_each("discard", "taskrun", ids, request=request, changed=discarded)
        return Response({"requested": len(ids), "discarded": discarded})


# --- backfills ------------------------------------------------------------------------------------


def backfills_queryset():
    return Backfill.objects.select_related("workflow", "schedule")


class BackfillListView(APIBase):
    @extend_schema(tags=["backfills"], operation_id="backfills_list", summary="List backfills, newest first",
                   parameters=[CURSOR, LIMIT],
                   responses={200: paginated_schema(s.BackfillSerializer), **errors(400, 401, 403)})
    def get(self, request):
        return self.page(access.visible(request.user, backfills_queryset()), s.BackfillSerializer)

    @extend_schema(
        tags=["backfills"], summary="Backfill a date range, or preview it with dry_run",
        description="Creates one run per fire time of the schedule between start and end (inclusive). "
                    "With `dry_run` nothing is created: the answer lists the fire times and counts.",
        request=s.BackfillRequestSerializer,
        responses={201: s.BackfillSerializer, 200: s.BackfillPlanSerializer, **errors(400, 401, 403)},
    )
    def post(self, request):
        data = validated(s.BackfillRequestSerializer, body(request))
        workflow = access.visible(request.user, Workflow.objects.select_related("current_version")).filter(
            name=data["workflow"]).first()
        if workflow is None:
            raise ValidationError({"workflow": [f"unknown workflow {data['workflow']!r}"]})
        access.require_operate(request.user, workflow)
        where = {"schedule": data["schedule"]} if data["cron"] is None else {"expr": data["cron"],
                                                                             "timezone": data["timezone"]}
        try:
            plan = backfills.plan(workflow, data["start"], data["end"], reprocess=data["reprocess"], **where)
        except backfills.BackfillError as exc:
            raise ValidationError(field_errors(exc.field, str(exc))) from None
        # Checked before anything is written, with one message per param (as a trigger's are).
        schedule_params = plan.schedule.params if plan.schedule else {}
        clean_params(workflow.spec.get("params", {}), {**schedule_params, **data["params"]})
        if data["dry_run"]:
            return Response({
                "dry_run": True, "workflow": workflow.name, "schedule": plan.schedule.name if plan.schedule else None,
                "cron": plan.cron, "timezone": plan.timezone, "count": plan.count, "existing": len(plan.existing),
                "to_create": len(plan.to_create), "to_reprocess": len(plan.to_reprocess),
                "fire_times": [at.isoformat() for at in plan.fire_times],
            })
        try:
            backfill = backfills.start(workflow, data["start"], data["end"], reprocess=data["reprocess"],
                                       params=data["params"], created_by=request.user, **where)
        except backfills.BackfillError as exc:
            raise ValidationError(field_errors(exc.field, str(exc))) from None
        audit.record("backfill", request=request, target=backfill, workflow=workflow.name,
                     start=data["start"].isoformat(), end=data["end"].isoformat(), runs=backfill.total)
        backfill = backfills_queryset().get(pk=backfill.pk)
        return Response(s.BackfillSerializer(backfill).data, status=status.HTTP_201_CREATED,
                        headers={"Location": reverse("orchestrator:api:backfill", args=[backfill.pk])})


class BackfillDetailView(APIBase):
    @extend_schema(tags=["backfills"], summary="A backfill and its progress",
                   responses={200: s.BackfillSerializer, **errors(401, 403, 404)})
    def get(self, request, pk):
        backfill = access.visible(request.user, backfills_queryset()).filter(pk=pk).first()
        if backfill is None:
            raise NotFound(f"no backfill {pk}")
        return Response(s.BackfillSerializer(backfill).data)


# --- audit log ------------------------------------------------------------------------------------


class AuditListView(APIBase):
    permission_classes = [TenantOperators]

    @extend_schema(tags=["audit"], operation_id="audit_list", summary="The audit log: operator actions, newest first",
                   description="Who did what, when, to which object and from where (UI, API, admin or command "
                               "line, and the IP address). Operators only (an operator of some tenants reads "
                               "their objects' records). Retention never deletes these.",
                   parameters=[s.AuditFilterSerializer, CURSOR, LIMIT],
                   responses={200: paginated_schema(s.AuditEventSerializer), **errors(400, 401, 403)})
    def get(self, request):
        filters = validated_query(s.AuditFilterSerializer, request.query_params)
        events = access.operable(request.user, AuditEvent.objects.all())
        for key, lookup in [("action", "action"), ("actor", "actor_name"), ("source", "source"),
                            ("target_type", "target_type"), ("target_id", "target_id"), ("since", "at__gte"),
                            ("until", "at__lt")]:
            if key in filters:
                events = events.filter(**{lookup: filters[key]})
        return self.page(events, s.AuditEventSerializer)


# --- dataset events ----------------------------------------------------------------------------


class DatasetEventListView(APIBase):
    @extend_schema(tags=["datasets"], operation_id="dataset_events_list",
                   summary="Dataset events, newest first (cursor pagination)",
                   description="Each successful production of a dataset (a task with produces=[...]): the "
                               "producing workflow, task and run, the logical date, the metadata, and the runs "
                               "of consumer workflows (triggers=[On(...)]) it started. An unknown dataset "
                               "is a 404.",
                   parameters=[s.DatasetEventFilterSerializer, CURSOR, LIMIT],
                   responses={200: paginated_schema(s.DatasetEventSerializer), **errors(400, 401, 403, 404)})
    def get(self, request):
        filters = validated_query(s.DatasetEventFilterSerializer, request.query_params)
        # Another tenant's events, and its consumers of this user's events, are not shown.
        consumers = access.visible(request.user, ConsumerRun.objects.select_related("workflow")).order_by("id")
        events = access.visible(request.user, DatasetEvent.objects.select_related("dataset")).prefetch_related(
            Prefetch("consumers", queryset=consumers))
        if "dataset" in filters:
            dataset = Dataset.objects.filter(name=filters["dataset"]).first()
            if dataset is not None and access.is_scoped(request.user) and not events.filter(dataset=dataset).exists():
                dataset = None  # known to this user only by an event of theirs
            if dataset is None:
                name = filters["dataset"]
                raise NotFound({"detail": f"unknown dataset {name!r}", "dataset": [f"unknown dataset {name!r}"]})
            events = events.filter(dataset=dataset)
        for key, lookup in [("workflow", "workflow"), ("since", "created_at__gte"), ("until", "created_at__lt")]:
            if key in filters:
                events = events.filter(**{lookup: filters[key]})
        return self.page(events, s.DatasetEventSerializer)
