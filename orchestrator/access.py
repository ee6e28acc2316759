"""Who may do what. Viewers read everything; operators also trigger, cancel, retry, discard,
pause and backfill. Superusers are operators. Membership is by group, managed in the admin.
"""

from django.contrib.auth.models import Group

VIEWERS = "Viewers"
OPERATORS = "Operators"


def _groups(user) -> set[str]:
    cached = getattr(user, "_orchestrator_groups", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True))
        user._orchestrator_groups = cached
    return cached


def is_operator(user) -> bool:
    if not user or not user.is_authenticated or not user.is_active:
        return False
    return user.is_superuser or OPERATORS in _groups(user)


def is_viewer(user) -> bool:
    if not user or not user.is_authenticated or not user.is_active:
        return False
    return user.is_superuser or user.is_staff or bool(_groups(user) & {VIEWERS, OPERATORS})


def add_to_group(user, name: str) -> None:
    """Make ``user`` a member of Viewers or Operators (the group is created if it is missing,
    e.g. after a database flush)."""

    user.groups.add(Group.objects.get_or_create(name=name)[0])
    user.__dict__.pop("_orchestrator_groups", None)
