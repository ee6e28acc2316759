"""The log of an attempt as lines for the log view (static/orchestrator/logview.js): a line of
``logging`` output (the executor's format, ``<date> <time>,<ms> <LEVEL> <logger>: <message>``)
carries its level, and so do the lines that continue its record (an indented traceback line or
the traceback's first line); any other text a task wrote has no level, and no filter hides it."""

from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

RECORD = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),(\d{3}) (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
CONTINUES = re.compile(r"[ \t]|Traceback \(most recent call last\):")


@register.filter
def log_lines(text: str) -> SafeString:
    """Each line of ``text`` escaped, in ``<span class="ln" data-level="…">`` (a level only for
    records and their continuations)."""
    if not text:
        return mark_safe("")
    level = ""
    out = []
    for line in text.splitlines(keepends=True):
        record = RECORD.match(line)
        if record:
            level = record.group(4).lower()
        elif not (level and CONTINUES.match(line)):
            level = ""
        text = escape(line)
        if record:
            # The record's time (UTC, see executor.log_formatter) as a <time> that app.js shows in
            # the reader's chosen clock, like every other time on the pages.
            day, clock, ms = record.group(1, 2, 3)
            stamp = f"{day} {clock},{ms}"
            text = f'<time datetime="{day}T{clock}.{ms}Z">{stamp}</time>{text[len(stamp):]}'
        out.append(f'<span class="ln" data-level="{level}">{text}</span>' if level
                   else f'<span class="ln">{text}</span>')
    return mark_safe("".join(out))
