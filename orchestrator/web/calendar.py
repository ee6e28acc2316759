"""A workflow's calendar: its runs of one year by day (in the viewer's clock), each day coloured by
the worst state among its runs and linking to the runs list of that day.

The counts come from ``orchestrator.run_days``: settled days (ended, every run finished) are kept
per day and state, the others counted live in PostgreSQL (``GROUP BY`` over index ranges of the
workflow's runs), so a view reads at most 366 days x states rows and the runs of the days still
open, whatever the number of runs; it draws twelve small months that wrap on a narrow screen.
"""

from __future__ import annotations

import calendar as cal
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, tzinfo

from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.http import urlencode

from orchestrator import access, clock, run_days
from orchestrator.models import Workflow
from orchestrator.states import RunState
from orchestrator.web import zones
from orchestrator.web.errors import query_int
from orchestrator.web.kit import page, viewer_required

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


def runs_by_day(wf: Workflow, year: int, zone: tzinfo) -> dict[date, dict[str, int]]:
    return run_days.runs_by_day(wf.pk, date(year, 1, 1), date(year, 12, 31), zone)


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
