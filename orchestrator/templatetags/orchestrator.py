"""Template filters of the web pages: times (UTC in the markup, local in the browser), durations,
state badges and pretty JSON. Every value is escaped by ``format_html``."""

import inspect
import json
import re
from datetime import UTC, datetime, timedelta

from django import template
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from orchestrator.web import lineage

register = template.Library()


@register.filter
def dataset_url(name: str) -> str:
    """The address of a dataset's page (its name in the query, see ``lineage.url``)."""
    return lineage.url(name)


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


# ---------------------------------------------------------------- descriptions and docstrings
#
# Workflow descriptions are usually docstrings, written in reST or Markdown. A few rules cover what
# they use (inline code, emphasis, roles, bullet lists, literal blocks) on text escaped first, so
# no markup of the author's reaches the page as HTML. Not a Markdown or reST library: either would
# also render raw HTML and links, which then need a sanitizer, for text that uses none of it.

_CODE = re.compile(r"(?::[\w.-]+:)?``(.+?)``|(?::[\w.-]+:)?`([^`]+?)`(?:_{1,2})?")
_STRONG = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_EM = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_BULLET = re.compile(r"^\s*[-*+•]\s+")


def _inline(text: str) -> str:
    """Escaped ``text`` with inline code, strong and emphasis as HTML (code first: nothing inside
    it is markup)."""
    codes: list[str] = []

    def keep(match):
        codes.append(str(escape(match.group(1) if match.group(1) is not None else match.group(2))))
        return f"\x00{len(codes) - 1}\x00"

    text = str(escape(_CODE.sub(keep, text)))
    text = _STRONG.sub(r"<strong>\1</strong>", text)
    text = _EM.sub(r"<em>\1</em>", text)
    return re.sub(r"\x00(\d+)\x00", lambda m: f"<code>{codes[int(m.group(1))]}</code>", text)


def _blocks(text: str) -> list[list[str]]:
    blocks, current, fenced = [], [], False
    for line in inspect.cleandoc(str(text)).splitlines():
        if line.strip().startswith("```"):
            if current:
                blocks.append(current)
            current, fenced = [], not fenced
            if fenced:
                current = ["```"]
            continue
        if fenced:
            current.append(line)
        elif line.strip():
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


def _is_list(block: list[str]) -> bool:
    """A block of bullets, each perhaps continued on indented lines."""
    return bool(_BULLET.match(block[0])) and all(_BULLET.match(line) or line.startswith(("  ", "\t"))
                                                 for line in block)


def _list_html(block: list[str]) -> str:
    items: list[str] = []
    for line in block:
        if _BULLET.match(line):
            items.append(_BULLET.sub("", line))
        else:
            items[-1] += " " + line.strip()
    return "<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in items) + "</ul>"


@register.filter
def prose(text) -> str:
    """A description or docstring as safe HTML: paragraphs, bullet lists and literal blocks
    (reST ``::`` or Markdown fences), everything escaped."""
    if not text:
        return ""
    parts, literal_next = [], False
    for block in _blocks(text):
        if block[0] == "```" or literal_next:
            lines = block[1:] if block[0] == "```" else block
            parts.append(f"<pre>{escape(inspect.cleandoc(chr(10).join(lines)))}</pre>")
            literal_next = False
            continue
        if _is_list(block):
            parts.append(_list_html(block))
            continue
        paragraph = " ".join(line.strip() for line in block)
        if paragraph.endswith("::"):
            # reST: "text::" introduces a literal block and reads as "text:".
            literal_next = True
            paragraph = paragraph[:-2].rstrip()
            paragraph = paragraph + ":" if paragraph else ""
        if paragraph:
            parts.append(f"<p>{_inline(paragraph)}</p>")
    return mark_safe("".join(parts))  # noqa: S308 - every piece of text went through escape()


@register.filter
def prose_inline(text) -> str:
    """One line of description (a param's help): inline markup only, escaped."""
    if not text:
        return ""
    return mark_safe(_inline(" ".join(str(text).split())))  # noqa: S308 - escaped in _inline


@register.filter
def prose_summary(text, length: int = 110) -> str:
    """The first paragraph as plain text without markup characters, at most ``length`` characters."""
    blocks = _blocks(text) if text else []
    if not blocks:
        return ""
    plain = " ".join(line.strip() for line in blocks[0])
    plain = _CODE.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), plain)
    plain = _EM.sub(r"\1", _STRONG.sub(r"\1", plain)).removesuffix("::")
    return plain if len(plain) <= length else plain[: length - 1].rstrip() + "…"


@register.filter
def unfolded(graph, fold):
    """A graph drawing (``svg.graph``) with the groups ``fold`` unfolds (a grid's fold); a
    drawing without groups as it is."""
    return graph.drawn(fold) if hasattr(graph, "drawn") else graph
