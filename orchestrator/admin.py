"""The admin: every model with useful columns, filters and search; actions to pause and resume
workflows, cancel runs, retry and discard dead task runs; and backfills, started from a
workflow with a dry-run preview before anything is created.

Actions that change state need an operator (``access.is_operator``), whatever the model
permissions say.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from orchestrator import (
    access,
    admin_notifications,  # noqa: F401 - registers the notification rules' and messages' admin
    admin_schedules,  # noqa: F401 - registers the Schedule admin
    admin_secrets,  # noqa: F401 - registers the secrets store's admin
    audit,
    backfill,
    control,
)
from orchestrator.models import (
    Attempt,
    Backfill,
    DeadTaskRun,
    Lease,
    QueueLimit,
    Run,
    TaskRun,
    TenantGrant,
    TenantLimit,
    WebhookDelivery,
    Worker,
    Workflow,
    WorkflowVersion,
)
from orchestrator.states import RunState, TaskState
from orchestrator.web.forms import BackfillForm, backfill_step


class OperatorActions:
    """``@admin.action(permissions=["operate"])`` shows an action to operators only."""

    def has_operate_permission(self, request) -> bool:
        return access.is_operator(request.user)


def _state(value: str) -> str:
    return format_html('<span class="st st-{}">{}</span>', value, value.replace("_", " "))


class ReadOnly:
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# ---------------------------------------------------------------- workflows and backfills


@admin.register(Workflow)
class WorkflowAdmin(OperatorActions, admin.ModelAdmin):
    list_display = ["name", "schedules_column", "tenant", "owner", "paused", "broken", "present", "synced_at"]
    list_filter = ["paused", "broken", "present", "tenant"]
    search_fields = ["name", "module", "description", "owner"]
    readonly_fields = ["current_version", "broken", "sync_error", "present", "synced_at", "created_at", "updated_at"]
    actions = ["pause", "resume", "backfill"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(schedule_count=Count("schedules"))

    @admin.display(description="schedules", ordering="schedule_count")
    def schedules_column(self, obj):
        return obj.schedule_count

    @admin.action(description="Pause the selected workflows", permissions=["operate"])
    def pause(self, request, queryset):

        for wf in queryset:
            control.pause_workflow(wf)
            audit.record("pause", request=request, target=wf)
        self.message_user(request, f"Paused {queryset.count()} workflow(s).", messages.SUCCESS)

    @admin.action(description="Resume the selected workflows", permissions=["operate"])
    def resume(self, request, queryset):

        for wf in queryset:
            control.resume_workflow(wf)
            audit.record("resume", request=request, target=wf)
        self.message_user(request, f"Resumed {queryset.count()} workflow(s).", messages.SUCCESS)

    @admin.action(description="Backfill the selected workflow…", permissions=["operate"])
    def backfill(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one workflow to backfill.", messages.WARNING)
            return None
        return HttpResponseRedirect(reverse("admin:orchestrator_workflow_backfill", args=[queryset.get().pk]))

    def get_urls(self):
        return [
            path("<int:object_id>/backfill/", self.admin_site.admin_view(self.backfill_view),
                 name="orchestrator_workflow_backfill"),
            *super().get_urls(),
        ]

    def backfill_view(self, request, object_id):
        """Form → dry-run preview (count and first fire times from ``backfill.plan``) → start.
        The start button carries a digest of the previewed values: if they were edited after
        the preview, the page shows the new preview instead of starting."""
        if not access.is_operator(request.user):
            raise PermissionDenied("Only operators can start backfills.")
        wf = get_object_or_404(Workflow, pk=object_id)
        form = BackfillForm(request.POST or None, workflow=wf)
        preview = None
        if request.method == "POST" and form.is_valid():
            started, preview = backfill_step(request, wf, form)
            if started is not None:
                self.message_user(request, f"Started {started}: {started.total} run(s).", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:orchestrator_backfill_change", args=[started.pk]))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "original": wf,
            "wf": wf,
            "form": form,
            "preview": preview,
            "title": f"Backfill {wf.name}",
            "has_view_permission": True,
        }
        return TemplateResponse(request, "admin/orchestrator/workflow/backfill.html", context)


@admin.register(WorkflowVersion)
class WorkflowVersionAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["workflow", "number", "hash", "created_at"]
    list_filter = ["workflow"]
    search_fields = ["workflow__name", "hash"]


@admin.register(Backfill)
class BackfillAdmin(admin.ModelAdmin):
    list_display = ["id", "workflow", "start", "end", "reprocess", "progress", "created_by", "created_at"]
    list_filter = ["reprocess", "workflow"]
    search_fields = ["workflow__name"]
    readonly_fields = ["workflow", "schedule", "start", "end", "reprocess", "params", "total", "progress",
                       "created_by", "created_at"]
    fields = readonly_fields

    def has_add_permission(self, request):
        # A backfill starts from its workflow (the "Backfill…" action), after a dry run.
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="progress (runs done / total)")
    def progress(self, obj):

        done, total = backfill.progress(obj)
        percent = int(100 * done / total) if total else 100
        return format_html(
            '<span class="bf-progress" title="{} of {} runs finished"><progress max="100" value="{}"></progress> {} / {}</span>',
            done, total, percent, done, total,
        )


# ---------------------------------------------------------------- runs and task runs


@admin.register(Run)
class RunAdmin(OperatorActions, admin.ModelAdmin):
    list_display = ["id", "workflow", "trigger", "state_badge", "logical_date", "started_at", "finished_at", "lane"]
    list_filter = ["state", "trigger", "lane", "workflow"]
    search_fields = ["=id", "workflow__name", "idempotency_key"]
    list_select_related = ["workflow"]
    raw_id_fields = ["workflow", "version", "schedule", "backfill", "created_by"]
    readonly_fields = ["state", "started_at", "finished_at", "created_at", "schedule_delay", "payload_hash"]
    show_full_result_count = False
    actions = ["cancel"]

    def has_add_permission(self, request):
        # A run is more than its row: its task runs and its version are created with it by the
        # trigger (the workflow page's form, the API) or by a backfill. A bare row saved here would
        # "run" forever with nothing to do and hold a max_active_runs slot.
        return False

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return _state(obj.state)

    @admin.action(description="Cancel the selected runs", permissions=["operate"])
    def cancel(self, request, queryset):

        cancelled = 0
        for run in queryset.filter(state__in=[RunState.PENDING, RunState.RUNNING]):
            if control.cancel_run(run, reason=f"cancelled in the admin by {request.user.get_username()}",
                                  by=request.user):
                audit.record("cancel", request=request, target=run)
                cancelled += 1
        self.message_user(request, f"Cancelled {cancelled} run(s).", messages.SUCCESS)


class AttemptInline(ReadOnly, admin.TabularInline):
    model = Attempt
    fields = ["number", "outcome", "worker", "started_at", "finished_at", "error"]
    readonly_fields = fields
    extra = 0


class TaskRunActions(OperatorActions):
    @admin.action(description="Retry the selected dead or failed task runs", permissions=["operate"])
    def retry(self, request, queryset):

        ids = list(queryset.values_list("pk", flat=True))
        count = control.retry_task_runs(ids)
        audit.record_each("retry", "taskrun", ids, request=request, changed=count)
        self.message_user(request, f"Retrying {count} task run(s).", messages.SUCCESS)

    @admin.action(description="Discard the selected dead task runs (mark them failed)", permissions=["operate"])
    def discard(self, request, queryset):

        ids = list(queryset.filter(state=TaskState.DEAD).values_list("pk", flat=True))
        count = control.discard_task_runs(ids)
        audit.record_each("discard", "taskrun", ids, request=request, changed=count)
        self.message_user(request, f"Discarded {count} task run(s).", messages.SUCCESS)


@admin.register(TaskRun)
class TaskRunAdmin(TaskRunActions, admin.ModelAdmin):
    list_display = ["id", "task", "run", "state_badge", "queue", "tenant", "attempts", "due_at", "finished_at"]
    list_filter = ["state", "queue", "lane", "tenant"]
    search_fields = ["task", "=run__id", "error"]
    list_select_related = ["run__workflow"]
    raw_id_fields = ["run", "worker"]
    # What a task run executes comes from its workflow's graph version or a registered job,
    # never from a form: the spec is read-only and task runs are not added by hand.
    readonly_fields = ["state", "spec", "attempts", "created_at", "queued_at", "started_at", "finished_at", "result",
                       "error"]
    show_full_result_count = False
    inlines = [AttemptInline]
    actions = ["retry", "discard"]

    def has_add_permission(self, request):
        return False

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return _state(obj.state)


@admin.register(DeadTaskRun)
class DeadTaskRunAdmin(TaskRunActions, ReadOnly, admin.ModelAdmin):
    list_display = ["id", "task", "workflow", "run_link", "queue", "attempts", "finished_at", "short_error"]
    list_filter = ["queue", "run__workflow", "finished_at"]
    search_fields = ["task", "error", "run__workflow__name"]
    list_select_related = ["run__workflow"]
    ordering = ["-finished_at"]
    inlines = [AttemptInline]
    actions = ["retry", "discard"]

    @admin.display(description="workflow", ordering="run__workflow__name")
    def workflow(self, obj):
        return obj.run.workflow.name if obj.run.workflow_id else "job"

    @admin.display(description="run")
    def run_link(self, obj):
        return format_html('<a href="{}">#{}</a>', reverse("orchestrator:web:run", args=[obj.run_id]), obj.run_id)

    @admin.display(description="error")
    def short_error(self, obj):
        return obj.error[:160]


@admin.register(Attempt)
class AttemptAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["id", "task_run", "number", "outcome", "worker", "started_at", "finished_at"]
    list_filter = ["outcome"]
    search_fields = ["=task_run__id", "task_run__task", "error"]
    list_select_related = ["task_run", "worker"]
    show_full_result_count = False


# ---------------------------------------------------------------- processes and limits


@admin.register(Worker)
class WorkerAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["name", "host", "pid", "queues", "concurrency", "state", "heartbeat_at", "started_at"]
    list_filter = ["state", "host"]
    search_fields = ["name", "host"]


@admin.register(Lease)
class LeaseAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["name", "holder", "epoch", "acquired_at", "expires_at"]


@admin.register(QueueLimit)
class QueueLimitAdmin(audit.AdminChanges, admin.ModelAdmin):
    audit_action = "limit"
    list_display = ["queue", "max_running"]
    list_editable = ["max_running"]
    search_fields = ["queue"]


@admin.register(TenantLimit)
class TenantLimitAdmin(audit.AdminChanges, admin.ModelAdmin):
    audit_action = "limit"
    list_display = ["tenant", "max_running"]
    list_editable = ["max_running"]
    search_fields = ["tenant"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ["id", "run", "event", "url", "state", "attempts", "status_code", "created_at", "delivered_at"]
    list_filter = ["state", "event"]
    search_fields = ["url", "=run__id", "last_error"]
    list_select_related = ["run__workflow"]


@admin.register(TenantGrant)
class TenantGrantAdmin(audit.AdminChanges, admin.ModelAdmin):
    """Rights per tenant or workflow (``orchestrator.access``): superusers give and take them."""

    audit_action = "grant"
    list_display = ["__str__", "user", "group", "role", "tenant", "workflow", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "group__name", "tenant", "workflow"]
    list_select_related = ["user", "group"]

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    has_add_permission = has_change_permission = has_delete_permission = has_view_permission
