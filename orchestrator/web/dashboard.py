"""The dashboard: runs by state over the last day, the scheduler's delay, the queues, the workers and
the leases, the dead-letter queue's size, and the latest failures and deadline misses.

A user with rights on some tenants only sees their runs, task runs and queue depths counted; the
workers and the leases are the installation's, named by host, and shown to everyone."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count

from orchestrator import access, clock, reads
from orchestrator.conf import app_settings
from orchestrator.models import Lease, Run, TaskRun, Worker
from orchestrator.states import ACTIVE_RUN_STATES, RunState, TaskState, Trigger
from orchestrator.web.kit import page, viewer_required

# A backfill's runs start long after their logical dates by design: their delay says nothing about
# the scheduler (/metrics leaves them out too).
DELAY_SQL = """
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY schedule_delay),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY schedule_delay), count(*)
      FROM orchestrator_run
     WHERE started_at >= %s AND started_at <= %s AND schedule_delay IS NOT NULL AND trigger <> %s
"""
# The same, of the runs of some tenants and named workflows.
SCOPED_DELAY_SQL = DELAY_SQL + """
       AND (tenant = ANY(%s) OR workflow_id IN (SELECT id FROM orchestrator_workflow WHERE name = ANY(%s)))
"""


def run_states(now: datetime, runs=None) -> dict[str, int]:
    """Runs by state: those that finished in the last day and every active one (of ``runs``, a
    queryset, when given)."""
    runs = Run.objects.all() if runs is None else runs
    states = dict.fromkeys(RunState.values, 0)
    # Finished runs through the finished_at index, active ones through the state index:
    # neither scans the whole history.
    for row in runs.filter(finished_at__gte=now - timedelta(hours=24)).values("state").annotate(n=Count("id")):
        states[row["state"]] += row["n"]
    for row in runs.filter(state__in=ACTIVE_RUN_STATES).values("state").annotate(n=Count("id")):
        states[row["state"]] += row["n"]
    return states


def schedule_delay(now: datetime, scope: access.Scope | None = None) -> dict:
    """The median and 95th percentile of the delay of runs started in the last hour (in ``scope``)."""
    params = [now - timedelta(hours=1), now, Trigger.BACKFILL.value]
    sql = DELAY_SQL
    if scope is not None and not scope.everything:
        sql, params = SCOPED_DELAY_SQL, [*params, sorted(scope.tenants), sorted(scope.workflows)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        p50, p95, count = cursor.fetchone()
    return {"p50": p50, "p95": p95, "count": count}


def live_workers(now: datetime) -> list[Worker]:
    """Running and draining workers, newest heartbeat first, each marked stale when it is silent
    for longer than the heartbeat timeout."""
    timeout = app_settings.HEARTBEAT_TIMEOUT_SECONDS
    workers = list(Worker.objects.filter(state__in=[Worker.State.RUNNING, Worker.State.DRAINING])
                   .order_by("-heartbeat_at")[:50])
    for worker in workers:
        worker.silent_for = (now - worker.heartbeat_at).total_seconds()
        worker.stale = worker.silent_for > timeout
    return workers


def dashboard_context(now: datetime, user=None) -> dict:
    """The dashboard of everything, or of what ``user`` may read."""
    scope = access.reading(user) if user is not None else None
    scoped = scope is not None and not scope.everything
    runs = access.visible(user, Run.objects.all()) if scoped else Run.objects.all()
    states = run_states(now, runs)
    leases = list(Lease.objects.order_by("name"))
    for lease in leases:
        lease.expired = lease.expires_at < now
    day_ago = now - timedelta(hours=24)
    # Runs that missed their deadline in the last day (the deadline_missed_at index).
    missed = runs.filter(deadline_missed_at__gte=day_ago)
    task_runs = access.visible(user, TaskRun.objects.all()) if scoped else None
    return {
        "states": [(state, states[state]) for state in RunState.values],
        "runs_24h": sum(states.values()),
        "failed_24h": states[RunState.FAILED],
        "delay": schedule_delay(now, scope),
        # The depths /metrics reports, from the same read.
        "queues": sorted((reads.queue_depths_of(task_runs, now) if scoped else reads.queue_depths(now)).items()),
        "workers": live_workers(now),
        "leases": leases,
        "dead": task_runs.filter(state=TaskState.DEAD).count() if scoped else reads.dead_letter_count(),
        "recent_failures": runs.filter(state=RunState.FAILED).select_related("workflow").order_by("-id")[:8],
        "recent": runs.select_related("workflow").order_by("-id")[:10],
        "deadline_misses": missed.select_related("workflow").order_by("-deadline_missed_at")[:8],
        "deadline_missed_24h": missed.count(),
        "poll": "10s",
    }


@viewer_required
def dashboard(request):
    return page(request, "orchestrator/web/dashboard.html", dashboard_context(clock.now(), request.user),
                partial="stats")
