"""The scheduler: turns cron schedules into runs, exactly once per fire time.

``Scheduler.tick()`` is one bounded unit of work, called in a loop by ``manage.py scheduler``
(and directly by tests, with a FakeClock). While this process holds the lease it

1. reads the schedules whose ``next_fire_at`` has come (the ``schedule_due`` index), in batches
   locked with ``FOR UPDATE SKIP LOCKED``, works out their fire times with ``cron.fire_times``,
   applies the missed-run (catchup), start-deadline and overlap policies, admission
   (``admission.py``: max_active_runs) and jitter, inserts the runs with ``ON CONFLICT DO NOTHING`` on (schedule, logical_date) and
   advances ``next_fire_at``, all in one transaction per batch that first checks the lease;
2. records as missed the runs whose first task has not started within their start deadline;
3. starts the held-back (pending) runs that may start now (``admission.releasable``);
4. starts the runs of workflows triggered by new dataset events (``datasets.py``), records runs
   that missed their deadline and cancels runs past their run timeout (``deadlines.py``);
5. runs the leader-only maintenance jobs (``MAINTENANCE``).

Two schedulers that both believe they lead cannot create a run twice: the unique constraint on
(schedule, logical_date) decides, and the row locks keep them from even trying most of the time.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Min

from orchestrator import admission, approvals, control, cron, datasets, deadlines
from orchestrator.channels import SCHEDULES_CHANNEL, wake_due
from orchestrator.clock import system
from orchestrator.conf import app_settings
from orchestrator.control import cancel_run
from orchestrator.lease import LeaderLease, LeaseLost, NoLease
from orchestrator.loop import DATABASE_ERRORS, Loop, Role, Together
from orchestrator.models import Run, Schedule, TaskRun, WorkflowVersion
from orchestrator.params import ParamError, clean_params
from orchestrator.reaper import reap_once
from orchestrator.retention import prune
from orchestrator.runs import NewRun, insert_runs, release_pending_run
from orchestrator.states import ACTIVE_RUN_STATES, Lane, RunState, TaskState, Trigger, sql_list

log = logging.getLogger(__name__)


# With catchup "none", a fire time counts as missed (and is not run) once it is this old: a
# scheduler that is merely busy or just took over still starts the current one.
MISSED_AFTER = timedelta(seconds=60)
# Every fire time the catchup policy does not run is recorded as a skipped run with the reason, but
# at most this many per schedule and tick; older ones of a long gap (a schedule paused for a year)
# become one summary row, so the run table is never flooded.
MAX_SKIPPED_RECORDS = 1000
MAX_SLEEP = 1.0  # standbys retry the lease, and leaders look for work, at least this often
# How far back from now a long-overdue schedule's fire times are first looked for (then 8x, 64x, ...).
LOOKBACK = timedelta(hours=1)


# --- SQL ---------------------------------------------------------------------------------------

# Active scheduled runs that have not started by fire time + start deadline: candidates to be
# recorded as missed. Locked, skipping runs another transaction holds (a worker claiming one).
UNSTARTED_PAST_DEADLINE = f"""
SELECT r.id, s.start_deadline FROM orchestrator_run r
  JOIN orchestrator_schedule s ON s.id = r.schedule_id
 WHERE r.state IN ({sql_list(ACTIVE_RUN_STATES)}) AND r.trigger = '{Trigger.SCHEDULE}'
   AND r.started_at IS NULL AND s.start_deadline IS NOT NULL
   AND r.logical_date + make_interval(secs => s.start_deadline) < %s
   AND NOT EXISTS (SELECT 1 FROM orchestrator_taskrun t WHERE t.run_id = r.id
                      AND t.started_at IS NOT NULL)
 ORDER BY r.id LIMIT 500
 FOR UPDATE OF r SKIP LOCKED
"""

# The task runs are locked first: a worker claiming one right now either committed before (and
# the run counts as started below) or waits and then finds it cancelled.
LOCK_TASK_RUNS_OF = "SELECT 1 FROM orchestrator_taskrun WHERE run_id = ANY(%s) FOR UPDATE"

NOT_STARTED = (TaskState.WAITING, TaskState.SCHEDULED, TaskState.QUEUED, TaskState.CANCELLED)
# Of those runs, the ones that started after all (a task started, or ended some other way).
STARTED_AFTER_ALL = f"""
SELECT run_id FROM orchestrator_taskrun WHERE run_id = ANY(%s)
   AND (started_at IS NOT NULL OR state NOT IN ({sql_list(NOT_STARTED)}))
"""


# ---------------------------------------------------------------------------------------------
# Leader maintenance: (name, interval in seconds, callable taking the clock). Each is imported at
# call time so a missing or failing module never stops the scheduler.


def _reap(clock):

    return reap_once(clock=clock)


def _prune(clock):

    # Bounded (at most 5,000 runs a call, about a second) so that the loop gets back to renewing the
    # lease in time; every five minutes that still removes well over a million runs a day.
    return prune(timedelta(days=app_settings.RETENTION_DAYS), clock=clock, max_batches=5)


MAINTENANCE: list[tuple[str, float, object]] = [
    ("reaper", 5.0, _reap),
    ("retention", 300.0, _prune),
]


def _advance(rows: list[tuple[int, datetime | None, datetime | None]]) -> None:
    """Set next_fire_at/last_fire_at of a whole batch with one UPDATE … FROM unnest(…)."""
    if not rows:
        return
    ids, next_at, last_at = (list(column) for column in zip(*rows, strict=True))
    with connection.cursor() as cursor:
        # In the batch's transaction, with its runs: a crash leaves both or neither, so a fire
        # time is never advanced past without its run, nor run twice.
        cursor.execute(
            "UPDATE orchestrator_schedule AS s SET next_fire_at = v.next_at,"
            " last_fire_at = COALESCE(v.last_at, s.last_fire_at), updated_at = now()"
            " FROM unnest(%s::bigint[], %s::timestamptz[], %s::timestamptz[]) AS v(id, next_at, last_at)"
            " WHERE s.id = v.id",
            [ids, next_at, last_at],
        )


# ---------------------------------------------------------------------------------------------
# The scheduler


def fmt(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass
class _Gap:
    """Fire times passed over beyond MAX_SKIPPED_RECORDS, recorded as one summary row."""

    first: datetime  # the first fire time not handled (the schedule's next_fire_at)
    before: datetime  # the gap ends before this fire time, the oldest one recorded on its own
    count: int | None  # None: too many to count


@dataclass
class _Due:
    fires: list[datetime]  # the fire times to act on now, oldest first
    passed_over: list[datetime]  # not run by the catchup policy: a skipped run each, with the reason
    gap: _Gap | None  # older fire times passed over: one summary row
    last: datetime | None  # the latest fire time that came due
    next_at: datetime | None


class Scheduler:
    def __init__(self, clock=None, holder: str | None = None, *, lease=None, use_lease: bool = True,
                 batch_size: int = 1000, max_batches: int = 20, maintenance=None):
        self.clock = clock or system
        if lease is None:
            lease = LeaderLease(holder=holder) if use_lease else NoLease(holder=holder)
        self.lease = lease
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.maintenance = MAINTENANCE if maintenance is None else maintenance
        self._maintained: dict[str, datetime] = {}
        self.created = 0  # runs this process inserted, for its log

    @property
    def holder(self) -> str:
        return self.lease.holder

    def tick(self) -> bool:
        if not self.lease.ensure():
            return False
        now = self.clock.now()
        did = False
        try:
            for _ in range(self.max_batches):
                # A long tick (thousands of due schedules) keeps renewing between batches.
                if not self.lease.ensure():
                    return did
                handled = self._fire_batch(now)
                did = did or handled > 0
                if handled < self.batch_size:
                    break
            did = self._expire_unstarted(now) > 0 or did
            did = self._release_pending(now) > 0 or did
            did = self._data_and_deadlines(now) > 0 or did
        except LeaseLost as exc:
            log.warning("stopped writing: %s", exc, extra={"action": "lease_lost"})
            return did
        self._run_maintenance(now)
        return did

    def seconds_until_due(self, now: datetime | None = None) -> float | None:
        """Seconds until the earliest schedule comes due (None: nothing scheduled)."""
        now = now or self.clock.now()
        earliest = _runnable_schedules().aggregate(at=Min("next_fire_at"))["at"]
        if earliest is None:
            return None
        return max(0.0, (earliest - now).total_seconds())

    # -- 1. fire due schedules -----------------------------------------------------------------

    def _fire_batch(self, now: datetime) -> int:
        with self.lease.fence():
            schedules = list(
                _runnable_schedules().filter(next_fire_at__lte=now)
                .select_related("workflow").select_for_update(skip_locked=True, of=("self",))
                .order_by("next_fire_at")[: self.batch_size]
            )
            if not schedules:
                return 0
            versions = {v.pk: v for v in WorkflowVersion.objects.filter(
                pk__in={s.workflow.current_version_id for s in schedules})}
            active = _active_runs_by_schedule([s.pk for s in schedules if s.overlap != Schedule.Overlap.ALLOW])
            door = admission.Door(s.workflow for s in schedules)
            new_runs: list[NewRun] = []
            advance = []
            for schedule in schedules:
                due = self._due(schedule, now)
                advance.append((schedule.pk, due.next_at, due.last))
                if due.fires or due.passed_over or due.gap:
                    version = versions[schedule.workflow.current_version_id]
                    new_runs.extend(self._plan(schedule, version, due, active[schedule.pk], door, now))
            created = insert_runs(new_runs, now)
            _advance(advance)
            self.created += len(created)
            if created:
                states = Counter(entry.run.state for entry in created)
                log.info("created %d runs for %d schedules (%s)", len(created), len(schedules),
                         ", ".join(f"{n} {state}" for state, n in sorted(states.items())),
                         extra={"action": "runs_created", "count": len(created), "holder": self.holder})
            return len(schedules)

    def _due(self, schedule: Schedule, now: datetime) -> _Due:
        """Every fire time from the schedule's next_fire_at up to now, split by the catchup
        policy into those to run and those passed over (each recorded, see ``_plan``)."""
        runnable = _catchup_runs(schedule)
        begin = schedule.next_fire_at
        try:
            fires, total, next_at, truncated = _recent_fire_times(schedule, begin, now,
                                                                  keep=runnable + MAX_SKIPPED_RECORDS)
        except cron.CronError as exc:
            # Only reachable through a hand-edited row: the forms and sync validate. Stop it firing.
            log.error("schedule %s cannot fire: %s", schedule, exc, extra={"action": "schedule_invalid"})
            return _Due([], [], None, None, None)
        last = fires[-1]
        if schedule.catchup == Schedule.Catchup.NONE and now - last > MISSED_AFTER:
            runnable = 0  # even the latest is too late
        split = max(0, len(fires) - runnable)
        gap = None
        if truncated or total > len(fires):
            gap = _Gap(begin, fires[0], None if truncated else total - len(fires))
        return _Due(fires[split:], fires[:split], gap, last, next_at)

    def _plan(self, schedule, version, due: _Due, active: list, door, now) -> list[NewRun]:
        """The runs of one schedule's due fire times, in named steps: what the catchup policy passes
        over, what missed its start deadline, what bad params stop, what overlap=replace
        supersedes; the rest start, or wait for a buffer_one slot or for admission."""
        rows = _Rows(schedule, version)
        planned = self._passed_over(rows, due, now)
        startable = []
        for at in due.fires:
            late = (now - at).total_seconds()
            if schedule.start_deadline is not None and late > schedule.start_deadline:
                planned.append(rows.not_run(at, RunState.MISSED, (
                    f"not started within the start deadline of {schedule.start_deadline}s: "
                    f"the scheduler reached this fire time {late:.0f}s late")))
            else:
                startable.append(at)
        if not startable:
            return planned
        try:
            params = clean_params(version.spec.get("params", {}), schedule.params)
        except ParamError as exc:
            reason = f"the schedule's params are invalid: {exc}"
            return planned + [rows.not_run(at, RunState.SKIPPED, reason) for at in startable]
        if schedule.overlap == Schedule.Overlap.REPLACE and len(startable) > 1:
            reason = f"superseded by the later fire time {fmt(startable[-1])} (overlap=replace)"
            planned += [rows.not_run(at, RunState.SKIPPED, reason) for at in startable[:-1]]
            startable = startable[-1:]
        return planned + [self._start(rows, at, active, door, params) for at in startable]

    def _passed_over(self, rows: _Rows, due: _Due, now: datetime) -> list[NewRun]:
        """A skipped run, with the reason, for each fire time the catchup policy does not run; one
        summary row for the older ones of a long gap."""
        schedule = rows.schedule
        planned = [rows.not_run(at, RunState.SKIPPED, _passed_over_reason(schedule, at, due, now))
                   for at in due.passed_over]
        if due.gap:
            gap = due.gap
            count = "more than a thousand" if gap.count is None else str(gap.count)
            reason = (f"{count} fire times from {fmt(gap.first)} until before {fmt(gap.before)} were not run: "
                      f"{_policy_words(schedule)}; this one row stands for all of them")
            planned.append(rows.not_run(gap.first, RunState.SKIPPED, reason))
        if planned:
            log.info("schedule %s: %d fire times not run (catchup=%s)%s", schedule, len(due.passed_over),
                     schedule.catchup, f", and a gap of {count} more before {fmt(gap.before)}" if due.gap else "",
                     extra={"action": "fire_times_skipped", "schedule_id": schedule.pk})
        return planned

    def _start(self, rows: _Rows, at: datetime, active: list, door, params: dict) -> NewRun:
        """A run of a startable fire time: running, or pending (buffer_one, or as admission
        decides), or skipped (overlap=forbid); ``active`` and ``door`` then count it."""
        schedule, workflow = rows.schedule, rows.schedule.workflow
        overlap = schedule.overlap
        if overlap == Schedule.Overlap.FORBID and active:
            previous = active[-1]
            label = f"run #{previous['id']}" if previous.get("id") else f"the run of {fmt(previous['at'])}"
            return rows.not_run(at, RunState.SKIPPED, f"{label} is still {previous['state']} (overlap=forbid)")
        if overlap == Schedule.Overlap.REPLACE and active:
            _cancel_replaced(active, at)
            active.clear()
        if overlap == Schedule.Overlap.BUFFER_ONE and active:
            if any(r["state"] == RunState.PENDING for r in active):
                return rows.not_run(at, RunState.SKIPPED, "a run is already waiting for the active one (overlap=buffer_one)")
            # Held by its schedule, not waiting for room: admission is asked when it is released.
            state, reason = RunState.PENDING, "waiting for the active run of this schedule to end (overlap=buffer_one)"
        else:
            decision = door.admit(workflow, Lane.LIVE)
            state, reason = decision.state, decision.reason
        active.append({"id": None, "state": state, "at": at})
        return rows.to_run(at, state, reason, params)

    # -- 2. start deadline of created runs ------------------------------------------------------

    def _expire_unstarted(self, now: datetime) -> int:
        """Runs created in time whose first task has still not started by fire time + deadline
        are missed: their waiting task runs are cancelled."""
        with self.lease.fence():
            with connection.cursor() as cursor:
                cursor.execute(UNSTARTED_PAST_DEADLINE, [now])
                candidates = dict(cursor.fetchall())
                if not candidates:
                    return 0
                cursor.execute(LOCK_TASK_RUNS_OF, [list(candidates)])
                cursor.execute(STARTED_AFTER_ALL, [list(candidates)])
                started = {row[0] for row in cursor.fetchall()}
            missed = [pk for pk in candidates if pk not in started]
            if not missed:
                return 0
            TaskRun.objects.filter(run_id__in=missed, state__in=[
                TaskState.WAITING, TaskState.SCHEDULED, TaskState.QUEUED,
            ]).update(state=TaskState.CANCELLED, finished_at=now, error="the run missed its start deadline")
            count = 0
            for pk in missed:
                reason = f"no task started within the start deadline of {candidates[pk]}s of the fire time"
                count += Run.objects.filter(pk=pk, state__in=ACTIVE_RUN_STATES).update(
                    state=RunState.MISSED, reason=reason, finished_at=now)
            if count:
                log.info("%d runs missed their start deadline", count, extra={"action": "runs_missed"})
            return count

    # -- 3. release held-back runs -----------------------------------------------------------

    def _release_pending(self, now: datetime) -> int:
        with self.lease.fence():
            ids = admission.releasable()
            if not ids:
                return 0
            runs = Run.objects.filter(pk__in=ids).only("id", "version_id", "state").in_bulk()
            released = sum(release_pending_run(runs[pk], now=now) for pk in ids)
            if released:
                wake_due()
                log.info("released %d pending runs", released, extra={"action": "runs_released"})
            return released

    # -- 4. data triggers, run deadlines and run timeouts ---------------------------------------

    def _data_and_deadlines(self, now: datetime) -> int:

        with self.lease.fence():
            done = datasets.trigger_consumers(now)
            done += deadlines.record_misses(now)
            done += control.cancel_timed_out(now)
            done += approvals.expire(now)
        return done

    # -- 5. maintenance ------------------------------------------------------------------------

    def _run_maintenance(self, now: datetime) -> None:
        for name, interval, job in self.maintenance:
            last = self._maintained.get(name)
            if last is not None and (now - last).total_seconds() < interval:
                continue
            self._maintained[name] = now
            try:
                job(self.clock)
            except Exception:  # a maintenance job must never take the scheduler down
                log.exception("maintenance job %s failed", name, extra={"action": "maintenance_failed", "job": name})


class _Rows:
    """Run rows of one schedule and version."""

    def __init__(self, schedule: Schedule, version: WorkflowVersion):
        self.schedule = schedule
        self.version = version
        self.jitter = timedelta(seconds=cron.jitter_offset(f"{schedule.pk}", schedule.jitter))

    def run(self, at: datetime, state: str, reason: str = "", params: dict | None = None) -> Run:
        workflow = self.schedule.workflow
        return Run(workflow=workflow, version=self.version, schedule=self.schedule, logical_date=at,
                   trigger=Trigger.SCHEDULE, params=params or {}, tenant=workflow.tenant, state=state, reason=reason)

    def not_run(self, at: datetime, state: str, reason: str) -> NewRun:
        """A recorded fire time that never starts (skipped or missed): no task runs."""
        return NewRun(self.run(at, state, reason), {})

    def to_run(self, at: datetime, state: str, reason: str, params: dict) -> NewRun:
        return NewRun(self.run(at, state, reason if state != RunState.RUNNING else "", params),
                      self.version.spec["tasks"], at + self.jitter, admitted=True)


def _catchup_runs(schedule: Schedule) -> int:
    """How many of the most recent due fire times the catchup policy runs."""
    if schedule.catchup == Schedule.Catchup.ALL:
        return schedule.max_catchup or app_settings.MAX_CATCHUP_RUNS
    return 1


def _recent_fire_times(schedule: Schedule, begin: datetime, now: datetime, keep: int):
    """The last ``keep`` fire times in [begin, now], how many there were, the next one after
    now, and whether the count was cut short (too many to count)."""
    window = LOOKBACK
    while True:
        if now - window <= begin:
            fires, total, next_at = _walk(schedule, [begin], begin, now, keep)
            return fires, total, next_at, False
        # Long overdue (a schedule paused for months): only the most recent fire times can
        # matter, so look back from now in growing windows instead of walking from `begin`.
        fires, total, next_at = _walk(schedule, [], now - window, now, keep)
        if len(fires) == keep:
            return fires, total, next_at, True
        window *= 8


def _policy_words(schedule: Schedule) -> str:
    if schedule.catchup == Schedule.Catchup.ALL:
        cap = _catchup_runs(schedule)
        return f"over the catchup limit of {cap} missed runs (catchup=all runs the {cap} most recent)"
    if schedule.catchup == Schedule.Catchup.LATEST:
        return "catchup=latest runs only the most recent missed fire time"
    return f"catchup=none runs no fire time reached more than {MISSED_AFTER.total_seconds():.0f}s late"


def _passed_over_reason(schedule: Schedule, at: datetime, due: _Due, now: datetime) -> str:
    if schedule.catchup == Schedule.Catchup.NONE:
        return (f"the scheduler reached this fire time {(now - at).total_seconds():.0f}s late, and "
                f"{_policy_words(schedule)}")
    if schedule.catchup == Schedule.Catchup.LATEST:
        return f"missed: {_policy_words(schedule)} ({fmt(due.last)})"
    return _policy_words(schedule)


def _walk(schedule: Schedule, first: list, after: datetime, now: datetime, keep: int):
    """The last `keep` fire times in (after, now] (plus `first`), how many there were, and the next
    fire time after now."""
    fires: deque[datetime] = deque(first, maxlen=keep)
    total, next_at = len(first), None
    for at in cron.fire_times(schedule.cron, schedule.timezone, after):
        if at > now:
            next_at = at
            break
        fires.append(at)
        total += 1
    return list(fires), total, next_at


def _runnable_schedules():
    return Schedule.objects.filter(
        paused=False, next_fire_at__isnull=False, workflow__paused=False, workflow__present=True,
        workflow__current_version__isnull=False,
    )


def _active_runs_by_schedule(schedule_ids: list[int]) -> dict[int, list[dict]]:
    active: dict[int, list[dict]] = defaultdict(list)
    if schedule_ids:
        rows = (Run.objects.filter(schedule_id__in=schedule_ids, state__in=ACTIVE_RUN_STATES)
                .order_by("logical_date").values("id", "schedule_id", "state", "logical_date"))
        for row in rows:
            active[row["schedule_id"]].append({"id": row["id"], "state": row["state"], "at": row["logical_date"]})
    return active


def _cancel_replaced(active: list[dict], at: datetime) -> None:

    for previous in active:
        if previous.get("id"):
            run = Run.objects.get(pk=previous["id"])
            cancel_run(run, reason=f"replaced by the run of {fmt(at)} (overlap=replace)")


class SchedulerRole(Role):
    """``manage.py scheduler`` on the shared loop: woken by NOTIFY when a schedule was created,
    changed or resumed, by the earliest next_fire_at, and at least every ``MAX_SLEEP`` seconds
    (standbys retry the lease, the leader renews it)."""

    role = "scheduler"
    channels = (SCHEDULES_CHANNEL,)

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.was_leader: bool | None = None
        self.did = False

    def serve(self, max_seconds: float | None = None, also: Role | None = None) -> None:
        """Run the loop; ``also``: another role on the same loop (``scheduler --dispatch``)."""
        # Through logging, not stdout: with LOG_FORMAT=json every line a process writes is JSON.
        lease = self.scheduler.lease
        log.info("scheduler %s started (lease %s%s)%s", self.scheduler.holder, lease.name,
                 ", disabled for tests" if isinstance(lease, NoLease) else "",
                 f" with a {also.role} in the same process" if also is not None else "",
                 extra={"action": "scheduler_start"})
        Loop(self if also is None else Together(self, also), poll=MAX_SLEEP, max_seconds=max_seconds).run()

    def tick(self) -> bool:
        try:
            self.did = self.scheduler.tick()
        except DATABASE_ERRORS:
            raise
        except Exception:  # a bad row must not stop every other schedule
            log.exception("scheduler tick failed", extra={"action": "tick_failed"})
            self.did = False
        leader = self.scheduler.lease.is_leader
        if leader != self.was_leader:
            log.info("scheduler %s: %s", self.scheduler.holder, "leader" if leader else "standby",
                     extra={"action": "scheduler_role"})
            self.was_leader = leader
        return False  # the wait below decides when to look again

    def next_wait(self) -> float:
        if not self.scheduler.lease.is_leader:
            return MAX_SLEEP
        due = self.scheduler.seconds_until_due()
        wait = MAX_SLEEP if due is None else min(MAX_SLEEP, due)
        # Due rows it could not take (locked by another scheduler): no busy loop.
        return wait if self.did else max(wait, 0.05)

    def stop(self) -> None:
        try:
            self.scheduler.lease.release()
        except DATABASE_ERRORS:  # the lease then simply expires
            log.warning("could not release the lease: the database is unavailable", extra={"action": "lease_kept"})
        log.info("scheduler %s stopped: created %s runs", self.scheduler.holder, self.scheduler.created,
                 extra={"action": "scheduler_stop"})
