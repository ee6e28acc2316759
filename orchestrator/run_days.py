"""A workflow's runs counted per day and state (the calendar page), at a cost that follows the days
shown, not the runs: the counts of *settled* days are kept, the others counted live.

**Settled.** A day (in one clock: the viewer's zone) is settled when it ended two days ago or more
and every run of it finished. Its counts then change only if a run of it is created (a backfill,
a catchup, a trigger with an old logical date), changes a finished state (clear, mark, retry,
a backfill's reprocessing) or is deleted (retention, the admin): rare writes, none on the job path.

**Kept.** ``RunDay`` holds a settled day's count per state, per workflow and zone. The calendar
(``runs_by_day``) reads the kept rows of the year, counts the other days live (each run of
contiguous unkept days one index range of the workflow's runs), and keeps what it found settled:
the first view of a year reads its runs once; later views read at most 366 days x states rows and
the runs of today, the last two days and days still running.

**Forgotten.** Triggers on ``orchestrator_run`` delete a day's kept rows (every zone: the UTC date
and the day either side) when a write could change them. Each is conditioned so the job path
never runs it: a row trigger on an update *of state* from a finished state (a worker ends running
runs, never finished ones: its WHEN clause is false and nothing is queued), a row trigger on an
insert of a workflow's run dated more than a day ago (a job's run has no workflow; a schedule's
fire is recent), and a statement trigger on delete. ``tests/test_calendar.py`` counts the
function's calls (pg_stat_xact_user_functions): none for a worker's claims and endings.
``manage.py bench --only jobs``, three interleaved rounds each on a shared 2-core machine:
without the triggers 708 to 905 jobs/s (one worker) and 651 to 734 (two), with them 657 to 821
and 555 to 873: within the noise. A backfill's insert of old runs pays a call per run (about
25 us: 100,000 runs dated last year inserted in 10.9 to 12.0 s, recent ones in 8.4 to 9.6 s).

**Races.** A trigger and the calendar's fill take the same transaction-level advisory lock of the
workflow, and each reads after taking it: a fill that counted a run before a clear committed is
deleted by the clear's trigger (which waits for the fill's lock, then sees its rows), and a fill
that waited for a clear's lock counts the run as it is after the clear. The insert trigger's
margin (a day) and the settled rule's (two days) leave a day for a run's insert to commit.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, time, timedelta, tzinfo

from django.db import connection, models, transaction

from orchestrator import clock
from orchestrator.states import FINISHED_RUN_STATES, sql_list

SETTLED_AFTER = timedelta(days=2)  # a day's end this long ago (or more) may be settled
LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('orchestrator.calendar.' || %(workflow)s, 0)), now()"


class RunDay(models.Model):
    """A settled day's count of a workflow's runs in one state, the day in one zone."""

    # No foreign key: keeping a day would lock the workflow row (FOR KEY SHARE); the rows of a
    # deleted workflow's runs go with them (the delete trigger).
    workflow_id = models.BigIntegerField()
    zone = models.CharField(max_length=64)
    day = models.DateField()
    state = models.CharField(max_length=16)
    n = models.BigIntegerField()

    class Meta:
        app_label = "orchestrator"
        constraints = [models.UniqueConstraint(fields=["workflow_id", "day", "zone", "state"], name="runday_unique")]

    def __str__(self):
        return f"workflow #{self.workflow_id} {self.day} ({self.zone}): {self.n} {self.state}"


# --- SQL ---------------------------------------------------------------------------------------

# The kept days of a year, in one zone.
KEPT = """
SELECT day, state, n FROM orchestrator_runday
WHERE workflow_id = %(workflow)s AND zone = %(zone)s AND day >= %(first)s AND day <= %(last)s
"""

# The runs of the unkept days counted per day and state: each range [lo, hi) one walk of the
# workflow's runs by date (run_of_workflow_by_date), the day in the zone.
LIVE = """
SELECT (r.logical_date AT TIME ZONE %(zone)s)::date AS day, r.state, count(*)
FROM unnest(%(los)s::timestamptz[], %(his)s::timestamptz[]) AS b(lo, hi)
CROSS JOIN LATERAL (
    SELECT logical_date, state FROM orchestrator_run
    WHERE workflow_id = %(workflow)s AND logical_date >= b.lo AND logical_date < b.hi
    OFFSET 0  -- a range scan per range, never one join over the workflow's runs
) r
GROUP BY 1, 2
"""

KEEP = """
INSERT INTO orchestrator_runday (workflow_id, zone, day, state, n)
SELECT %(workflow)s, %(zone)s, d, s, n FROM unnest(%(days)s::date[], %(states)s::text[], %(ns)s::bigint[]) AS k(d, s, n)
ON CONFLICT DO NOTHING
"""

_FORGET = """PERFORM pg_advisory_xact_lock(hashtextextended('orchestrator.calendar.' || {row}.workflow_id, 0));
        DELETE FROM orchestrator_runday WHERE workflow_id = {row}.workflow_id
            AND day BETWEEN ({row}.logical_date AT TIME ZONE 'UTC')::date - 1
                        AND ({row}.logical_date AT TIME ZONE 'UTC')::date + 1;"""

# A day's kept counts forgotten (every zone's: the run's UTC date and the day either side), after
# the workflow's lock (the module's docstring says why).
FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION orchestrator_runday_forget_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {_FORGET.format(row="NEW")}
    ELSE
        {_FORGET.format(row="OLD")}
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION orchestrator_runday_forget_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('orchestrator.calendar.' || w, 0))
    FROM (SELECT DISTINCT workflow_id AS w FROM old_rows WHERE workflow_id IS NOT NULL ORDER BY 1) AS o;
    DELETE FROM orchestrator_runday k
    USING (SELECT DISTINCT workflow_id, (logical_date AT TIME ZONE 'UTC')::date AS d FROM old_rows
           WHERE workflow_id IS NOT NULL) AS o
    WHERE k.workflow_id = o.workflow_id AND k.day BETWEEN o.d - 1 AND o.d + 1;
    RETURN NULL;
END $$;
"""

TRIGGERS = f"""
CREATE TRIGGER run_day_reopened AFTER UPDATE OF state ON orchestrator_run FOR EACH ROW
    WHEN (OLD.state IN ({sql_list(FINISHED_RUN_STATES)}) AND NEW.state IS DISTINCT FROM OLD.state
          AND OLD.workflow_id IS NOT NULL)
    EXECUTE FUNCTION orchestrator_runday_forget_row();
CREATE TRIGGER run_day_added AFTER INSERT ON orchestrator_run FOR EACH ROW
    WHEN (NEW.workflow_id IS NOT NULL AND NEW.logical_date < now() - interval '1 day')
    EXECUTE FUNCTION orchestrator_runday_forget_row();
CREATE TRIGGER run_day_deleted AFTER DELETE ON orchestrator_run
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION orchestrator_runday_forget_deleted();
"""

DROP = """
DROP TRIGGER IF EXISTS run_day_deleted ON orchestrator_run;
DROP TRIGGER IF EXISTS run_day_added ON orchestrator_run;
DROP TRIGGER IF EXISTS run_day_reopened ON orchestrator_run;
DROP FUNCTION IF EXISTS orchestrator_runday_forget_deleted();
DROP FUNCTION IF EXISTS orchestrator_runday_forget_row();
"""


# --- Reading -----------------------------------------------------------------------------------


def zone_name(zone: tzinfo) -> str:
    return getattr(zone, "key", None) or "UTC"


def _start(day: date, zone: tzinfo) -> datetime:
    return datetime.combine(day, time.min, tzinfo=zone)


def _unkept_ranges(first: date, last: date, kept: set[date], zone: tzinfo) -> list[tuple[datetime, datetime]]:
    """[lo, hi) of each run of consecutive days from first to last that are not kept."""
    ranges, begin = [], None
    for offset in range((last - first).days + 1):  # at most 366 days (never past date.max)
        day = first + timedelta(days=offset)
        if day not in kept and begin is None:
            begin = day
        if day in kept and begin is not None:
            ranges.append((_start(begin, zone), _start(day, zone)))
            begin = None
    if begin is not None:
        ranges.append((_start(begin, zone), _end(last, zone)))
    return ranges


def _end(day: date, zone: tzinfo) -> datetime:
    if day == date.max:
        return datetime.max.replace(tzinfo=zone)
    return _start(day + timedelta(days=1), zone)


def runs_by_day(workflow_id: int, first: date, last: date, zone: tzinfo) -> dict[date, dict[str, int]]:
    """{day: {state: runs}} of the workflow's runs from ``first`` to ``last`` (days in ``zone``),
    keeping the settled days it counted (see the module's docstring)."""
    name = zone_name(zone)
    found: dict[date, dict[str, int]] = defaultdict(dict)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(LOCK, {"workflow": workflow_id})
        database_now = cursor.fetchone()[1]
        cursor.execute(KEPT, {"workflow": workflow_id, "zone": name, "first": first, "last": last})
        for day, state, n in cursor.fetchall():
            found[day][state] = n
        ranges = _unkept_ranges(first, last, set(found), zone)
        if not ranges:
            return found
        cursor.execute(LIVE, {"zone": name, "workflow": workflow_id, "los": [lo for lo, _ in ranges],
                              "his": [hi for _, hi in ranges]})
        live: dict[date, dict[str, int]] = defaultdict(dict)
        for day, state, n in cursor.fetchall():
            live[day][state] = n
        found.update(live)
        cutoff = min(clock.now(), database_now) - SETTLED_AFTER
        settled = [(day, state, n) for day, counts in live.items()
                   if _end(day, zone) <= cutoff and all(state in FINISHED_RUN_STATES for state in counts)
                   for state, n in counts.items()]
        if settled:
            cursor.execute(KEEP, {"workflow": workflow_id, "zone": name, "days": [row[0] for row in settled],
                                  "states": [row[1] for row in settled], "ns": [row[2] for row in settled]})
    return found
