"""The Schedule admin: operators add schedules to workflows (cron, time zone, policies, params),
see the next fire times in local time and UTC, and pause or resume them.

Schedules declared in code follow the code (sync rewrites them), so here they are read-only except
``paused``; schedules made in the admin are never touched by sync.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html, format_html_join

from orchestrator import access, audit, clock, cron
from orchestrator.channels import wake_schedulers
from orchestrator.control import pause_schedule, resume_schedule
from orchestrator.models import Schedule, Workflow
from orchestrator.params import ParamError, clean_params

PREVIEW_COUNT = 5
EDITABLE = ["workflow", "name", "cron", "timezone", "catchup", "max_catchup", "overlap", "start_deadline",
            "jitter", "params", "paused"]


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = EDITABLE
        help_texts = {
            "cron": "Five fields (minute hour day-of-month month day-of-week), an optional leading seconds field, "
                    "or @hourly, @daily, @weekly, @monthly, @yearly.",
            "timezone": "IANA time zone the cron expression is read in, e.g. Europe/Berlin. DST follows Debian cron.",
            "params": "JSON object of param values for the runs, checked against the workflow's declared params.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "workflow" in self.fields:
            self.fields["workflow"].queryset = Workflow.objects.active().order_by("name")

    def clean_cron(self):
        return " ".join(self.cleaned_data["cron"].split())

    def clean_timezone(self):
        return self.cleaned_data["timezone"].strip()

    def clean(self):
        data = super().clean()
        expr, tz = data.get("cron"), data.get("timezone")
        if expr and tz:
            try:
                cron.validate(expr, tz)
            except cron.CronError as exc:
                # orchestrator.cron's messages name the timezone only when it is the timezone that is wrong.
                self.add_error("timezone" if "timezone" in str(exc) else "cron", str(exc))
        workflow = data.get("workflow") or (self.instance.workflow if self.instance.workflow_id else None)
        if workflow is not None and "params" in data:
            if workflow.current_version_id is None:
                self.add_error("workflow", f"workflow {workflow.name!r} has no valid version yet, so its "
                                           "params cannot be checked")
            else:
                try:
                    cleaned = clean_params(workflow.current_version.spec.get("params", {}), data["params"])
                    # Keep only what was given: the declared defaults stay the workflow's to change.
                    data["params"] = {key: cleaned[key] for key in (data["params"] or {})}
                except ParamError as exc:
                    self.add_error("params", "; ".join(f"{key}: {message}" for key, message in exc.errors.items()))
        return data


@admin.register(Schedule)
class ScheduleAdmin(audit.AdminChanges, admin.ModelAdmin):
    audit_action = "schedule"
    form = ScheduleForm
    list_display = ["workflow", "name", "source", "cron", "described", "timezone", "state", "next_fire_local",
                    "next_fire_at"]
    list_filter = ["source", "paused", "catchup", "overlap"]
    search_fields = ["workflow__name", "name", "cron"]
    list_select_related = ["workflow"]
    actions = ["pause_schedules", "resume_schedules"]
    always_readonly = ["source", "described", "fire_time_preview", "next_fire_at", "last_fire_at"]

    def get_fields(self, request, obj=None):
        return [*EDITABLE, *self.always_readonly]

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.source == Schedule.Source.CODE:
            # Declared in code: sync would overwrite any edit, so only pausing is allowed here.
            return [name for name in EDITABLE if name != "paused"] + self.always_readonly
        if obj is not None:
            return ["workflow", *self.always_readonly]
        return self.always_readonly

    # -- who may do what: viewers look, operators change ---------------------------------------

    def has_view_permission(self, request, obj=None):
        return access.is_viewer(request.user)

    def has_add_permission(self, request):
        return access.is_operator(request.user)

    def has_change_permission(self, request, obj=None):
        return access.is_operator(request.user)

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.source == Schedule.Source.CODE:
            return False  # it comes back at the next sync; remove it from the code instead
        return access.is_operator(request.user)

    def has_module_permission(self, request):
        return access.is_viewer(request.user)

    def has_operate_permission(self, request):
        return access.is_operator(request.user)

    # -- display -------------------------------------------------------------------------------

    @admin.display(description="meaning")
    def described(self, obj):
        try:
            return cron.describe(obj.cron)
        except cron.CronError as exc:
            return f"invalid: {exc}"

    @admin.display(description="state")
    def state(self, obj):
        if obj.paused:
            return "paused"
        if obj.workflow.paused:
            return "workflow paused"
        if not obj.workflow.present:
            return "workflow removed"
        return "active"

    @admin.display(description="next fire (local)", ordering="next_fire_at")
    def next_fire_local(self, obj):
        if obj.next_fire_at is None:
            return "-"
        try:
            zone = ZoneInfo(obj.timezone)
        except (ValueError, KeyError):  # ZoneInfoNotFoundError is a KeyError
            return "-"
        return obj.next_fire_at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")

    @admin.display(description="next fire times")
    def fire_time_preview(self, obj):
        if obj is None or not obj.pk:
            return "Shown after saving."
        try:
            rows = cron.preview(obj.cron, obj.timezone, clock.now(), PREVIEW_COUNT)
        except cron.CronError as exc:
            return f"invalid: {exc}"
        if not rows:
            return "This expression never fires."
        body = format_html_join(
            "", "<tr><td>{}</td><td>{}</td></tr>",
            ((local.strftime("%a %Y-%m-%d %H:%M:%S %Z"), utc.strftime("%Y-%m-%d %H:%M:%S UTC")) for utc, local in rows),
        )
        return format_html(
            '<table class="fire-time-preview"><thead><tr><th>{}</th><th>UTC</th></tr></thead>'
            "<tbody>{}</tbody></table>", obj.timezone, body)

    # -- saving --------------------------------------------------------------------------------

    def save_model(self, request, obj, form, change):
        if not change:
            obj.source = Schedule.Source.ADMIN
        if not change or obj.next_fire_at is None or {"cron", "timezone"} & set(form.changed_data):
            obj.next_fire_at = cron.next_fire_time(obj.cron, obj.timezone, clock.now())
        super().save_model(request, obj, form, change)
        # A paused schedule resumed here keeps its past next_fire_at: the scheduler then applies the
        # catchup policy, exactly as resume_schedule does.
        wake_schedulers()

    # -- actions -------------------------------------------------------------------------------

    @admin.action(description="Pause the selected schedules", permissions=["operate"])
    def pause_schedules(self, request, queryset):
        for schedule in queryset:
            pause_schedule(schedule)
            audit.record("pause", request=request, target=schedule)
        self.message_user(request, f"Paused {queryset.count()} schedule(s).", messages.SUCCESS)

    @admin.action(description="Resume the selected schedules (missed fire times follow their catchup policy)",
                  permissions=["operate"])
    def resume_schedules(self, request, queryset):
        for schedule in queryset:
            resume_schedule(schedule)
            audit.record("resume", request=request, target=schedule)
        self.message_user(request, f"Resumed {queryset.count()} schedule(s).", messages.SUCCESS)
