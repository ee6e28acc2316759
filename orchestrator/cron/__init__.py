"""All cron arithmetic of the orchestrator, behind one core function: :func:`fire_times`.

The scheduler, backfills, UI previews and validation all go through this package so that every part of the
product agrees on what a schedule means. It deliberately imports nothing from Django.

    expression.py  parsing: the value sets of an expression, the matcher, CronError and its messages
    offsets.py     the UTC offset transitions of a zone, and the segments of constant offset between them
    fire.py        the core: fire_times and what is built on it (next fire time, preview, validate)
    prose.py       the prose of describe()

Expressions
-----------
* Five fields: ``minute hour day-of-month month day-of-week``. Each field takes ``*``, numbers, names
  (``JAN``-``DEC`` in the month field, ``SUN``-``SAT`` in the day-of-week field, any case), ranges ``a-b``,
  lists ``a,b,c`` and steps ``*/n``, ``a-b/n`` or ``a/n`` (from a to the end of the field). Day of week 0
  and 7 are both Sunday, and 7 is the end of that field, as in cron: ``7/2`` is Sunday alone and ``1/2`` is
  Monday, Wednesday, Friday and Sunday. A range whose start is above its end wraps around (``FRI-MON``,
  ``22-2``); a step keeps counting across the wrap (``50-10/7`` is :50, :57 and :04, seven minutes apart).
* Six fields: an optional **seconds field first**: ``*/10 * * * * *`` fires every 10 seconds and
  ``30 0 3 * * *`` at 03:00:30 every day.
* Aliases: ``@hourly`` ``@daily`` ``@midnight`` ``@weekly`` ``@monthly`` ``@yearly`` ``@annually``.
* Runs of whitespace are normalised. Anything else (``@reboot``, seven fields, the croniter extensions
  ``L``, ``W``, ``#``, ``?`` and ``H``, out-of-range values, non-strings, more than 1,000 characters) is
  rejected with a :class:`CronError`, whose message quotes at most the first 80 characters of the input.
* Days, as in Vixie/Debian cron: if the day-of-month or the day-of-week field starts with ``*``, a day must
  match both; otherwise it may match either (``0 0 1,15 * MON`` is the 1st, the 15th and every Monday, while
  ``0 0 */2 * MON`` is the odd-numbered days that are Mondays).

croniter is not used at run time: it reads an equal range such as ``5-5`` as the whole field (so
``0 5-5 * * *`` would fire hourly), its error messages do not say which value is wrong, and a get_next()
costs tens of microseconds, too slow for the scheduler's every-schedule sweeps. For the forms above the
value sets agree with croniter's (the tests compare them), except where this package follows cron: equal
ranges, the day rule (croniter's default treats ``*/2`` with a weekday as "either"), ``a/n`` in the
day-of-week field (croniter stops at Saturday, and reads ``7/2`` as every other day from Sunday) and a
reversed range with a step (croniter is one off after the wrap: ``50-10/7`` gives it :05).

Time zones and daylight saving time (Debian cron's rules)
---------------------------------------------------------
Matching happens on the wall clock of the schedule's IANA time zone; results are UTC instants between
0001-01-02 and 9999-12-30 (a day inside the calendar's ends, so every zone's wall time exists there).

* A *fixed-time* job is one whose minute field and hour field both start with something other than ``*``
  (``@daily`` and ``52,*/45 2 * * *`` are, ``@hourly`` and ``*/15 3 * * *`` are not). Debian cron looks at
  the first character only, and so does this package; see :func:`is_fixed_time`.
* Spring forward: a fixed-time job whose wall time falls into the gap runs once, at the first instant after
  the gap, however many of its wall times the gap swallowed. Other jobs follow real elapsed time, so wall
  times inside the gap simply do not happen.
* Fall back: a fixed-time job runs once, in the first occurrence of the repeated wall time. Other jobs fire
  in both occurrences, because real time elapses in both.
"""
from orchestrator.cron.expression import CronError
from orchestrator.cron.fire import fire_times, is_fixed_time, jitter_offset, next_fire_time, preview, validate
from orchestrator.cron.prose import describe

__all__ = [
    "CronError",
    "describe",
    "fire_times",
    "is_fixed_time",
    "jitter_offset",
    "next_fire_time",
    "preview",
    "validate",
]
