"""The dashboard: runs by state over the last day, the scheduler's delay, the queues, the workers and
the leases, the dead-letter queue's size, and the latest failures and deadline misses."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count

from orchestrator import clock, reads
from orchestrator.conf import app_settings
from orchestrator.models import Lease, Run, Worker
from orchestrator.states import ACTIVE_RUN_STATES, RunState, Trigger
from orchestrator.web.kit import page, viewer_required

# A backfill's runs start long after their logical dates by design: their delay says nothing about
# the scheduler (/metrics leaves them out too).
DELAY_SQL = """
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY schedule_delay),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY schedule_delay), count(*)
      FROM orchestrator_run
     WHERE started_at >= %s AND started_at <= %s AND schedule_delay IS NOT NULL AND trigger <> %s
"""


def run_states(now: datetime) -> dict[str, int]:
    """Runs by state: those that finished in the last day and every active one."""
    states = dict.fromkeys(RunState.values, 0)
    # Finished runs through the finished_at index, active ones through the state index:
    # neither scans the whole history.
    for row in Run.objects.filter(finished_at__gte=now - timedelta(hours=24)).values("state").annotate(n=Count("id")):
        states[row["state"]] += row["n"]
    for row in Run.objects.filter(state__in=ACTIVE_RUN_STATES).values("state").annotate(n=Count("id")):
        states[row["state"]] += row["n"]
    return states


def schedule_delay(now: datetime) -> dict:
    """The median and 95th percentile of the delay of runs started in the last hour."""
    with connection.cursor() as cursor:
        cursor.execute(DELAY_SQL, [now - timedelta(hours=1), now, Trigger.BACKFILL.value])
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


def dashboard_context(now: datetime) -> dict:
    states = run_states(now)
    leases = list(Lease.objects.order_by("name"))
    for lease in leases:
        lease.expired = lease.expires_at < now
    day_ago = now - timedelta(hours=24)
    # Runs that missed their deadline in the last day (the deadline_missed_at index).
    missed = Run.objects.filter(deadline_missed_at__gte=day_ago)
    return {
        "states": [(state, states[state]) for state in RunState.values],
        "runs_24h": sum(states.values()),
        "failed_24h": states[RunState.FAILED],
        "delay": schedule_delay(now),
        # The depths /metrics reports, from the same read.
        "queues": sorted(reads.queue_depths(now).items()),
        "workers": live_workers(now),
        "leases": leases,
        "dead": reads.dead_letter_count(),
        "recent_failures": Run.objects.filter(state=RunState.FAILED).select_related("workflow").order_by("-id")[:8],
        "recent": Run.objects.select_related("workflow").order_by("-id")[:10],
        "deadline_misses": missed.select_related("workflow").order_by("-deadline_missed_at")[:8],
        "deadline_missed_24h": missed.count(),
        "poll": "10s",
    }


@viewer_required
def dashboard(request):
    return page(request, "orchestrator/web/dashboard.html", dashboard_context(clock.now()), partial="stats")
