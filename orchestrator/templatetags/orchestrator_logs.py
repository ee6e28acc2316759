"""The log of an attempt as lines for the log view (static/orchestrator/logview.js): a line of
``logging`` output (the executor's format, ``<date> <time>,<ms> <LEVEL> <logger>: <message>``)
carries its level, and so do the lines that continue its record (an indented traceback line, the
traceback's first line, its chained-exception notes and the exception line that ends it); a
traceback outside any record (the attempt's failure, an uncaught exception) is an error; any other
text a task wrote (``print()``, a shell command's output) has the level ``stdout``, which the view
filters as a level of its own."""

from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

RECORD = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),(\d{3}) (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
CONTINUES = re.compile(r"[ \t]|Traceback \(most recent call last\):")
# Inside a record's traceback: the notes between chained exceptions, and blank lines around them.
CHAINED = re.compile(r"\s*$|The above exception was the direct cause|During handling of the above exception")
# The line that ends a traceback: the exception, ``ValueError: no orders`` or ``pkg.Error``.
EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(:|\s*$)")
PRINTED = "stdout"


def next_level(line: str, record, level: str, traceback: str) -> tuple[str, str]:
    """The level of ``line`` and the traceback state after it, from those of the line before:
    ``traceback`` is "" (none), "open" or "ended" (by its exception line)."""
    if record:
        return record.group(4).lower(), ""
    if level:
        continued = _continues(line, traceback)
        if continued is not None:
            return level, continued
    if line.startswith("Traceback (most recent call last):"):
        # A traceback outside any record: the attempt's own failure (the executor writes it) or
        # an uncaught exception on stderr. An error, which "error and above" keeps.
        return "error", "open"
    return "", ""


def _continues(line: str, traceback: str) -> str | None:
    """The traceback state after ``line`` when it continues a record's text; None when it does not."""
    if CONTINUES.match(line) and traceback != "ended":
        return "open" if traceback or line.startswith("Traceback") else ""
    if line.startswith("Traceback"):
        return "open"  # the next exception of a chain
    if traceback and CHAINED.match(line):
        return traceback  # between chained exceptions
    if traceback == "open" and EXCEPTION.match(line):
        return "ended"
    return None


def line_html(line: str, record) -> str:
    """A line escaped; a record's time (UTC, see executor.log_formatter) as a <time> that app.js
    shows in the reader's chosen clock, like every other time on the pages."""
    text = escape(line)
    if record:
        day, clock, ms = record.group(1, 2, 3)
        stamp = f"{day} {clock},{ms}"
        text = f'<time datetime="{day}T{clock}.{ms}Z">{stamp}</time>{text[len(stamp):]}'
    return text


@register.filter
def log_lines(text: str) -> SafeString:
    """Each line of ``text`` escaped, in ``<span class="ln" data-level="…">``: a record's level
    for records and their continuations, ``stdout`` for any other line."""
    if not text:
        return mark_safe("")
    level = traceback = ""
    out = []
    for line in text.splitlines(keepends=True):
        record = RECORD.match(line)
        level, traceback = next_level(line, record, level, traceback)
        out.append(f'<span class="ln" data-level="{level or PRINTED}">{line_html(line, record)}</span>')
    return mark_safe("".join(out))
