from django.contrib import admin

from orchestrator.models import Schedule


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = ["workflow", "name", "source", "cron", "timezone", "paused", "next_fire_at"]
    list_filter = ["source", "paused"]
