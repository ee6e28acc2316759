"""Drawings of the web pages as inline SVG: the task graph and the run-history chart.

Every name and label goes through ``format_html``/``escape``; only numbers computed here are
written as they are. Colours come from CSS classes (``st-<state>``) so the palette lives in one
stylesheet.
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

NODE_W, NODE_H = 168, 30
GAP_X, GAP_Y = 56, 14
PAD = 8


def layers(upstream: dict[str, list[str]]) -> list[list[str]]:
    """Tasks grouped by topological generation (roots first), ordered inside a layer by the mean
    position of their parents so that edges cross less."""
    sorter = graphlib.TopologicalSorter({child: [p for p in parents if p in upstream] for child, parents in upstream.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError:
        # A stored graph is validated acyclic at sync; an old or hand-made one still gets drawn.
        return [sorted(upstream)]
    generations = []
    while sorter.is_active():  # each round: the tasks whose parents are all in earlier layers
        layer = sorted(sorter.get_ready())
        sorter.done(*layer)
        generations.append(layer)
    position: dict[str, float] = {}
    ordered = []
    for layer in generations:
        def rank(name, layer=layer):
            parents = [position[p] for p in upstream.get(name, []) if p in position]
            return (sum(parents) / len(parents) if parents else layer.index(name), name)

        layer = sorted(layer, key=rank)
        for index, name in enumerate(layer):
            position[name] = index
        ordered.append(layer)
    return ordered


def upstream_of(spec: dict) -> dict[str, list[str]]:
    """{task: its parents} of a graph version's spec, what the drawings take."""
    return {name: list(task.get("upstream", [])) for name, task in spec.get("tasks", {}).items()}


def task_order(upstream: dict[str, list[str]]) -> list[str]:
    return [name for layer in layers(upstream) for name in layer]


def _label(name: str, limit: int = 22) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def graph(upstream: dict[str, list[str]], states: dict[str, str], links: dict[str, str],
          notes: dict[str, tuple[str, str]] | None = None) -> SafeString:
    """The DAG left to right, one column per generation; each node coloured by its state and
    linked to its task run when there is one (the link named "task: state"), in a view that
    pans and zooms (static/orchestrator/graph.js). ``notes`` adds (short, long) text to a node: a
    mapped task's instance counts (see ``mapped_node``)."""
    if not upstream:
        return mark_safe('<p class="muted">This workflow has no tasks.</p>')
    columns = layers(upstream)
    tallest = max(len(column) for column in columns)
    width = PAD * 2 + len(columns) * NODE_W + (len(columns) - 1) * GAP_X
    height = PAD * 2 + tallest * NODE_H + (tallest - 1) * GAP_Y
    where: dict[str, tuple[int, int]] = {}
    for col, column in enumerate(columns):
        offset = (tallest - len(column)) * (NODE_H + GAP_Y) / 2
        for row, name in enumerate(column):
            where[name] = (PAD + col * (NODE_W + GAP_X), int(PAD + offset + row * (NODE_H + GAP_Y)))
    # Not role="img": it holds links, each named for a screen reader. graph.js pans and zooms the
    # scroll box; without script it still scrolls, by keyboard too (a graph without links, of a
    # workflow not run yet, still has a focusable box).
    parts = [format_html(
        '<div class="dag-view"><div class="dag-tools" role="toolbar" aria-label="zoom the graph">'
        '<button type="button" class="small" data-zoom="out" aria-label="zoom out">−</button>'
        '<span class="muted small" data-zoom-level>100 %</span>'
        '<button type="button" class="small" data-zoom="in" aria-label="zoom in">+</button>'
        '<button type="button" class="small" data-zoom="fit">fit</button>'
        '<button type="button" class="small" data-zoom="reset">100 %</button></div>'
        '<div class="dag-scroll" tabindex="0" role="region" aria-label="task graph: scroll to pan">'
        '<svg class="dag" viewBox="0 0 {} {}" width="{}" height="{}" role="group"'
        ' aria-label="task graph, {} tasks">',
        width, height, width, height, len(where),
    )]
    for child, parents in upstream.items():
        for parent in parents:
            if parent not in where:
                continue
            x1, y1 = where[parent][0] + NODE_W, where[parent][1] + NODE_H // 2
            x2, y2 = where[child][0], where[child][1] + NODE_H // 2
            mid = (x1 + x2) / 2
            parts.append(format_html(
                '<path class="edge" d="M{} {} C{} {} {} {} {} {}"/>', x1, y1, _n(mid), y1, _n(mid), y2, x2 - 4, y2
            ))
            parts.append(format_html('<path class="arrow" d="M{} {} l-6 -4 v8 z"/>', x2, y2))
    for index, (name, (x, y)) in enumerate(where.items()):
        if notes and name in notes:
            parts.append(mapped_node(name, x, y, states.get(name, "none"), *notes[name], links.get(name),
                                     node_id=f"node-{index}"))
            continue
        node_state = states.get(name, "none")
        label = str(node_state).replace("_", " ") if node_state != "none" else "no run"
        node = format_html(
            '<g class="node st-{}"><title>{}: {}</title><rect x="{}" y="{}" width="{}" height="{}" rx="5"/>'
            '<circle cx="{}" cy="{}" r="4"/><text x="{}" y="{}">{}</text></g>',
            node_state, name, label, x, y, NODE_W, NODE_H, x + 12, y + NODE_H // 2, x + 22, y + NODE_H // 2 + 4,
            _label(name),
        )
        if name in links:
            # An id per node: htmx gives the focus back to it after a live update redraws the graph.
            node = format_html('<a id="node-{}" href="{}" aria-label="{}: {}">{}</a>', index, links[name], name, label,
                               node)
        parts.append(node)
    parts.append(mark_safe("</svg></div></div>"))
    return mark_safe("".join(str(part) for part in parts))


def mapped_node(name: str, x: int, y: int, node_state: str, short: str, long: str, link: str | None,
                node_id: str = "") -> SafeString:
    """A mapped task: one node drawn as a stack of cards, its label shortened to make room for
    the instance counts (ended/total); the full counts in its title."""
    node = format_html(
        '<g class="node mapped st-{}"><title>{}: {}, {}</title>'
        '<rect class="stack" x="{}" y="{}" width="{}" height="{}" rx="5"/>'
        '<rect x="{}" y="{}" width="{}" height="{}" rx="5"/>'
        '<circle cx="{}" cy="{}" r="4"/><text x="{}" y="{}">{} <tspan class="count" x="{}" text-anchor="end">{}</tspan>'
        '</text></g>',
        node_state, name, str(node_state).replace("_", " "), long,
        x + 3, y - 3, NODE_W, NODE_H, x, y, NODE_W, NODE_H,
        x + 12, y + NODE_H // 2, x + 22, y + NODE_H // 2 + 4, _label(name, 13),
        x + NODE_W - 8, short,
    )
    if not link:
        return node
    # The accessible name holds the visible text ("name ended/total", one text element so that the
    # two read as words), as a spoken label must.
    return format_html('<a id="{}" href="{}" aria-label="{} {} ended: {}, {}">{}</a>', node_id, link, name, short,
                       str(node_state).replace("_", " "), long, node)


@dataclass
class Bar:
    run_id: int
    state: str
    seconds: float
    href: str


def history_chart(bars: list[Bar], width: int = 560, height: int = 110) -> SafeString:
    """Recent run durations as bars (oldest left), coloured by the run's final state."""
    if not bars:
        return mark_safe('<p class="muted">No finished runs yet.</p>')
    top = max(bar.seconds for bar in bars) or 1.0
    left, bottom = 44, 16
    plot_w, plot_h = width - left - 4, height - bottom - 6
    step = plot_w / max(len(bars), 1)
    bar_w = max(2.0, min(18.0, step * 0.72))
    parts = [format_html(
        '<svg class="chart" viewBox="0 0 {} {}" width="{}" height="{}" role="group" aria-label="run durations">',
        width, height, width, height,
    )]
    parts.append(format_html('<line class="axis" x1="{}" y1="{}" x2="{}" y2="{}"/>', left, 6 + plot_h, width - 4, 6 + plot_h))
    for fraction in (0.5, 1.0):
        y = 6 + plot_h - plot_h * fraction
        parts.append(format_html('<line class="grid" x1="{}" y1="{}" x2="{}" y2="{}"/>', left, _n(y), width - 4, _n(y)))
        parts.append(format_html('<text class="tick" x="{}" y="{}">{}</text>', left - 4, _n(y + 3),
                                 _short_duration(top * fraction)))
    for index, bar in enumerate(bars):
        h = max(1.5, plot_h * bar.seconds / top)
        x = left + index * step + (step - bar_w) / 2
        parts.append(format_html(
            '<a href="{}"><rect class="bar st-{}" x="{}" y="{}" width="{}" height="{}" rx="1.5">'
            '<title>run #{}: {}, {}</title></rect></a>',
            bar.href, bar.state, _n(x), _n(6 + plot_h - h), _n(bar_w), _n(h), bar.run_id, bar.state, _short_duration(bar.seconds),
        ))
    parts.append(format_html('<text class="tick start" x="{}" y="{}">older</text>', left, height - 2))
    parts.append(format_html('<text class="tick" x="{}" y="{}">newer</text>', width - 4, height - 2))
    parts.append(mark_safe("</svg>"))
    return mark_safe("".join(str(part) for part in parts))


def _n(value: float) -> str:
    """A coordinate with one decimal (format_html escapes its arguments before formatting)."""
    return f"{value:.1f}"


def _short_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"

