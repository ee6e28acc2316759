"""Clear with options and mark whole runs, as Airflow users know them, each with a dry run that
lists exactly which task runs it touches.

A clear of a task run (``plan_task_clear``) takes the task, and optionally its ``upstream``
tasks, its ``downstream`` tasks (on by default), ``only_failed`` task runs (failed, dead or
upstream-failed), and the same tasks in the ``past`` or ``future`` runs of the workflow (those
with an earlier or later logical date). A clear of runs (``plan_run_clear``) takes every task of
the runs, or only their failed ones. Either is a :class:`ClearPlan`: the ids it touches, counted
and listed in the dry run, and a digest of them; ``clear`` runs exactly those ids again
(``control.clear_task_runs``), so what the dry run listed is what is cleared.

Which rows: the finished task runs (an active one is left alone, as ``control.clear_task_runs``
leaves it) of runs that are not held back. A mapped task is its own row: clearing it maps it
again, every instance running again; with ``only_failed`` its failed instances are cleared
instead (the map waits for them). An instance picked by hand is cleared alone, and in past or
future runs the instance of the same index. The tasks of past and future runs are those of the
picked run's graph, by name.

What it costs: the task set is read from the picked run's own task rows (never its instances),
and the selection stops at a bound (``MOST`` + 1 rows): a clear over years of runs counts up to
the bound and refuses beyond it, saying so, rather than locking a million rows. Past and future
runs are read through an index, only as many as the bound needs: in date order by keyset batches
(``SELECT_WALK``: about MOST / tasks runs for a clear of every finished state), or from the failed
task runs of the tasks (``SELECT_FAILED``, only failed: as many rows as there are failures).
Over 50,000 runs (``tests/test_clear_at_size.py`` counts the rows read), a clear of two tasks
with past runs read 29,102 runs through a sequential scan and a sort, and with only failed
50,003; now 5,006 and 21.

``mark_runs`` marks every task run of runs succeeded (all but those that ended well), or the
unfinished ones failed (a run that had ended well is then marked failed itself); each running
attempt is stopped as for a cancel (``control.mark_task_runs``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection, transaction

from orchestrator import clock, control, resolver
from orchestrator.limits import MAX_ID
from orchestrator.models import Run, TaskRun
from orchestrator.states import (
    FAILED_TASK_STATES,
    FINISHED_TASK_STATES,
    MARKABLE_TASK_STATES,
    SUCCESSFUL_TASK_STATES,
    RunState,
    TaskState,
    sql_list,
)

MOST = 10_000  # the most task runs one clear or mark touches
SHOWN = 200  # task runs a dry run lists (it counts them all, up to MOST)
FAILED_STATES = FAILED_TASK_STATES


class ClearError(ValueError):
    """An action that cannot be done as asked (too many task runs, a held-back run)."""


@dataclass(frozen=True)
class ClearScope:
    """What a clear of one task run takes besides it."""

    upstream: bool = False
    downstream: bool = True
    only_failed: bool = False
    past: bool = False
    future: bool = False

    def words(self) -> str:
        parts = [name.replace("_", " ") for name in ("upstream", "downstream", "only_failed", "past", "future")
                 if getattr(self, name)]
        return ", ".join(parts) or "the task alone"


@dataclass
class ClearPlan:
    """The task runs a clear touches: ``ids`` (all of them, at most MOST), ``rows`` (the first
    SHOWN, for the dry run's list), how many runs they are in, and whether the selection went
    past MOST (then ``ids`` is empty and the clear refuses)."""

    ids: list[int]
    rows: list[dict]
    count: int
    runs: int
    tasks: list[str] = field(default_factory=list)
    too_many: bool = False

    @property
    def digest(self) -> str:
        """Of the ids: the confirm button carries the one of the dry run, so a selection that
        changed since (a task ended, a run started) shows a new dry run instead of clearing."""
        return hashlib.sha256(",".join(map(str, self.ids)).encode()).hexdigest()[:24]

    @property
    def more(self) -> int:
        return max(0, self.count - len(self.rows))


# The task runs a clear selects in the given runs (a run clear, or the picked run of a task's
# clear), in the order of their logical dates, up to MOST + 1 rows: per-run probes of
# taskrun_unique_task (run, task).
SELECT = f"""
SELECT t.id, r.id, r.logical_date, t.task, t.map_index, t.state
FROM orchestrator_run r
CROSS JOIN LATERAL (
    SELECT t.id, t.task, t.map_index, t.state FROM orchestrator_taskrun t
    WHERE t.run_id = r.id AND t.task = ANY (%(tasks)s) AND t.state = ANY (%(states)s)
      AND {{instances}}
) t
WHERE r.id = ANY (%(runs)s) AND r.state <> '{RunState.PENDING}'
ORDER BY r.logical_date, r.id, t.task, t.map_index
LIMIT %(limit)s
"""

# Which rows of a task: a picked instance by its index; with only_failed, the failed instances of
# a mapped task (or the task's own row when it is not mapped); otherwise the task's own row.
INSTANCES = """CASE WHEN t.task = %(pick)s AND %(pick_index)s >= 0 THEN t.map_index = %(pick_index)s
               WHEN %(only_failed)s THEN t.map_index >= 0 OR NOT (t.spec ? 'map_over')
               ELSE t.map_index = -1 END"""

# Past or future runs of the workflow, every finished state: the workflow's runs in date order
# from run_of_workflow_by_date, ``batch`` of them after a (date, id) keyset, each probed for its
# task runs. Nearly every run has rows to clear, so a batch of (rows still wanted / tasks) runs
# fills the bound in one statement: a clear over years of runs reads about MOST / tasks runs, not
# the workflow's history (a run without any of the tasks, from an older graph, costs a batch more).
# A run with nothing to clear is a row of NULLs: the batch's last run is where the next one starts.
SELECT_WALK = f"""
SELECT t.id, r.id, r.logical_date, t.task, t.map_index, t.state
FROM (
    SELECT id, logical_date FROM orchestrator_run
    WHERE workflow_id = %(workflow)s AND logical_date >= %(lo)s AND logical_date < %(hi)s
      AND (logical_date > %(lo)s OR id > %(after)s) AND state <> '{RunState.PENDING}'
    ORDER BY logical_date, id
    LIMIT %(batch)s
) r
LEFT JOIN LATERAL (
    SELECT t.id, t.task, t.map_index, t.state FROM orchestrator_taskrun t
    WHERE t.run_id = r.id AND t.task = ANY (%(tasks)s) AND t.state = ANY (%(states)s)
      AND {{instances}}
    OFFSET 0  -- a probe per run, never flattened into a join that reads every task run
) t ON true
ORDER BY r.logical_date, r.id, t.task, t.map_index
"""

# Past or future runs with only failed task runs: few rows of many runs, so they are read from
# the failed task runs of these tasks (taskrun_failed: task, run), each joined to its run by key
# and kept when it is the workflow's in the range: the cost follows the failures, not the runs.
SELECT_FAILED = f"""
SELECT t.id, r.id, r.logical_date, t.task, t.map_index, t.state
FROM orchestrator_taskrun t JOIN orchestrator_run r ON r.id = t.run_id
WHERE t.task = ANY (%(tasks)s) AND t.state IN ({sql_list(FAILED_STATES)}) AND {{instances}}
  AND r.workflow_id = %(workflow)s AND r.logical_date >= %(lo)s AND r.logical_date < %(hi)s
  AND (r.logical_date > %(lo)s OR r.id > %(after)s) AND r.state <> '{RunState.PENDING}'
ORDER BY r.logical_date, r.id, t.task, t.map_index
LIMIT %(limit)s
"""


def _graph(run_id: int) -> dict[str, list[str]]:
    """{task: upstream} of a run, from its task rows (a mapped task's instances aside)."""
    return dict(TaskRun.objects.filter(run_id=run_id, map_index=-1).values_list("task", "upstream"))


def _walk(start: str, edges: dict[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for other in edges.get(stack.pop(), ()):
            if other not in seen:
                seen.add(other)
                stack.append(other)
    return seen


def scope_tasks(graph: dict[str, list[str]], task: str, scope: ClearScope) -> list[str]:
    """The task and, as the scope asks, its ancestors and its descendants in ``graph``."""
    tasks = {task}
    if scope.upstream:
        tasks |= _walk(task, graph)
    if scope.downstream:
        children: dict[str, list[str]] = {}
        for name, parents in graph.items():
            for parent in parents:
                children.setdefault(parent, []).append(name)
        tasks |= _walk(task, children)
    return sorted(tasks)


def _rows(sql: str, params: dict) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql.format(instances=INSTANCES), params)
        return cursor.fetchall()


def _walk_runs(params: dict, lo: datetime, hi: datetime, wanted: int, after: int = -1) -> list[tuple]:
    """Up to ``wanted`` task runs of the workflow's runs after (lo, ``after``) by (logical date,
    id) and before ``hi``, in date order (see SELECT_WALK and SELECT_FAILED)."""
    found: list[tuple] = []
    if params["only_failed"]:
        return _rows(SELECT_FAILED, {**params, "lo": lo, "hi": hi, "after": after, "limit": wanted})
    per_run = max(1, len(params["tasks"]))
    while len(found) < wanted:  # each batch moves the keyset past its runs; the range ends it
        batch = -(-(wanted - len(found)) // per_run)
        rows = _rows(SELECT_WALK, {**params, "lo": lo, "hi": hi, "after": after, "batch": batch})
        found += [row for row in rows if row[0] is not None]
        if len({row[1] for row in rows}) < batch:
            break
        lo, after = rows[-1][2], rows[-1][1]
    return found[:wanted]


def _select(*, runs: list[int], tasks: list[str], only_failed: bool, workflow=None, date=None, past=False,
            future=False, pick: str = "", pick_index: int = -1) -> ClearPlan:
    states = list(FAILED_STATES if only_failed else FINISHED_TASK_STATES)
    params = {"runs": runs, "workflow": workflow, "tasks": tasks, "states": states, "only_failed": only_failed,
              "pick": pick, "pick_index": pick_index}
    limit = MOST + 1
    # In date order: the past runs, the picked runs (at their date), the future runs.
    found = _walk_runs(params, datetime.min.replace(tzinfo=UTC), date, limit) if past else []
    if len(found) < limit:
        found += _rows(SELECT, {**params, "limit": limit - len(found)})
    if future and len(found) < limit:
        # After the picked date (an id above every id: no run of that date itself).
        found += _walk_runs(params, date, datetime.max.replace(tzinfo=UTC), limit - len(found), after=MAX_ID)
    rows = [{"id": row[0], "run": row[1], "logical_date": row[2], "task": row[3], "map_index": row[4],
             "state": row[5]} for row in found[:SHOWN]]
    if len(found) > MOST:
        return ClearPlan([], rows, len(found), len({row[1] for row in found}), tasks, too_many=True)
    return ClearPlan(sorted(row[0] for row in found), rows, len(found), len({row[1] for row in found}), tasks)


def plan_task_clear(task_run: TaskRun, scope: ClearScope) -> ClearPlan:
    """What clearing ``task_run`` with ``scope`` touches (nothing is changed)."""
    run = task_run.run
    tasks = scope_tasks(_graph(run.pk), task_run.task, scope)
    wide = (scope.past or scope.future) and run.workflow_id is not None
    return _select(runs=[run.pk], tasks=tasks, only_failed=scope.only_failed,
                   workflow=run.workflow_id if wide else None, date=run.logical_date,
                   past=wide and scope.past, future=wide and scope.future, pick=task_run.task,
                   pick_index=task_run.map_index)


def plan_run_clear(run_ids: list[int], *, only_failed: bool = False) -> ClearPlan:
    """What clearing every task of these runs (or only their failed ones) touches."""
    run_ids = sorted(set(run_ids))
    tasks = sorted(set(TaskRun.objects.filter(run_id__in=run_ids, map_index=-1).values_list("task", flat=True)))
    return _select(runs=run_ids, tasks=tasks, only_failed=only_failed)


def clear(plan: ClearPlan, *, now: datetime | None = None) -> list[int]:
    """Run again exactly the task runs of ``plan``; returns those cleared (the ones still finished)."""
    if plan.too_many:
        raise ClearError(f"this clear would touch more than {MOST:,} task runs: narrow it (only failed, fewer "
                         "runs, no past or future runs)")
    return control.clear_task_runs(plan.ids, downstream=False, now=now)


# --- What the audit log says of it ---------------------------------------------------------------

AUDIT_NAMES = 50  # ids an audit record lists (its count counts them all)


def audit_names(ids: list[int]) -> dict:
    """What an audit record says of the task runs an action changed: how many, the first ids,
    and the names of their tasks and their runs, so it reads without looking the ids up."""
    rows = list(TaskRun.objects.filter(pk__in=ids[:AUDIT_NAMES]).values_list("task", "run_id"))
    return {"count": len(ids), "changed": ids[:AUDIT_NAMES], "changed_tasks": sorted({task for task, _ in rows}),
            "runs": sorted({run_id for _, run_id in rows})}


def by_run(ids: list[int]) -> dict[int, list[int]]:
    """The task run ids, by run: one audit record per run of a bulk action."""
    found: dict[int, list[int]] = {}
    for task_run_id, run_id in TaskRun.objects.filter(pk__in=ids).values_list("id", "run_id").order_by("id"):
        found.setdefault(run_id, []).append(task_run_id)
    return found


# --- Marking whole runs -------------------------------------------------------------------------

# A run's task runs a mark changes: for succeeded, all but those that ended well; for failed, the
# unfinished ones. A mapped task's own row is left to its instances; an approval to its answer.
MARKABLE_OF_RUNS = f"""
SELECT t.id FROM orchestrator_taskrun t JOIN orchestrator_run r ON r.id = t.run_id
WHERE t.run_id = ANY (%(runs)s) AND t.state = ANY (%(states)s) AND r.state <> '{RunState.PENDING}'
  AND NOT (t.map_index = -1 AND t.spec ? 'map_over')
ORDER BY t.id LIMIT %(limit)s
"""

# A run that had ended well, marked failed with nothing left to mark: the run itself fails.
FAIL_SUCCEEDED_RUNS = f"""
UPDATE orchestrator_run SET state = '{RunState.FAILED}', reason = %(reason)s
WHERE id = ANY (%(runs)s) AND state = '{RunState.SUCCEEDED}'
RETURNING id
"""

# A run marked failed by hand (above) whose task runs all ended well, marked succeeded again.
SUCCEED_FAILED_RUNS = f"""
UPDATE orchestrator_run r SET state = '{RunState.SUCCEEDED}', reason = ''
WHERE r.id = ANY (%(runs)s) AND r.state = '{RunState.FAILED}'
  AND NOT EXISTS (SELECT 1 FROM orchestrator_taskrun t WHERE t.run_id = r.id
                  AND t.state NOT IN ({sql_list(SUCCESSFUL_TASK_STATES)}))
RETURNING id
"""

# A cancelled run marked succeeded decides again (its tasks are marked, then the resolver ends it).
REOPEN_CANCELLED = f"""
UPDATE orchestrator_run SET state = '{RunState.RUNNING}'
WHERE id = ANY (%(runs)s) AND state = '{RunState.CANCELLED}'
RETURNING id
"""

UNFINISHED = [state for state in MARKABLE_TASK_STATES if state not in FINISHED_TASK_STATES]
NOT_WELL = [state for state in MARKABLE_TASK_STATES if state not in (TaskState.SUCCEEDED, TaskState.SKIPPED)]


def marked_by(state: str, by) -> str:
    who = getattr(by, "username", None) or (str(by) if by else "")
    return f"marked {state} by {who}" if who else f"marked {state}"


def markable_of_runs(run_ids: list[int], state: str) -> list[int]:
    """The ids of the task runs that marking these runs ``state`` changes (at most MOST + 1)."""
    states = NOT_WELL if state == TaskState.SUCCEEDED else UNFINISHED
    with connection.cursor() as cursor:
        cursor.execute(MARKABLE_OF_RUNS, {"runs": sorted(set(run_ids)), "states": states, "limit": MOST + 1})
        return [row[0] for row in cursor.fetchall()]


def mark_runs(run_ids: list[int], state: str, *, by=None, now: datetime | None = None) -> dict:
    """Mark runs ``state`` (succeeded or failed): their task runs are marked (see the module doc)
    and the runs end by the resolver's rule. Returns {"task_runs": ids marked, "runs": ids of the
    runs that changed state}."""
    if state not in (TaskState.SUCCEEDED, TaskState.FAILED):
        raise ValueError(f"a run can be marked succeeded or failed, not {str(state)!r}")
    run_ids = sorted(set(run_ids))
    now = now or clock.now()
    before = dict(Run.objects.filter(pk__in=run_ids).values_list("id", "state"))
    ids = markable_of_runs(run_ids, state)
    if len(ids) > MOST:
        raise ClearError(f"marking these runs would change more than {MOST:,} task runs: mark fewer runs at once")
    with transaction.atomic(), connection.cursor() as cursor:
        resolver.lock_runs(cursor, run_ids)
        if state == TaskState.SUCCEEDED:
            cursor.execute(REOPEN_CANCELLED, {"runs": run_ids})
        marked = control.mark_task_runs(ids, state, by=by, now=now)
        resolver.resolve_runs(run_ids, now=now)
        if state == TaskState.FAILED:
            cursor.execute(FAIL_SUCCEEDED_RUNS, {"runs": run_ids, "reason": marked_by(state, by)})
        else:
            cursor.execute(SUCCEED_FAILED_RUNS, {"runs": run_ids})
    after = dict(Run.objects.filter(pk__in=run_ids).values_list("id", "state"))
    return {"task_runs": marked, "runs": [run_id for run_id in run_ids if after.get(run_id) != before.get(run_id)]}
