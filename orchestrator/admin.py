from django.contrib import admin

from orchestrator import admin_schedules  # noqa: F401 - registers the Schedule admin
from orchestrator.models import Run, Workflow


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ["name", "module", "tenant", "paused", "broken", "present"]
    list_filter = ["paused", "broken", "present", "tenant"]
    search_fields = ["name", "module", "description"]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "workflow", "trigger", "state", "logical_date", "created_at"]
    list_filter = ["state", "trigger"]
