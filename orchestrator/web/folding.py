"""Task groups on the pages: which groups a page shows unfolded, the grid's rows with a folded
group as one row (the worst state of its tasks in each run), and which node of the graph a task
is drawn as (itself, or the outermost folded group around it).

A group is folded until the page's address unfolds it: ``?unfold=<group>``, repeated, kept in
every link that changes the fold (so a live update, a reload or a shared link shows the same).
Groups are read from the graph version's spec: its ``groups`` ({name: {parent, tooltip}}) and
each task's ``group`` (the path of group names, outermost first); a task run's own spec holds
the path too, so the run page needs no version's spec.

Folding costs no read: the grid and the graph fold what they read anyway (one row per task and
run), so a page with groups reads the same rows as one without (tests/test_task_groups.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.utils.http import urlencode

from orchestrator import limits
from orchestrator.states import TaskState
from orchestrator.web.errors import InvalidInput

# The state a group shows in a run: the first of these any of its tasks is in. Trouble first, then
# what is still going on, then what ended well; skipped last (a group with a skipped branch and
# tasks that succeeded succeeded).
WORST = (TaskState.DEAD, TaskState.FAILED, TaskState.UPSTREAM_FAILED, TaskState.CANCELLED, TaskState.RUNNING,
         TaskState.MAPPED, TaskState.SENSING, TaskState.AWAITING, TaskState.QUEUED, TaskState.SCHEDULED,
         TaskState.WAITING, TaskState.SUCCEEDED, TaskState.SKIPPED)
ENDED = {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.DEAD, TaskState.UPSTREAM_FAILED, TaskState.SKIPPED,
         TaskState.CANCELLED}
MOST_UNFOLDED = 100  # names in ?unfold=: more than any page has groups


def worst(states: Iterable[str]) -> str | None:
    """The state a group shows for these states of its tasks (None for none)."""
    present = set(states)
    return next((state.value for state in WORST if state in present), min(present) if present else None)


def counts_of(states: Iterable[str]) -> list[tuple[str, int]]:
    """(state, how many) of these states, worst first."""
    found: dict[str, int] = {}
    for state in states:
        found[state] = found.get(state, 0) + 1
    rank = {state.value: index for index, state in enumerate(WORST)}
    return sorted(found.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0]))


def said(counts: list[tuple[str, int]]) -> str:
    """The counts in words: "3 succeeded, 1 failed"."""
    return ", ".join(f"{n} {state.replace('_', ' ')}" for state, n in counts)


@dataclass(frozen=True)
class Groups:
    """The task groups of a graph: each group's parent and tooltip, each task's path of groups."""

    parent: dict[str, str | None] = field(default_factory=dict)
    tooltip: dict[str, str] = field(default_factory=dict)
    path: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.parent)

    @classmethod
    def of_spec(cls, spec: dict) -> Groups:
        declared = spec.get("groups") or {}
        path = {name: tuple(task["group"]) for name, task in spec.get("tasks", {}).items()
                if isinstance(task, dict) and task.get("group")}
        parent: dict[str, str | None] = {}
        for groups in path.values():
            for index, group in enumerate(groups):
                parent.setdefault(group, groups[index - 1] if index else None)
        tooltip = {name: str(group.get("tooltip") or "") for name, group in declared.items() if isinstance(group, dict)}
        return cls(parent, tooltip, path)

    def members(self, group: str, tasks: Iterable[str]) -> list[str]:
        """The tasks of ``tasks`` in ``group`` or in a group inside it."""
        return [task for task in tasks if group in self.path.get(task, ())]

    def shown_as(self, task: str, unfolded: frozenset[str]) -> str | None:
        """The folded group ``task`` is drawn as (the outermost one around it), or None: itself."""
        return next((group for group in self.path.get(task, ()) if group not in unfolded), None)


@dataclass(frozen=True)
class Fold:
    """The groups a page shows unfolded, and its other query parameters (kept by each toggle)."""

    unfolded: frozenset[str] = frozenset()
    others: tuple[tuple[str, str], ...] = ()

    def toggle_fields(self, group: str) -> list[tuple[str, str]]:
        """The page's query parameters with ``group`` folded if it is unfolded, unfolded if not."""
        return [*self.others, *(("unfold", name) for name in sorted(self.unfolded ^ {group}))]

    def toggle(self, group: str) -> str:
        """``toggle_fields`` as a query string."""
        return urlencode(self.toggle_fields(group))


def fold_from(params) -> Fold:
    """The page's fold from its query (``request.GET``): a name that cannot be a group's is a 400
    naming it; a well-formed name no group has (an older version's) unfolds nothing."""
    names = params.getlist("unfold") if hasattr(params, "getlist") else list(params.get("unfold", []))
    if len(names) > MOST_UNFOLDED:
        raise InvalidInput("unfold", f"unfold names at most {MOST_UNFOLDED} groups, got {len(names)}")
    for name in names:
        if not limits.NAME_RE.match(name):
            raise InvalidInput("unfold", f"unfold takes group names, which {limits.NAME_RULE}; got {name[:80]!r}")
    others = tuple((key, value) for key in params if key not in ("unfold", "panel")
                   for value in (params.getlist(key) if hasattr(params, "getlist") else [params[key]]))
    return Fold(frozenset(names), others)


@dataclass
class GroupCell:
    """A folded group in one run: its tasks' worst state and their counts."""

    state: str
    counts: list[tuple[str, int]]
    words: str


@dataclass
class Row:
    """A row of the grid: a task's, or a group's (its cells GroupCells, folded or not)."""

    name: str
    cells: list
    depth: int = 0
    group: bool = False
    unfolded: bool = False
    tooltip: str = ""
    toggle_fields: list = field(default_factory=list)  # the query that folds or unfolds it
    size: int = 0  # a group's tasks


def grid_rows(order: list[str], groups: Groups, fold: Fold, runs: list, found: dict) -> list[Row]:
    """The grid's rows in the graph's order (``order``), a group's where its first task is, its
    tasks (when unfolded) right under it; ``found`` is the grid's {(run id, task): task run}."""
    children: dict[str | None, list[tuple[bool, str]]] = {None: []}
    for task in order:
        above = None
        for group in groups.path.get(task, ()):
            if group not in children:
                children[group] = []
                children[above].append((True, group))
            above = group
        children[above].append((False, task))
    rows: list[Row] = []

    def add(level: str | None, depth: int) -> None:
        for is_group, name in children[level]:
            if not is_group:
                rows.append(Row(name, [(run, found.get((run.pk, name))) for run in runs], depth))
                continue
            unfolded = name in fold.unfolded
            members = groups.members(name, order)
            rows.append(Row(name, [(run, group_cell(run, members, found)) for run in runs], depth, group=True,
                            unfolded=unfolded, tooltip=groups.tooltip.get(name, ""), toggle_fields=fold.toggle_fields(name), size=len(members)))
            if unfolded:
                add(name, depth + 1)

    add(None, 0)
    return rows


def group_cell(run, members: list[str], found: dict) -> GroupCell | None:
    states = [found[(run.pk, task)].state for task in members if (run.pk, task) in found]
    if not states:
        return None
    counts = counts_of(states)
    return GroupCell(worst(states), counts, said(counts))
