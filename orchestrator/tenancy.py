"""Rights given per tenant or per workflow: a user or a group is a Viewer or an Operator of one
tenant's workflows, or of one named workflow. ``orchestrator.access`` reads them.

Defined here rather than in ``models.py`` to keep that module to the core of runs and tasks;
``models.py`` imports it, so it is one of the app's models like the others.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q


class TenantGrant(models.Model):
    """One right: ``role`` on ``tenant`` (every workflow, run, job and task run of that tenant) or
    on the workflow named ``workflow`` (its runs and task runs), for ``user`` or every member of
    ``group``. A workflow is named, not linked: a workflow removed from the code and added again
    keeps its grants."""

    class Role(models.TextChoices):
        VIEWER = "viewer", "Viewer: reads pages, logs and lists"
        OPERATOR = "operator", "Operator: also triggers, cancels, clears, marks, retries, pauses, backfills"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="tenant_grants")
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="tenant_grants")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.VIEWER)
    tenant = models.CharField(max_length=200, blank=True, help_text="A tenant (Workflow(tenant=...)); or leave "
                              "it empty and name a workflow.")
    workflow = models.CharField(max_length=200, blank=True, help_text="A workflow's name, when the right is on "
                                "that workflow only.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "workflow", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False),
                name="tenantgrant_user_or_group",
                violation_error_message="Give the right to a user or to a group (one of them).",
            ),
            models.CheckConstraint(
                condition=(Q(tenant="") & ~Q(workflow="")) | (~Q(tenant="") & Q(workflow="")),
                name="tenantgrant_tenant_or_workflow",
                violation_error_message="Name a tenant or a workflow (one of them).",
            ),
            models.UniqueConstraint(fields=["user", "role", "tenant", "workflow"], name="tenantgrant_unique_user",
                                    condition=Q(user__isnull=False),
                                    violation_error_message="This user already has this right."),
            models.UniqueConstraint(fields=["group", "role", "tenant", "workflow"], name="tenantgrant_unique_group",
                                    condition=Q(group__isnull=False),
                                    violation_error_message="This group already has this right."),
        ]

    def __str__(self):
        who = f"user {self.user}" if self.user_id else f"group {self.group}"
        on = f"tenant {self.tenant}" if self.tenant else f"workflow {self.workflow}"
        return f"{who}: {self.role} of {on}"
