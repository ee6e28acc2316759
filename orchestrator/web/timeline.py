"""The run page's timeline: every attempt of the run's task runs as a bar on one time axis, from
the first attempt's start to the last one's end (or now, while one runs); a mapped task as one
bar from its first instance's start to its last one's end.

Positions are percentages of the axis, so the page draws them with CSS and no script.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

SHORTEST_AXIS = 0.001  # seconds: a run whose attempts took no time still has an axis to divide
NARROWEST = 0.4  # percent: a bar too short to see still shows


@dataclass(frozen=True)
class Axis:
    start: datetime | None  # None: nothing has started
    length: float  # seconds, never zero

    @classmethod
    def over(cls, intervals: Iterable[tuple[datetime, datetime | None]], now: datetime) -> Axis:
        """The axis that holds every (start, end) interval; an interval without an end lasts until now."""
        intervals = list(intervals)
        if not intervals:
            return cls(None, SHORTEST_AXIS)
        start = min(begin for begin, _end in intervals)
        end = max(end or now for _begin, end in intervals)
        return cls(start, max((end - start).total_seconds(), SHORTEST_AXIS))

    def bar(self, start: datetime, took: float) -> dict:
        """Where a bar that began at ``start`` and took ``took`` seconds sits: ``left`` and ``width``
        in percent of the axis, and its ``seconds``."""
        offset = (start - self.start).total_seconds()
        return {"left": round(100 * offset / self.length, 3),
                "width": round(max(100 * took / self.length, NARROWEST), 3), "seconds": took}
