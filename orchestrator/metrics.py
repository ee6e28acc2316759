"""Prometheus metrics at ``/metrics``, read from the database at scrape time.

Every role writes its state to PostgreSQL, so any web process can report on the whole
deployment; no process keeps counters of its own. One scrape runs six aggregate queries, each
on a partial or narrow index (the queued/scheduled/dead partial indexes of the task-run table,
the finished-at indexes), and never loads rows into Python. The queue depths and the size of
the dead-letter queue are ``reads``' (``queue_depths``, ``DEAD_LETTER_COUNT_SQL``), the very
numbers the dashboard shows.

Metrics that describe a window (the schedule delay histogram, task outcomes, reaped attempts)
say which window in their name or help text: the history is pruned, so all-time totals from
the database would go down, and Prometheus counters must not.

``/metrics`` is the installation's scrape (behind ``METRICS_TOKEN``). ``/api/metrics/`` answers the
same text to a signed-in user or an API token: the whole installation to a global viewer, and to
a user with rights on some tenants only their workflows' labels and their task runs' counts (the
schedule delay by trigger, which names no workflow but sums every tenant, is left out for them).
"""

from __future__ import annotations

import hmac

from django.db import DatabaseError, connection
from django.http import HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from orchestrator import access, clock, reads
from orchestrator.conf import app_settings
from orchestrator.lease import SCHEDULER_LEASE
from orchestrator.models import TaskRun, Workflow
from orchestrator.states import LIVE_WORKER_STATES, AttemptOutcome, RunState, TaskState, Trigger, sql_list

SCHEDULE_DELAY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
SCHEDULE_DELAY_WINDOW_SECONDS = 3600
OUTCOME_WINDOW_SECONDS = 300
REAPED_WINDOW_SECONDS = 3600
NOT_RUN_STATES = (RunState.SKIPPED, RunState.MISSED)
NOT_RUN_WINDOW_SECONDS = 3600
JOB_LABEL = "(job)"  # workflow label of one-off jobs; no workflow name can start with "("

# Task runs that ended within the window, by workflow (jobs under one label) and final state,
# through the finished-at index: a scrape reads only the recent rows.
OUTCOME_SQL = """
    SELECT coalesce(w.name, %(job_label)s), t.state, count(*)
      FROM orchestrator_taskrun t
      JOIN orchestrator_run r ON r.id = t.run_id
      LEFT JOIN orchestrator_workflow w ON w.id = r.workflow_id
     WHERE t.finished_at > %(now)s - make_interval(secs => %(window)s)
     GROUP BY 1, 2
"""

# By trigger: for scheduled runs this is the scheduler's lateness, for jobs the wait in the queue.
# Backfills are left out: their fire times are in the past by design.
SCHEDULE_DELAY_SQL = f"""
    SELECT trigger, {", ".join(f"count(*) FILTER (WHERE schedule_delay <= {b!r})" for b in SCHEDULE_DELAY_BUCKETS)},
           count(*), coalesce(sum(schedule_delay), 0)
      FROM orchestrator_run
     WHERE schedule_delay IS NOT NULL AND started_at > %(now)s - make_interval(secs => %(window)s)
       AND trigger <> '{Trigger.BACKFILL}'
     GROUP BY trigger
"""

# Schedule fire times recorded as not run (skipped by the catchup, overlap or params rules, or
# missed by a start deadline), through the finished-at index: such runs end when recorded.
NOT_RUN_SQL = f"""
    SELECT w.name, r.state, count(*)
      FROM orchestrator_run r JOIN orchestrator_workflow w ON w.id = r.workflow_id
     WHERE r.finished_at > %(now)s - make_interval(secs => %(window)s)
       AND r.trigger = '{Trigger.SCHEDULE}' AND r.state IN ({sql_list(NOT_RUN_STATES)})
     GROUP BY 1, 2
"""

# Heartbeats and the lease are compared with the database clock (they were written with it);
# db_now is NULL except under a test's pinned clock.
STATUS_SQL = f"""
    SELECT
      ({reads.DEAD_LETTER_COUNT_SQL}),
      (SELECT count(*) FROM orchestrator_worker
        WHERE state IN ({sql_list(LIVE_WORKER_STATES)})
          AND heartbeat_at > COALESCE(%(db_now)s::timestamptz, now()) - make_interval(secs => %(heartbeat)s)),
      (SELECT count(*) FROM orchestrator_attempt
        WHERE outcome = '{AttemptOutcome.LOST}' AND finished_at > %(now)s - make_interval(secs => %(reaped)s)),
      (SELECT count(*) FROM orchestrator_attempt
        WHERE outcome = '{AttemptOutcome.TIMED_OUT}' AND finished_at > %(now)s - make_interval(secs => %(reaped)s)),
      lease.holder, lease.epoch, EXTRACT(EPOCH FROM lease.expires_at - COALESCE(%(db_now)s::timestamptz, now()))
    FROM (SELECT 1) AS one LEFT JOIN orchestrator_lease AS lease ON lease.name = %(lease)s
"""

# Live workers per queue they serve (a worker serving three queues counts for each), with the
# same database-clock rule as STATUS_SQL.
WORKERS_BY_QUEUE_SQL = f"""
    SELECT queue, count(*) FROM orchestrator_worker, unnest(queues) AS queue
     WHERE state IN ({sql_list(LIVE_WORKER_STATES)})
       AND heartbeat_at > COALESCE(%(db_now)s::timestamptz, now()) - make_interval(secs => %(heartbeat)s)
     GROUP BY queue
"""


def _fetchall(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


class DatabaseCollector:
    """Builds every metric family from six queries per scrape; of what ``user`` may read, when given."""

    def __init__(self, user=None):
        self.user = user

    def describe(self):
        # Describing would run the queries at registration time; an empty description is allowed.
        return []

    def collect(self):
        up = GaugeMetricFamily("orchestrator_database_up", "1 if the database answered this scrape's queries.")
        try:
            families = self._families()
        except DatabaseError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self) -> list:
        heartbeat_timeout = app_settings.HEARTBEAT_TIMEOUT_SECONDS
        now, db_now = clock.now(), clock.db_now_param()
        depths = reads.queue_depths(now)
        outcome_rows = _fetchall(OUTCOME_SQL, {"job_label": JOB_LABEL, "now": now, "window": OUTCOME_WINDOW_SECONDS})
        delay_rows = _fetchall(SCHEDULE_DELAY_SQL, {"now": now, "window": SCHEDULE_DELAY_WINDOW_SECONDS})
        not_run_rows = _fetchall(NOT_RUN_SQL, {"now": now, "window": NOT_RUN_WINDOW_SECONDS})
        (dead, live, lost, timed_out, holder, epoch, remaining) = _fetchall(STATUS_SQL, {
            "now": now, "db_now": db_now, "heartbeat": heartbeat_timeout, "reaped": REAPED_WINDOW_SECONDS,
            "lease": SCHEDULER_LEASE,
        })[0]
        worker_rows = _fetchall(WORKERS_BY_QUEUE_SQL, {"db_now": db_now, "heartbeat": heartbeat_timeout})
        if self.user is not None and access.is_scoped(self.user):
            depths, outcome_rows, not_run_rows, dead = self._scoped(now, outcome_rows, not_run_rows)
            delay_rows = []

        # Queues served by a live worker are reported even when empty, so a dashboard shows 0
        # rather than no data.
        for queue, _count in worker_rows:
            depths.setdefault(queue, reads.Depth())
        families = []
        gauge = GaugeMetricFamily(
            "orchestrator_queue_depth", "Task runs waiting for a worker: queued, or scheduled and due now "
            "(not those scheduled for later).", labels=["queue"]
        )
        for queue in sorted(depths):
            gauge.add_metric([queue], depths[queue].waiting)
        families.append(gauge)

        gauge = GaugeMetricFamily("orchestrator_tasks_running", "Task runs being executed now.", labels=["queue"])
        for queue in sorted(depths):
            gauge.add_metric([queue], depths[queue].running)
        families.append(gauge)

        gauge = GaugeMetricFamily(
            "orchestrator_task_outcomes_last_5m",
            f"Task runs that finished in the last {OUTCOME_WINDOW_SECONDS} s, by workflow "
            f"(\"{JOB_LABEL}\" for one-off jobs) and final state.",
            labels=["workflow", "state"],
        )
        for workflow, state, count in sorted(outcome_rows):
            gauge.add_metric([workflow, state], count)
        families.append(gauge)

        histogram = HistogramMetricFamily(
            "orchestrator_schedule_delay_seconds",
            f"Fire time (or due time of a job) to first task start, of runs started in the last "
            f"{SCHEDULE_DELAY_WINDOW_SECONDS} s, by trigger (backfills excluded).",
            labels=["trigger"],
        )
        for trigger, *bucket_counts, count, total in sorted(delay_rows):
            histogram.add_metric(
                [trigger],
                [(repr(b), c) for b, c in zip(SCHEDULE_DELAY_BUCKETS, bucket_counts, strict=True)] + [("+Inf", count)],
                sum_value=float(total),
            )
        families.append(histogram)

        gauge = GaugeMetricFamily(
            "orchestrator_fire_times_not_run_last_hour",
            f"Schedule fire times recorded as not run in the last {NOT_RUN_WINDOW_SECONDS} s, by workflow and "
            "state: skipped (catchup, overlap or params) or missed (start deadline), each with its reason on "
            "the run; a long gap is one summary run and counts once.",
            labels=["workflow", "state"],
        )
        for workflow, state, count in sorted(not_run_rows):
            gauge.add_metric([workflow, state], count)
        families.append(gauge)

        gauge = GaugeMetricFamily(
            "orchestrator_attempts_reaped_last_hour",
            f"Attempts ended by the reaper in the last {REAPED_WINDOW_SECONDS} s: "
            "lost (the worker went silent) or timed_out.",
            labels=["outcome"],
        )
        gauge.add_metric(["lost"], lost)
        gauge.add_metric(["timed_out"], timed_out)
        families.append(gauge)

        families.append(GaugeMetricFamily(
            "orchestrator_dead_letter_size", "Task runs in the dead-letter queue (state dead).", value=dead
        ))
        families.append(GaugeMetricFamily(
            "orchestrator_workers_live",
            f"Worker processes with a heartbeat in the last {heartbeat_timeout:g} s.", value=live,
        ))
        gauge = GaugeMetricFamily(
            "orchestrator_queue_workers_live", "Live worker processes serving each queue.", labels=["queue"]
        )
        for queue, count in sorted(worker_rows):
            gauge.add_metric([queue], count)
        families.append(gauge)

        families += _lease_families(holder, epoch, remaining)
        return families


    def _scoped(self, now, outcome_rows: list, not_run_rows: list) -> tuple:
        """The depths, outcomes, fire times not run and dead-letter size of the user's workflows
        and task runs only. A workflow's label is kept by its name; the jobs' label when the user
        reads the jobs' tenant."""
        task_runs = access.visible(self.user, TaskRun.objects.all())
        names = set(access.visible(self.user, Workflow.objects.all()).values_list("name", flat=True))
        if access.reading(self.user).allows(access.JOB_TENANT, None):
            names.add(JOB_LABEL)
        return (reads.queue_depths_of(task_runs, now), [row for row in outcome_rows if row[0] in names],
                [row for row in not_run_rows if row[0] in names], task_runs.filter(state=TaskState.DEAD).count())


def _lease_families(holder, epoch, remaining) -> list:
    """Whether a scheduler leads, which one, and how often leadership changed."""
    families = []
    present = holder is not None and remaining is not None and remaining > 0
    families.append(GaugeMetricFamily(
        "orchestrator_scheduler_leader_present",
        "1 if some scheduler process holds an unexpired lease (the web process never leads).",
        value=1 if present else 0,
    ))
    families.append(GaugeMetricFamily(
        "orchestrator_scheduler_lease_epoch",
        "Fencing epoch of the scheduler lease; it grows by one on each change of leader.",
        value=epoch or 0,
    ))
    families.append(GaugeMetricFamily(
        "orchestrator_scheduler_lease_remaining_seconds",
        "Seconds until the scheduler lease expires unless renewed (negative: expired).",
        value=float(remaining) if remaining is not None else 0.0,
    ))
    gauge = GaugeMetricFamily(
        "orchestrator_scheduler_leader_info", "The process holding the scheduler lease.", labels=["holder"]
    )
    if present:
        gauge.add_metric([holder], 1)
    families.append(gauge)
    return families


registry = CollectorRegistry(auto_describe=False)
registry.register(DatabaseCollector())


def _authorized(request) -> bool:
    token = app_settings.METRICS_TOKEN or ""
    if not token:
        return True
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def text_for(user) -> bytes:
    """The metrics of what ``user`` may read, in Prometheus' text format."""
    own = CollectorRegistry(auto_describe=False)
    own.register(DatabaseCollector(user))
    return generate_latest(own)


def metrics_view(request):
    if not _authorized(request):
        response = HttpResponse("a bearer token is required (Authorization: Bearer <METRICS_TOKEN>)\n",
                                status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
