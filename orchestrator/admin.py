from django.contrib import admin

from orchestrator.models import Run, Schedule, Workflow


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ["name", "module", "tenant", "paused", "broken", "present"]
    list_filter = ["paused", "broken", "present", "tenant"]
    search_fields = ["name", "module", "description"]


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = ["workflow", "name", "source", "cron", "timezone", "paused", "next_fire_at"]
    list_filter = ["source", "paused"]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "workflow", "trigger", "state", "logical_date", "created_at"]
    list_filter = ["state", "trigger"]
