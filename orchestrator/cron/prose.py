"""The prose of :func:`describe`: a schedule in words, or the expression itself where words would mislead."""

from __future__ import annotations

import re

from orchestrator.cron.expression import MONTH_FULL, Parsed, join, parsed

_DOW_FULL = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_STEP_RE = re.compile(r"\*/(\d+)")
_MAX_LISTED = 6


class _Undescribable(Exception):
    pass


def _runs(values: list[int], name) -> list[str]:
    """["Monday to Friday"] for consecutive runs of three or more, else the items one by one."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{name(values[i])} to {name(values[j])}")
        else:
            out.extend(name(v) for v in values[i : j + 1])
        i = j + 1
    if len(out) > _MAX_LISTED:
        raise _Undescribable
    return out


def _step(token: str, cycle: int) -> int | None:
    match = _STEP_RE.fullmatch(token)
    # "*/7" restarts at :00 every hour, so "every 7 minutes" would be a lie; only exact divisors read well.
    if match and cycle % int(match.group(1)) == 0:
        return int(match.group(1))
    return None


def _every(n: int, unit: str) -> str:
    return f"every {unit}" if n == 1 else f"every {n} {unit}s"


def _hour_span(schedule: Parsed, hour_token: str) -> tuple[int, int] | None:
    """(first, last) hour when the hour field is one hour or one run of consecutive hours."""
    if "*" in hour_token or "," in hour_token or "/" in hour_token:
        return None
    hours = schedule.hours
    if list(hours) != list(range(hours[0], hours[-1] + 1)):
        return None
    return hours[0], hours[-1]


def _time_phrase(schedule: Parsed) -> tuple[str, bool]:
    """The time-of-day part, and whether it is a list of clock times (which reads "every day at ...")."""
    sec_token, minute, hour = schedule.tokens[:3]
    if sec_token is not None and schedule.seconds != (0,):
        steps = (_seconds_phrase,)
    else:
        steps = (_minutes_phrase, _clock_times_phrase, _hour_span_phrase)
    for step in steps:
        phrase = step(schedule, minute, hour)
        if phrase is not None:
            return phrase
    raise _Undescribable


def _seconds_phrase(schedule: Parsed, minute: str, hour: str) -> tuple[str, bool] | None:
    """"every 10 seconds", "every minute at second 5", "at 03:00:30": a seconds field other than 0."""
    sec_token, seconds = schedule.tokens[0], schedule.seconds
    if minute == "*" and hour == "*":
        if sec_token == "*":
            return "every second", False
        if (n := _step(sec_token, 60)) is not None:
            return _every(n, "second"), False
        if len(seconds) == 1:
            return f"every minute at second {seconds[0]}", False
    if len(seconds) == 1 and schedule.fixed and len(schedule.minutes) * len(schedule.hours) <= _MAX_LISTED:
        times = [f"{h:02}:{m:02}:{seconds[0]:02}" for h in schedule.hours for m in schedule.minutes]
        return f"at {join(times)}", True
    return None


def _minutes_phrase(schedule: Parsed, minute: str, hour: str) -> tuple[str, bool] | None:
    """"every minute", "every 15 minutes": any hour."""
    if minute == "*" and hour == "*":
        return "every minute", False
    if hour == "*" and (n := _step(minute, 60)) is not None:
        return _every(n, "minute"), False
    return None


def _clock_times_phrase(schedule: Parsed, minute: str, hour: str) -> tuple[str, bool] | None:
    """"every hour at :15", "every 2 hours at :15", "at 09:00 and 17:00": a short list of minutes."""
    minutes, hours = schedule.minutes, schedule.hours
    if "*" in minute or len(minutes) > _MAX_LISTED:
        return None
    at = join([f":{m:02}" for m in minutes])
    if hour == "*":
        return f"every hour at {at}", False
    if (n := _step(hour, 24)) is not None:
        return f"{_every(n, 'hour')} at {at}", False
    if len(minutes) * len(hours) <= _MAX_LISTED:
        return f"at {join([f'{h:02}:{m:02}' for h in hours for m in minutes])}", True
    span = _hour_span(schedule, hour)
    if span and len(minutes) == 1:
        return f"every hour from {span[0]:02}:{minutes[0]:02} to {span[1]:02}:{minutes[0]:02}", False
    return None


def _hour_span_phrase(schedule: Parsed, minute: str, hour: str) -> tuple[str, bool] | None:
    """"every 15 minutes from 09:00 to 17:45": every minute, or a step of minutes, within a run of hours."""
    span = _hour_span(schedule, hour)
    if span and (minute == "*" or _step(minute, 60)):
        every = "every minute" if minute == "*" else _every(_step(minute, 60), "minute")
        return f"{every} from {span[0]:02}:00 to {span[1]:02}:{schedule.minutes[-1]:02}", False
    return None


def _restricted(schedule: Parsed) -> tuple[bool, bool]:
    """Whether the days of the month, and the days of the week, restrict the days it runs on."""
    both_must_match = schedule.dom_star or schedule.dow_star
    dom_restricted, dow_restricted = len(schedule.doms) < 31, len(schedule.dows) < 7
    if not both_must_match and not (dom_restricted and dow_restricted):
        # Either may match and one of them matches every day: every day it is.
        return False, False
    if dom_restricted and dow_restricted and both_must_match:
        raise _Undescribable  # "*/2" with a weekday: odd-numbered days that are also Mondays
    return dom_restricted, dow_restricted


def _day_phrases(schedule: Parsed) -> list[str]:
    months = sorted(schedule.months)
    doms, dows = sorted(schedule.doms), schedule.dows
    dom_restricted, dow_restricted = _restricted(schedule)
    if dom_restricted and not dow_restricted and len(doms) == 1 and len(months) == 1:
        return [f"on {doms[0]} {MONTH_FULL[months[0]]}"]
    parts = []
    dom_phrase = f"on day{'s' if len(doms) > 1 else ''} {join(_runs(doms, str))} of the month" \
        if dom_restricted else None
    if dow_restricted:
        # Monday first, Sunday last: "Saturday and Sunday" reads better than "Sunday and Saturday".
        iso = sorted((d - 1) % 7 for d in dows)
        dow_phrase = f"on {join(_runs(iso, lambda i: _DOW_FULL[(i + 1) % 7]))}"
        parts.append(f"{dom_phrase} or {dow_phrase}" if dom_phrase else dow_phrase)
    elif dom_phrase:
        parts.append(dom_phrase)
    if len(months) < 12:
        parts.append(f"in {join(_runs(months, lambda m: MONTH_FULL[m]))}")
    return parts


def describe(expr: str) -> str:
    """The schedule in words, e.g. "every day at 02:30", "every hour at :00", "every 15 minutes",
    "at 09:00 on Monday to Friday", "every minute". Best effort: shapes it cannot put into words well come
    back as the (normalised) expression itself. Raises :class:`CronError` for an invalid expression."""
    schedule = parsed(expr)
    try:
        time_phrase, clock_times = _time_phrase(schedule)
        days = _day_phrases(schedule)
    except _Undescribable:
        return schedule.expression
    if clock_times and not any(part.startswith("on ") for part in days):
        time_phrase = f"every day {time_phrase}"
    return " ".join([time_phrase, *days])
