"""The admin of notifications: the installation's rules (who hears of which events of which
workflows), and the messages sent or gathering, each with the events it carries, and an action
that sends gathering messages at once.

Changes to the rules are written to the audit log (action ``notification_rule``); only
operators change them, whatever the model permissions say.
"""

from __future__ import annotations

from django.contrib import admin, messages

from orchestrator import access, audit, notifications
from orchestrator.models import Notification, NotificationMessage, NotificationRule


class OperatorsOnly:
    def has_add_permission(self, request, obj=None):
        return access.is_operator(request.user) and super().has_add_permission(request)

    def has_change_permission(self, request, obj=None):
        return access.is_operator(request.user) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return access.is_operator(request.user) and super().has_delete_permission(request, obj)


@admin.register(NotificationRule)
class NotificationRuleAdmin(audit.AdminChanges, OperatorsOnly, admin.ModelAdmin):
    audit_action = "notification_rule"
    list_display = ["name", "events", "workflows", "tenants", "emails", "enabled"]
    list_filter = ["enabled"]
    search_fields = ["name"]


class NotificationInline(admin.TabularInline):
    model = Notification
    fields = ["created_at", "event", "workflow", "task", "run", "detail"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False


@admin.register(NotificationMessage)
class NotificationMessageAdmin(admin.ModelAdmin):
    list_display = ["id", "recipient", "state", "count", "due_at", "sent_at", "attempts", "last_error"]
    list_filter = ["state"]
    search_fields = ["recipient"]
    readonly_fields = ["recipient", "state", "due_at", "created_at", "sent_at", "count", "attempts", "last_error"]
    inlines = [NotificationInline]
    actions = ["send_now"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request) -> bool:
        return access.is_operator(request.user)

    @admin.action(description="Send the selected gathering messages now", permissions=["operate"])
    def send_now(self, request, queryset):
        ids = list(queryset.values_list("pk", flat=True))
        sent = notifications.send_now(ids)
        audit.record("notify_send_now", request=request, target_type="notificationmessage",
                     target_id=",".join(map(str, ids))[:255], brought_forward=sent)
        self.message_user(request, f"{sent} gathering message(s) will be sent now.", messages.SUCCESS)
