"""What the pages, the API and ``/metrics`` read: runs matching filters, the dead-letter queue,
queue depths, and keyset pages of any of them. Every face asks these functions, so one question
gets one answer, through one index, wherever it is asked.

| question | read | index |
|---|---|---|
| runs of a workflow, by state, trigger, logical date, creation time | ``runs()`` | ``run_of_workflow`` (workflow, -id), else ``run_by_state``, ``run_by_trigger`` or the primary key, newest first |
| dead task runs, by workflow, queue, error, time of death | ``dead_letters()`` | ``taskrun_dead`` (finished_at) where state = dead, the last to die first |
| how many are dead | ``dead_letter_count()`` | ``taskrun_dead`` |
| queue depths: queued, due, running, per queue | ``queue_depths()`` | the queued, due and running partial indexes |
| a run's counts: its tasks by state, each mapped task's instances by state | ``run_counts()`` | ``taskruncount_run``: the counts kept as task runs change state (``counts.py``) |
| a run's tasks (not instances), a page at a time in creation order | ``run_tasks()`` | ``taskrun_tasks_of_run`` (run, id) where map_index = -1 |
| a run's task runs by task and map index, of a task, of a state | ``run_task_runs()`` | ``taskrun_unique_task`` (run, task, map_index), ``taskrun_run_state`` with a state |

A workflow is named by id, resolved from its name once (``workflow_id``): the planner then sees
one ``workflow_id`` and walks that workflow's index instead of joining a million rows.

**Queue depth** is the work a worker could start now and has not: task runs ``queued`` (admitted
under a limit) and ``scheduled`` whose ``due_at`` has come, the very condition of the workers'
claim (``due.py``). A task run scheduled for later (a retry's backoff, a delayed job, a sensor's
next check) is not in the queue yet: it waits for its time, not for a worker, and counting it
would make a queue of delayed jobs look like workers falling behind. A scheduled row without a
``due_at`` is never claimed, so it is not counted either (no writer leaves one).

**A run at any size** (a run of 100,000 task runs, or a map over 100,000 items): what its page and
the API show is counted in SQL and paged, so no statement returns a row per task run. Its counts
are kept as its task runs change state (``counts.py``), so reading them reads a few dozen rows,
not an index entry per task run (614 index pages for 100,000 task runs when they were counted
from ``taskrun_run_state``).

**Keyset pages** (``Keyset``): newest first by id, or by a time column and id; a page is one
indexed query of at most ``size + 1`` rows, with no COUNT and no OFFSET, so the millionth row
costs what the first does. A cursor names the row a page starts after: ``older.<id>`` or
``newer.<id>``, and ``older.<microseconds since 1970>.<id>`` for a list ordered by time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Case, Count, F, JSONField, Q, QuerySet, Value, When

from orchestrator.counts import run_counts as count_rows
from orchestrator.limits import PAGE_SIZE
from orchestrator.models import Run, TaskRun, Workflow
from orchestrator.states import TaskState, Trigger

ANY = object()  # a filter left out
NO_WORKFLOW = object()  # the runs (and dead task runs) of one-off jobs, which have no workflow


def workflow_id(name: str) -> int | None:
    """The id of the workflow named ``name``, or None (PostgreSQL text cannot hold NUL, so no
    workflow has such a name, and asking would be a DataError)."""
    if "\x00" in name:
        return None
    return Workflow.objects.filter(name=name).values_list("id", flat=True).first()


# --- runs ----------------------------------------------------------------------------------------


def runs(*, workflow=ANY, state: str | None = None, trigger: str | None = None,
         logical_from: datetime | None = None, logical_before: datetime | None = None,
         created_from: datetime | None = None, created_before: datetime | None = None) -> QuerySet[Run]:
    """The runs matching every filter given, not yet ordered or paged (page them with
    ``RUN_ORDER``). ``workflow`` is a workflow's id, ``NO_WORKFLOW`` for jobs, or None for a
    workflow that does not exist (no runs); times are instants, ``_from`` inclusive and ``_before``
    exclusive."""
    rows = _of_workflow(Run.objects.all(), "workflow", workflow)
    for lookup, value in (("state", state), ("trigger", trigger), ("logical_date__gte", logical_from),
                          ("logical_date__lt", logical_before), ("created_at__gte", created_from),
                          ("created_at__lt", created_before)):
        if value:
            rows = rows.filter(**{lookup: value})
    return rows


def _of_workflow(rows: QuerySet, field: str, workflow) -> QuerySet:
    if workflow is ANY:
        return rows
    if workflow is NO_WORKFLOW:
        return rows.filter(**{f"{field}__isnull": True})
    if workflow is None:
        return rows.none()
    return rows.filter(**{f"{field}_id": workflow})


# --- the dead-letter queue -----------------------------------------------------------------------

# Through the taskrun_dead partial index, which holds exactly the dead rows.
DEAD_LETTER_COUNT_SQL = f"SELECT count(*) FROM orchestrator_taskrun WHERE state = '{TaskState.DEAD}'"


def dead_letters(*, workflow=ANY, queue: str | None = None, error: str | None = None,
                 died_from: datetime | None = None, died_before: datetime | None = None) -> QuerySet[TaskRun]:
    """The dead task runs matching every filter given (``workflow`` as in ``runs``; ``error`` a
    part of the error, any case), not yet ordered or paged: page them with ``DEAD_LETTER_ORDER``."""
    # The run's workflow_id (a task run has none of its own), not a join on the workflow's name.
    rows = _of_workflow(TaskRun.objects.filter(state=TaskState.DEAD), "run__workflow", workflow)
    for lookup, value in (("queue", queue), ("error__icontains", error), ("finished_at__gte", died_from),
                          ("finished_at__lt", died_before)):
        if value:
            rows = rows.filter(**{lookup: value})
    return rows


def dead_letter_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute(DEAD_LETTER_COUNT_SQL)
        return cursor.fetchone()[0]


# --- queue depths --------------------------------------------------------------------------------

# UNION ALL keeps each branch on its own partial index (taskrun_queued, taskrun_due_by_queue,
# taskrun_running); "due" is the claim's own condition (see the module's docstring).
QUEUE_DEPTH_SQL = f"""
    SELECT queue, '{TaskState.QUEUED}', count(*) FROM orchestrator_taskrun
     WHERE state = '{TaskState.QUEUED}' GROUP BY queue
    UNION ALL
    SELECT queue, 'due', count(*) FROM orchestrator_taskrun
     WHERE state = '{TaskState.SCHEDULED}' AND due_at <= %(now)s GROUP BY queue
    UNION ALL
    SELECT queue, '{TaskState.RUNNING}', count(*) FROM orchestrator_taskrun
     WHERE state = '{TaskState.RUNNING}' GROUP BY queue
"""


@dataclass
class Depth:
    """One queue's work: ``queued`` and ``due`` wait for a worker (their sum is the queue's depth),
    ``running`` has one."""

    queued: int = 0
    due: int = 0
    running: int = 0

    @property
    def waiting(self) -> int:
        return self.queued + self.due


def queue_depths(now: datetime) -> dict[str, Depth]:
    """{queue: Depth} of every queue that has work queued, due or running at ``now``."""
    depths: dict[str, Depth] = {}
    with connection.cursor() as cursor:
        cursor.execute(QUEUE_DEPTH_SQL, {"now": now})
        for queue, kind, count in cursor.fetchall():
            setattr(depths.setdefault(queue, Depth()), kind, count)
    return depths


def queue_depths_of(task_runs: QuerySet[TaskRun], now: datetime) -> dict[str, Depth]:
    """``queue_depths`` of some task runs only (those a user with rights on some tenants may read):
    one grouped count over them, the same three conditions."""
    depths: dict[str, Depth] = {}
    rows = (task_runs.filter(Q(state__in=[TaskState.QUEUED, TaskState.RUNNING]) |
                             Q(state=TaskState.SCHEDULED, due_at__lte=now))
            .values("queue", "state").annotate(n=Count("id")).order_by())
    for row in rows:
        kind = "due" if row["state"] == TaskState.SCHEDULED else row["state"]
        setattr(depths.setdefault(row["queue"], Depth()), kind, row["n"])
    return depths


# --- a run's task runs, at any size ------------------------------------------------------------

@dataclass
class RunCounts:
    tasks: dict[str, int]  # the run's tasks by state: a mapped task once, in its own row's state
    instances: dict[str, dict[str, int]]  # {mapped task: {state: its instances in that state}}

    @property
    def total_tasks(self) -> int:
        return sum(self.tasks.values())


def run_counts(run: Run | int) -> RunCounts:
    """A run's tasks (map_index -1: its ordinary tasks and its mapped tasks' own rows) by state,
    and each mapped task's instances by state, from the counts kept as they change
    (``counts.py``): a few dozen rows read, whatever the run's size. A job's run (its one task
    run is not counted) reads its task run; given the run rather than its id, no look-up of its
    trigger is needed."""
    counts = RunCounts({}, {})
    if isinstance(run, Run):
        rows = count_rows(run.pk, job=run.trigger == Trigger.JOB)
    else:
        rows = count_rows(run)
    for mapped_task, state, n in rows:
        if mapped_task is None:
            counts.tasks[state] = n
        else:
            counts.instances.setdefault(mapped_task, {})[state] = n
    return counts


def run_tasks(run_id: int, after: int | None = None, size: int = PAGE_SIZE) -> tuple[list[TaskRun], int | None]:
    """A page of the run's tasks (not its mapped tasks' instances) in the order they were created
    (the graph's order, as the run created them), from the one after task run ``after``; and the
    id to ask the next page after, when there is one."""
    # The run as a range of one, ordered by (run, id): the order of taskrun_tasks_of_run and of no
    # other index. Written as "run_id = x ORDER BY id", the primary key has that order too, and the
    # planner, who cannot know how few of the table's rows have map_index -1 in one run (a map
    # over 100,000 items has one), may walk the whole primary key to find them.
    # Not the result: a mapped task's is the list of its instances' results.
    rows = TaskRun.objects.filter(run_id__gte=run_id, run_id__lte=run_id, map_index=-1).defer("result")
    if after is not None:
        rows = rows.filter(id__gt=after)
    page = list(rows.order_by("run_id", "id")[: size + 1])
    return page[:size], (page[size - 1].pk if len(page) > size else None)


def listed_result(rows: QuerySet[TaskRun]) -> QuerySet[TaskRun]:
    """These task runs with their result as ``listed_result``, but for a mapped task's own task run,
    whose result (every instance's, in one list) is not read: null, its instances have theirs."""
    return rows.defer("result").annotate(listed_result=Case(
        When(map_index=-1, spec__has_key="map_over", then=Value(None, output_field=JSONField())),
        default=F("result")))


def run_task_runs(run_id: int, *, task: str | None = None, state: str | None = None,
                  after: tuple[str, int] | None = None, size: int = PAGE_SIZE) -> tuple[list[TaskRun], bool]:
    """A page of the run's task runs (instances too) by task name and map index, of one task and
    one state when given, after the (task, map index) ``after``; and whether more follow. The row
    comparison bounds the index scan where the page starts, however deep the page."""
    # A mapped task's own result is the list of all its instances' results: not on a page of rows
    # (``listed_result`` is null for it; the task run's own answer has it).
    rows = listed_result(TaskRun.objects.filter(run_id=run_id))
    if task is not None:
        rows = rows.filter(task=task)
    if state is not None:
        rows = rows.filter(state=state)
    if after is not None:
        rows = rows.extra(where=["(task, map_index) > (%s, %s)"], params=list(after))
    page = list(rows.order_by("task", "map_index")[: size + 1])
    return page[:size], len(page) > size


# --- keyset pages --------------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ID = "[0-9]{1,18}"  # 18 digits: every value fits a bigint
_MICROSECONDS = "[0-9]{1,17}"  # 17 digits: every value is a date before the year 5000


@dataclass(frozen=True)
class Cursor:
    older: bool  # the rows after the key in the list's order (older), or the rows before it
    key: tuple


@dataclass
class Page:
    rows: list
    older: Cursor | None  # where the next page (older rows) starts, when there is one
    newer: Cursor | None  # where the previous page (newer rows) starts, when there is one


@dataclass(frozen=True)
class Keyset:
    """A list's order, newest first: by ``time_field`` then id, or by id alone."""

    time_field: str | None = None

    @property
    def pattern(self) -> str:
        return rf"^(older|newer)\.{_MICROSECONDS}\.{_ID}$" if self.time_field else rf"^(older|newer)\.{_ID}$"

    @property
    def example(self) -> str:
        return "older.1767225600000000.42" if self.time_field else "older.42"

    def parse(self, text: str) -> Cursor | None:
        """The cursor ``text`` spells, or None when it is not one (say so to whoever sent it)."""
        if not re.fullmatch(self.pattern, text):
            return None
        direction, *numbers = text.split(".")
        if self.time_field:
            return Cursor(direction == "older", (_EPOCH + timedelta(microseconds=int(numbers[0])), int(numbers[1])))
        return Cursor(direction == "older", (int(numbers[0]),))

    def text(self, cursor: Cursor) -> str:
        direction = "older" if cursor.older else "newer"
        if self.time_field:
            at, pk = cursor.key
            return f"{direction}.{(at - _EPOCH) // timedelta(microseconds=1)}.{pk}"
        return f"{direction}.{cursor.key[0]}"

    def key(self, row) -> tuple:
        if self.time_field:
            # A dead task run always has its finished_at; a row without one (edited by hand) gets a
            # cursor rather than a crash.
            return getattr(row, self.time_field) or _EPOCH, row.pk
        return (row.pk,)

    def _past(self, cursor: Cursor) -> Q:
        """The rows past the cursor's key, in its direction (a row comparison, spelled out for the ORM)."""
        op = "lt" if cursor.older else "gt"
        if self.time_field:
            at, pk = cursor.key
            # (time < at) OR (time = at AND id < pk), spelled so that "time <= at" bounds the index
            # scan where the page starts; spelled as the OR alone, every page would walk the index
            # from its newest row to the cursor (page 7 of the dead-letter queue read 353 rows).
            return Q(**{f"{self.time_field}__{op}e": at}) & (Q(**{f"{self.time_field}__{op}": at}) |
                                                             Q(**{f"pk__{op}": pk}))
        return Q(**{f"pk__{op}": cursor.key[0]})

    def _order(self, newest_first: bool) -> list[str]:
        sign = "-" if newest_first else ""
        return [f"{sign}{self.time_field}", f"{sign}id"] if self.time_field else [f"{sign}id"]

    def page(self, queryset: QuerySet, cursor: Cursor | None = None, size: int = PAGE_SIZE) -> Page:
        """The ``size`` rows past ``cursor`` (the newest without one), newest first. One row more than
        the page tells whether another page follows; the cursor's own side has rows when the page
        has any (the cursor's row is there)."""
        if cursor is not None:
            queryset = queryset.filter(self._past(cursor))
        newest_first = cursor is None or cursor.older
        rows = list(queryset.order_by(*self._order(newest_first))[: size + 1])
        more = len(rows) > size
        rows = rows[:size]
        if not newest_first:
            rows.reverse()
        has_older = bool(rows) and (more if newest_first else True)
        has_newer = bool(rows) and (cursor is not None if newest_first else more)
        return Page(rows, Cursor(True, self.key(rows[-1])) if has_older else None,
                    Cursor(False, self.key(rows[0])) if has_newer else None)


BY_ID = Keyset()
RUN_ORDER = BY_ID
DEAD_LETTER_ORDER = Keyset("finished_at")  # the last to die first, on the taskrun_dead index
