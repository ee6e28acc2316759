"""Who may see and do what.

Global roles, by group (managed in the admin): **Viewers** read everything; **Operators** also
trigger, cancel, clear, mark, retry, discard, pause and backfill, and read the audit log.
Superusers are operators; staff users are viewers.

Rights per tenant (``TenantGrant``, in the admin and the API for superusers): a user, or every
member of a group, is a Viewer or an Operator of one tenant's workflows, runs, jobs and task runs,
or of one named workflow. Such a user sees only those: every page, list, count and search asks
``visible(user, queryset)``, every action ``require_operate(user, obj)``. A global role includes
every tenant's rights, so an installation that gives no tenant rights behaves as before.

| identity | reads | acts on |
|---|---|---|
| superuser, Operators group | everything | everything |
| Viewers group, staff | everything | nothing |
| Viewer of tenant A (or workflow W) | A's (W's) objects | nothing |
| Operator of tenant A (or workflow W) | A's (W's) objects | A's (W's) objects |

An object the user may not read answers 404, as one that does not exist (its existence is not
told); an object the user reads but may not act on answers 403. A run belongs to the tenant it
was created in (``Run.tenant``, copied from its workflow), as its task runs do: the tenant that
its limits and fair scheduling counted it under.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet

from orchestrator.models import Workflow
from orchestrator.tenancy import TenantGrant

VIEWERS = "Viewers"
OPERATORS = "Operators"
JOB_TENANT = "default"  # the tenant of a job enqueued without one (jobs.enqueue's default)


def _groups(user) -> set[str]:
    cached = getattr(user, "_orchestrator_groups", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True))
        user._orchestrator_groups = cached
    return cached


def _active(user) -> bool:
    return bool(user) and user.is_authenticated and user.is_active


def is_operator(user) -> bool:
    """An operator of every tenant: a superuser or a member of Operators."""
    if not _active(user):
        return False
    return user.is_superuser or OPERATORS in _groups(user)


def is_viewer(user) -> bool:
    """A viewer of every tenant: a superuser, a staff user, or a member of Viewers or Operators."""
    if not _active(user):
        return False
    return user.is_superuser or user.is_staff or bool(_groups(user) & {VIEWERS, OPERATORS})


def add_to_group(user, name: str) -> None:
    """Make ``user`` a member of Viewers or Operators (the group is created if it is missing,
    e.g. after a database flush)."""

    user.groups.add(Group.objects.get_or_create(name=name)[0])
    forget(user)


def forget(user) -> None:
    """Drop what this user object remembers of its groups and rights (after changing them)."""
    for key in ("_orchestrator_groups", "_orchestrator_scopes"):
        user.__dict__.pop(key, None)


# --- scopes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """What a user may read, or act on: everything, or the objects of some tenants and of some
    named workflows (none: nothing)."""

    everything: bool = False
    tenants: frozenset[str] = field(default_factory=frozenset)
    workflows: frozenset[str] = field(default_factory=frozenset)

    @property
    def empty(self) -> bool:
        return not (self.everything or self.tenants or self.workflows)

    def allows(self, tenant: str | None, workflow: str | None) -> bool:
        return self.everything or (tenant is not None and tenant in self.tenants) or (
            bool(workflow) and workflow in self.workflows)

    def q(self, tenant: str | None, workflow: str | None) -> Q:
        """The condition on a queryset's rows: ``tenant`` and ``workflow`` name the lookups of a
        row's tenant and of its workflow's name (either may be None: the row has none)."""
        if self.everything:
            return Q()
        condition = Q(pk__in=[])  # nothing, when no right below applies
        if self.tenants and tenant:
            condition |= Q(**{f"{tenant}__in": sorted(self.tenants)})
        if self.workflows and workflow:
            condition |= Q(**{f"{workflow}__in": sorted(self.workflows)})
        return condition

    def workflow_names(self) -> QuerySet | None:
        """The names of the workflows in scope (a subquery), or None for every workflow."""
        if self.everything:
            return None
        return Workflow.objects.filter(self.q("tenant", "name")).values("name")


def _scopes(user) -> tuple[Scope, Scope]:
    """(reading, operating) of ``user``, read once per user object (one query for its rights)."""
    cached = getattr(user, "_orchestrator_scopes", None)
    if cached is not None:
        return cached
    if not _active(user):
        scopes = (Scope(), Scope())
    else:
        everything_read, everything_act = is_viewer(user), is_operator(user)
        read_t, read_w, act_t, act_w = set(), set(), set(), set()
        if not everything_act:
            grants = TenantGrant.objects.filter(Q(user=user) | Q(group__in=user.groups.all())).values_list(
                "role", "tenant", "workflow")
            for role, tenant, workflow in grants:
                (read_t if tenant else read_w).add(tenant or workflow)
                if role == TenantGrant.Role.OPERATOR:
                    (act_t if tenant else act_w).add(tenant or workflow)
        scopes = (Scope(everything_read, frozenset(read_t), frozenset(read_w)),
                  Scope(everything_act, frozenset(act_t), frozenset(act_w)))
    user._orchestrator_scopes = scopes
    return scopes


def reading(user) -> Scope:
    return _scopes(user)[0]


def operating(user) -> Scope:
    return _scopes(user)[1]


def reads_anything(user) -> bool:
    """A global viewer, or a viewer or operator of some tenant or workflow: the pages open."""
    return not reading(user).empty


def operates_anything(user) -> bool:
    """A global operator, or an operator of some tenant or workflow: actions are looked at (each
    then checks the right on its object)."""
    return not operating(user).empty


def is_scoped(user) -> bool:
    """Sees only some tenants' objects (has tenant rights and no global role)."""
    return not reading(user).everything


# --- objects and querysets -----------------------------------------------------------------------

# Per model: the lookups of a row's tenant and of its workflow's name (None: it has none).
FIELDS = {
    "workflow": ("tenant", "name"),
    "run": ("tenant", "workflow__name"),
    "taskrun": ("tenant", "run__workflow__name"),
    "deadtaskrun": ("tenant", "run__workflow__name"),
    "attempt": ("task_run__tenant", "task_run__run__workflow__name"),
    "backfill": ("workflow__tenant", "workflow__name"),
    "schedule": ("workflow__tenant", "workflow__name"),
    "approval": ("tenant", "workflow"),
    "auditevent": ("tenant", "workflow"),
    "consumerrun": ("workflow__tenant", "workflow__name"),
    "webhookdelivery": ("run__tenant", "run__workflow__name"),
}


def _filtered(scope: Scope, queryset: QuerySet) -> QuerySet:
    if scope.everything:
        return queryset
    model = queryset.model._meta.model_name
    if model == "datasetevent":
        # By its producer's name (kept when the producing run is pruned): a job's events
        # (no workflow) are for global viewers only.
        return queryset.filter(workflow__in=scope.workflow_names())
    if model == "dataset":
        return queryset.filter(events__workflow__in=scope.workflow_names()).distinct()
    return queryset.filter(scope.q(*FIELDS[model]))


def visible(user, queryset: QuerySet) -> QuerySet:
    """The rows of ``queryset`` that ``user`` may read (the same queryset for a global viewer)."""
    return _filtered(reading(user), queryset)


def operable(user, queryset: QuerySet) -> QuerySet:
    """The rows of ``queryset`` that ``user`` may act on."""
    return _filtered(operating(user), queryset)


def owner(obj) -> tuple[str | None, str | None]:
    """(tenant, workflow name) of a workflow, run, task run, attempt, backfill, approval or schedule."""
    model = obj._meta.model_name
    if model == "workflow":
        return obj.tenant, obj.name
    if model == "run":
        return obj.tenant, obj.workflow.name if obj.workflow_id else None
    if model in ("taskrun", "deadtaskrun"):
        return obj.tenant, obj.run.workflow.name if obj.run.workflow_id else None
    if model == "attempt":
        return owner(obj.task_run)
    if model in ("backfill", "schedule"):
        return owner(obj.workflow)
    if model == "approval":
        return obj.tenant, obj.workflow or None
    raise TypeError(f"no tenant for {model}")


def can_view(user, obj) -> bool:
    scope = reading(user)
    return scope.everything or scope.allows(*owner(obj))  # a global role reads no owner


def can_operate(user, obj) -> bool:
    scope = operating(user)
    return scope.everything or scope.allows(*owner(obj))


NOT_YOURS = "You may read this but not change it: you are not an operator of its tenant or workflow."


def require_operate(user, obj) -> None:
    """PermissionDenied (403) unless ``user`` may act on ``obj``; call it on an object the user
    was allowed to read (one read through ``visible``), so the 403 tells nothing new."""
    if not can_operate(user, obj):
        raise PermissionDenied(NOT_YOURS)


def require_operate_tenant(user, tenant: str) -> None:
    """PermissionDenied unless ``user`` may act on every object of ``tenant`` (a job's tenant)."""
    if not operating(user).allows(tenant, None):
        raise PermissionDenied(f"You are not an operator of tenant {tenant!r}.")
