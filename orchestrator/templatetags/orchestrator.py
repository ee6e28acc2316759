"""Template filters of the web pages: times (UTC in the markup, local in the browser), durations,
state badges and pretty JSON. Every value is escaped by ``format_html``."""

import json
from datetime import UTC, datetime, timedelta

from django import template
from django.utils.html import format_html

register = template.Library()


@register.filter
def ts(value: datetime | None):
    """A <time> element: the static text and the title are UTC; orchestrator/static/orchestrator/app.js rewrites the
    text into the viewer's timezone, so the title keeps UTC on hover."""
    if not value:
        return "—"
    utc = value.astimezone(UTC)
    text = utc.strftime("%Y-%m-%d %H:%M:%S UTC")
    return format_html('<time datetime="{}" title="{}">{}</time>', utc.isoformat().replace("+00:00", "Z"), text, text)


@register.filter
def duration(seconds) -> str:
    if seconds is None or seconds == "":
        return "—"
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    seconds = float(seconds)
    if seconds < 0:
        seconds = 0.0
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} m {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} m"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


@register.filter
def state(value) -> str:
    """A coloured badge; the CSS class is the state name (values come from the model's choices)."""
    if not value:
        return "—"
    return format_html('<span class="st st-{}">{}</span>', value, str(value).replace("_", " "))


@register.filter
def pretty_json(value) -> str:
    try:
        return json.dumps(value, indent=2, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


@register.filter
def get_item(mapping, key):
    try:
        return mapping.get(key)
    except AttributeError:
        return None
