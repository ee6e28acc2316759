"""A workflow's calendar: its runs of one year by day (in the viewer's clock), each day coloured by
the worst state among its runs and linking to the runs list of that day.

One statement counts the runs per day and state (``GROUP BY``) in PostgreSQL, walking the
(workflow, logical_date) index over the year: the page receives at most 366 × 7 rows whatever the
number of runs, and draws twelve small months that wrap on a narrow screen.
"""

from __future__ import annotations

import calendar as cal
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, time, tzinfo

from django.db import connection
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.http import urlencode

from orchestrator import access, clock
from orchestrator.models import Workflow
from orchestrator.states import RunState
from orchestrator.web import zones
from orchestrator.web.errors import query_int
from orchestrator.web.kit import page, viewer_required

# Runs per day and state of one workflow over a range of logical dates, the day in the viewer's zone.
RUNS_BY_DAY = """
SELECT (logical_date AT TIME ZONE %(zone)s)::date AS day, state, count(*)
FROM orchestrator_run
WHERE workflow_id = %(workflow)s AND logical_date >= %(lo)s AND logical_date < %(hi)s
GROUP BY 1, 2
"""

# A day's colour: the first of these states among its runs.
WORST_FIRST = [RunState.FAILED, RunState.RUNNING, RunState.PENDING, RunState.MISSED, RunState.CANCELLED,
               RunState.SKIPPED, RunState.SUCCEEDED]
WEEKDAYS = ["Mo", "Tu", "We", "Th", "Fr", "Sa", "Su"]


@dataclass
class Day:
    day: date
    counts: dict[str, int] = field(default_factory=dict)
    href: str = ""

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def state(self) -> str:
        return next((s for s in WORST_FIRST if self.counts.get(s)), "none")

    @property
    def said(self) -> str:
        """Its accessible name: the visible day number first, then what the title says."""
        return f"{self.day.day} {self.day:%B %Y}: " + self.words.partition(": ")[2]

    @property
    def words(self) -> str:
        if not self.counts:
            return f"{self.day.isoformat()}: no runs"
        parts = ", ".join(f"{n} {s}" for s in WORST_FIRST for n in [self.counts.get(s, 0)] if n)
        return f"{self.day.isoformat()}: {self.total} run{'s' if self.total != 1 else ''} ({parts})"


def zone_name(zone: tzinfo) -> str:
    return getattr(zone, "key", None) or "UTC"


def runs_by_day(wf: Workflow, year: int, zone: tzinfo) -> dict[date, dict[str, int]]:
    lo = datetime.combine(date(year, 1, 1), time.min, tzinfo=zone)
    hi = datetime.combine(date(year + 1, 1, 1), time.min, tzinfo=zone) if year < 9999 else datetime.max.replace(tzinfo=zone)
    found: dict[date, dict[str, int]] = defaultdict(dict)
    with connection.cursor() as cursor:
        cursor.execute(RUNS_BY_DAY, {"zone": zone_name(zone), "workflow": wf.pk, "lo": lo, "hi": hi})
        for day, state, count in cursor.fetchall():
            found[day][state] = count
    return found


def calendar_context(wf: Workflow, year: int, zone: tzinfo, runs_url: str) -> dict:
    """Twelve months of ``year``, each a list of weeks (Monday first) of Days or None (padding)."""
    counts = runs_by_day(wf, year, zone)
    months = []
    for month in range(1, 13):
        weeks = []
        for week in cal.Calendar(firstweekday=0).monthdatescalendar(year, month):
            row = []
            for day in week:
                if day.month != month:
                    row.append(None)
                    continue
                found = Day(day, counts.get(day, {}))
                if found.counts:
                    found.href = runs_url + "?" + urlencode({"workflow": wf.name, "since": day.isoformat(),
                                                             "until": day.isoformat()})
                row.append(found)
            weeks.append(row)
        months.append((date(year, month, 1), weeks))
    totals: dict[str, int] = defaultdict(int)
    for by_state in counts.values():
        for state, n in by_state.items():
            totals[state] += n
    return {"wf": wf, "year": year, "months": months, "weekdays": WEEKDAYS,
            "totals": [(s, totals[s]) for s in WORST_FIRST if totals.get(s)], "total": sum(totals.values()),
            "legend": WORST_FIRST, "days_with_runs": len(counts)}


@viewer_required
def workflow_calendar(request, name):
    wf = get_object_or_404(access.visible(request.user, Workflow.objects.all()), name=name)
    zone = zones.for_request(request).zone
    year = query_int(request, "year", clock.now().astimezone(zone).year, 1, 9999)
    context = calendar_context(wf, year, zone, reverse("orchestrator:web:runs"))
    return page(request, "orchestrator/web/calendar.html", context)
