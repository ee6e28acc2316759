"""Drawings of the web pages as inline SVG: the task graph and the run-history chart.

A task group (``orchestrator.web.folding``) folded is one node of the graph, its edges merged,
coloured by its tasks' worst state with their counts; unfolded, its tasks are laid out inside a
box that is one node of the level around it (so no other task falls inside it).

Every name and label goes through ``format_html``/``escape``; only numbers computed here are
written as they are. Colours come from CSS classes (``st-<state>``) so the palette lives in one
stylesheet.
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable
from dataclasses import dataclass, field

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from orchestrator.web import folding
from orchestrator.web.folding import Fold, Groups

NODE_W, NODE_H = 168, 30
GAP_X, GAP_Y = 56, 14
PAD = 8
BOX_PAD, BOX_TOP = 10, 26  # px around an unfolded group's tasks; above them, its name


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


# What a node is, as its badge says it (the spec's options, first that applies).
KINDS = (("sensor", "sensor"), ("branch", "branch"), ("approval", "approval"), ("map_over", "mapped"))
# Dataset nodes are drawn among the tasks under names no task can have (a control character).
CONSUMED, PRODUCED = "\x1fin:", "\x1fout:"
GROUP = "\x1fgroup:"  # a folded group's node


@dataclass
class Shape:
    """What the graph shows besides tasks and edges: each task's kind (a badge on its node), the
    datasets whose events start the workflow (nodes before its first tasks) and those its tasks
    produce (nodes after each producer), each linking to its dataset page."""

    kinds: dict[str, str] = field(default_factory=dict)
    consumes: list[str] = field(default_factory=list)
    produces: dict[str, list[str]] = field(default_factory=dict)
    dataset_links: dict[str, str] = field(default_factory=dict)
    groups: Groups = field(default_factory=Groups)


def shape_of(spec: dict, dataset_url: Callable[[str], str]) -> Shape:
    """The Shape of a graph version's spec; ``dataset_url`` gives a dataset page's address."""
    tasks = spec.get("tasks", {})
    kinds = {}
    for name, task in tasks.items():
        kind = next((label for key, label in KINDS if task.get(key)), None)
        if kind:
            kinds[name] = kind
    consumes = sorted({d for trigger in spec.get("triggers", []) for d in trigger.get("datasets", [])})
    produces = {name: list(task["produces"]) for name, task in tasks.items() if task.get("produces")}
    named = set(consumes) | {d for names in produces.values() for d in names}
    return Shape(kinds, consumes, produces, {d: dataset_url(d) for d in named}, Groups.of_spec(spec))


def with_datasets(upstream: dict[str, list[str]], shape: Shape) -> dict[str, list[str]]:
    """``upstream`` with the shape's dataset nodes: a consumed dataset is a parent of the first
    tasks, a produced one a child of its producer."""
    if not shape.consumes and not shape.produces:
        return upstream
    drawn = {name: list(parents) for name, parents in upstream.items()}
    roots = [name for name, parents in upstream.items() if not parents]
    for dataset in shape.consumes:
        drawn[CONSUMED + dataset] = []
        for root in roots:
            drawn[root].append(CONSUMED + dataset)
    for task, datasets in shape.produces.items():
        for dataset in datasets:
            if task in drawn:
                drawn.setdefault(PRODUCED + dataset, []).append(task)
    return drawn


def graph(upstream: dict[str, list[str]], states: dict[str, str], links: dict[str, str],
          notes: dict[str, tuple[str, str]] | None = None, shape: Shape | None = None,
          fold: Fold | None = None) -> SafeString | Drawing:
    """The DAG left to right, one column per generation; each node coloured by its state and
    linked to its task run when there is one (the link named "task: state"), in a view that
    pans and zooms (static/orchestrator/graph.js). ``notes`` adds (short, long) text to a node: a
    mapped task's instance counts (see ``mapped_node``); ``shape`` the tasks' kinds, groups and
    the datasets consumed and produced. A graph with task groups is a ``Drawing``, drawn when
    shown with the groups ``fold`` (or the page's, see ``Drawing.drawn``) unfolds."""
    if shape is not None and shape.groups:
        return Drawing(upstream, states, links, notes, shape, fold)
    return _draw(upstream, states, links, notes, shape, Fold())


class Drawing:
    """A graph with task groups: which are unfolded is the page's choice (its ``?unfold=``), so it
    is drawn when the page shows it (``{{ graph|unfolded:grid_fold }}``), once."""

    def __init__(self, upstream, states, links, notes, shape, fold):
        self.parts = (upstream, states, links, notes, shape)
        self.fold = fold or Fold()

    def drawn(self, fold: Fold | None = None) -> SafeString:
        return _draw(*self.parts, fold or self.fold)

    def __html__(self) -> str:
        return self.drawn()

    def __str__(self) -> str:
        return str(self.drawn())


def _draw(upstream, states, links, notes, shape, fold: Fold) -> SafeString:
    if not upstream:
        return mark_safe('<p class="muted">This workflow has no tasks.</p>')
    shape = shape or Shape()
    task_count = len(upstream)
    groups = shape.groups
    tasks = list(upstream)
    upstream = with_datasets(upstream, shape)
    where, boxes, width, height = place(upstream, groups, fold.unfolded)
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
        width, height, width, height, task_count,
    )]
    for name, x, y, w, h in boxes:
        parts.append(group_box(name, x, y, w, h, len(groups.members(name, tasks)), groups.tooltip.get(name, ""),
                               fold.toggle(name)))

    def shown(name: str) -> str:
        group = groups.shown_as(name, fold.unfolded) if groups else None
        return GROUP + group if group else name

    drawn = set()
    for child, parents in upstream.items():
        for parent in parents:
            edge = (shown(parent), shown(child))
            if edge[0] == edge[1] or edge in drawn or edge[0] not in where or edge[1] not in where:
                continue
            drawn.add(edge)
            x1, y1 = where[edge[0]][0] + NODE_W, where[edge[0]][1] + NODE_H // 2
            x2, y2 = where[edge[1]][0], where[edge[1]][1] + NODE_H // 2
            mid = (x1 + x2) / 2
            parts.append(format_html(
                '<path class="edge" d="M{} {} C{} {} {} {} {} {}"/>', x1, y1, _n(mid), y1, _n(mid), y2, x2 - 4, y2
            ))
            parts.append(format_html('<path class="arrow" d="M{} {} l-6 -4 v8 z"/>', x2, y2))
    for index, (name, (x, y)) in enumerate(where.items()):
        if name.startswith(GROUP):
            group = name.removeprefix(GROUP)
            members = groups.members(group, tasks)
            parts.append(group_node(group, x, y, [states[t] for t in members if t in states], len(members),
                                    groups.tooltip.get(group, ""), fold.toggle(group), node_id=f"node-{index}"))
        elif name.startswith((CONSUMED, PRODUCED)):
            parts.append(dataset_node(name, x, y, shape))
        elif notes and name in notes:
            parts.append(mapped_node(name, x, y, states.get(name, "none"), *notes[name], links.get(name),
                                     node_id=f"node-{index}"))
        else:
            parts.append(task_node(name, x, y, states.get(name, "none"), shape.kinds.get(name), links.get(name),
                                   node_id=f"node-{index}"))
    parts.append(mark_safe("</svg></div></div>"))
    return mark_safe("".join(str(part) for part in parts))


def place(upstream: dict[str, list[str]], groups: Groups, unfolded: frozenset[str]):
    """Where each node is drawn: ({node: (x, y)}, [(group, x, y, width, height) of each unfolded
    group's box], width, height). A folded group is one node (``GROUP`` + its name); an unfolded
    one a box laid out as one node of the level around it, its own nodes laid out inside."""
    def item(name: str, level: tuple[str, ...]) -> str | None:
        path = groups.path.get(name, ())
        if path[:len(level)] != level:
            return None
        return name if len(path) == len(level) else GROUP + path[len(level)]

    def block(level: tuple[str, ...]):
        items: dict[str, set[str]] = {}
        for child, parents in upstream.items():
            mine = item(child, level)
            if mine is None:
                continue
            items.setdefault(mine, set())
            for parent in parents:
                theirs = item(parent, level) if parent in upstream else None
                if theirs is not None and theirs != mine:
                    items[mine].add(theirs)
        columns = layers({key: sorted(parents) for key, parents in items.items()})
        inner, size = {}, {}
        for key in items:
            group = key.removeprefix(GROUP) if key.startswith(GROUP) else None
            if group is not None and group in unfolded:
                inner[key] = block((*level, group))
                size[key] = (inner[key][2] + 2 * BOX_PAD, inner[key][3] + BOX_TOP + BOX_PAD)
            else:
                size[key] = (NODE_W, NODE_H)
        widths = [max(size[key][0] for key in column) for column in columns]
        heights = [sum(size[key][1] for key in column) + (len(column) - 1) * GAP_Y for column in columns]
        where, boxes, x = {}, [], 0
        for col, column in enumerate(columns):
            y = (max(heights) - heights[col]) / 2
            for key in column:
                if key in inner:
                    at_x, at_y = x, int(y)
                    boxes.append((key.removeprefix(GROUP), at_x, at_y, *size[key]))
                    where.update({name: (at_x + BOX_PAD + ix, at_y + BOX_TOP + iy)
                                  for name, (ix, iy) in inner[key][0].items()})
                    boxes += [(name, at_x + BOX_PAD + bx, at_y + BOX_TOP + by, bw, bh)
                              for name, bx, by, bw, bh in inner[key][1]]
                else:
                    where[key] = (x, int(y))
                y += size[key][1] + GAP_Y
            x += widths[col] + GAP_X
        return where, boxes, sum(widths) + (len(columns) - 1) * GAP_X, max(heights)

    where, boxes, width, height = block(())
    return ({name: (PAD + x, PAD + y) for name, (x, y) in where.items()},
            [(name, PAD + x, PAD + y, w, h) for name, x, y, w, h in boxes], width + 2 * PAD, height + 2 * PAD)


def group_box(name: str, x: int, y: int, width: int, height: int, size: int, tooltip: str,
              toggle: str) -> SafeString:
    """An unfolded group: a box around its tasks, its name a link that folds it."""
    said = f"group {name}, {size} task{'s' if size != 1 else ''}{': ' + tooltip if tooltip else ''}"
    return format_html(
        '<g class="group-box"><rect class="box" x="{}" y="{}" width="{}" height="{}" rx="8"/>'
        '<a href="?{}#graph" aria-expanded="true" aria-label="{}; fold"><title>{}</title>'
        '<rect class="fold-hit" x="{}" y="{}" width="{}" height="18" rx="4"/>'
        '<text x="{}" y="{}">▾ {}</text></a></g>',
        x, y, width, height, toggle, said, said, x + 4, y + 3, min(width - 8, NODE_W), x + 10, y + 16,
        _label(name, 20),
    )


def group_node(name: str, x: int, y: int, task_states: list[str], size: int, tooltip: str, toggle: str,
               node_id: str) -> SafeString:
    """A folded group: one node drawn as a stack, coloured by its tasks' worst state in the run
    shown, with how many of its tasks ended (of how many) and a strip of its tasks' states; a
    link that unfolds it."""
    counts = folding.counts_of(task_states)
    node_state = folding.worst(task_states) or "none"
    ended = sum(n for state, n in counts if state in folding.ENDED)
    short = f"{ended}/{size}" if counts else f"{size}"
    words = folding.said(counts) if counts else "no run"
    said = f"{name} {short}: group of {size} task{'s' if size != 1 else ''}, {words}"
    strip, left = [], x + 6
    for state, n in counts:
        wide = (NODE_W - 12) * n / max(size, 1)
        strip.append(format_html('<rect class="seg st-{}" x="{}" y="{}" width="{}" height="3"/>',
                                 state, _n(left), y + NODE_H - 6, _n(wide)))
        left += wide
    node = format_html(
        '<g class="node group st-{}"><title>{}{}</title>'
        '<rect class="stack" x="{}" y="{}" width="{}" height="{}" rx="5"/>'
        '<rect x="{}" y="{}" width="{}" height="{}" rx="5"/>'
        '<circle cx="{}" cy="{}" r="4"/><text x="{}" y="{}">{} <tspan class="count" x="{}" text-anchor="end">{}</tspan>'
        '</text>{}</g>',
        node_state, said, f". {tooltip}" if tooltip else "", x + 3, y - 3, NODE_W, NODE_H, x, y, NODE_W, NODE_H,
        x + 12, y + NODE_H // 2 - 1, x + 22, y + NODE_H // 2 + 3, _label(name, 14), x + NODE_W - 8, short,
        mark_safe("".join(str(part) for part in strip)),
    )
    return format_html('<a id="{}" href="?{}#graph" aria-expanded="false" aria-label="{}; unfold">{}</a>',
                       node_id, toggle, said, node)


def task_node(name: str, x: int, y: int, node_state: str, kind: str | None, link: str | None,
              node_id: str) -> SafeString:
    """A task: its state's colour, its name, and a badge saying what it is (sensor, branch,
    approval, mapped) when it is more than a plain task."""
    label = str(node_state).replace("_", " ") if node_state != "none" else "no run"
    # The badge is a tspan of the name's text element, so that the two read as words and the
    # accessible name ("name kind: state") holds the visible text.
    said = f"{name} {kind}" if kind else name
    badge = format_html(' <tspan class="kind" x="{}" text-anchor="end">{}</tspan>', x + NODE_W - 7, kind) if kind else ""
    node = format_html(
        '<g class="node st-{}{}"><title>{}: {}</title><rect x="{}" y="{}" width="{}" height="{}" rx="5"/>'
        '<circle cx="{}" cy="{}" r="4"/><text x="{}" y="{}">{}{}</text></g>',
        node_state, " has-kind" if kind else "", said, label, x, y, NODE_W, NODE_H, x + 12, y + NODE_H // 2,
        x + 22, y + NODE_H // 2 + 4, _label(name, 13 if kind else 22), badge,
    )
    if not link:
        return node
    # An id per node: htmx gives the focus back to it after a live update redraws the graph.
    return format_html('<a id="{}" href="{}" aria-label="{}: {}">{}</a>', node_id, link, said, label, node)


def dataset_node(key: str, x: int, y: int, shape: Shape) -> SafeString:
    """A dataset the workflow consumes (before its first tasks) or produces (after its producer),
    linking to the dataset's page."""
    consumed = key.startswith(CONSUMED)
    name = key.removeprefix(CONSUMED if consumed else PRODUCED)
    said = f"{name}: dataset, {'starts this workflow' if consumed else 'produced'}"
    node = format_html(
        '<g class="node dataset"><title>{}</title><rect x="{}" y="{}" width="{}" height="{}" rx="{}"/>'
        '<text x="{}" y="{}"{}>{}</text></g>',
        said, x, y, NODE_W, NODE_H, NODE_H // 2, x + 14, y + NODE_H // 2 + 4, _fit(name, NODE_W - 28), name,
    )
    link = shape.dataset_links.get(name)
    return format_html('<a href="{}" aria-label="{}">{}</a>', link, said, node) if link else node


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


def _fit(text: str, width: int) -> SafeString:
    """Attributes that squeeze ``text`` into ``width`` px when it is longer: the whole text stays
    drawn (and is what a screen reader's name holds), never cut with an ellipsis."""
    if len(text) * 7.3 <= width:  # 12 px monospace
        return mark_safe("")
    return format_html(' textLength="{}" lengthAdjust="spacingAndGlyphs"', width)


def lineage(dataset: str, producers: list[tuple[str, str]], consumers: list[tuple[str, str]]) -> SafeString:
    """A dataset's lineage left to right: the tasks that produce it ("workflow.task", linking to
    the workflow), the dataset, and the workflows its events start. Each item is (label, link)."""
    rows = max(len(producers), len(consumers), 1)
    height = PAD * 2 + rows * NODE_H + (rows - 1) * GAP_Y
    columns = [producers, [(dataset, "")], consumers] if consumers else [producers, [(dataset, "")]]
    if not producers:
        columns = columns[1:]
    width = PAD * 2 + len(columns) * NODE_W + (len(columns) - 1) * GAP_X
    where: list[list[tuple[int, int]]] = []
    for col, items in enumerate(columns):
        offset = (rows - len(items)) * (NODE_H + GAP_Y) / 2
        where.append([(PAD + col * (NODE_W + GAP_X), int(PAD + offset + row * (NODE_H + GAP_Y)))
                      for row in range(len(items))])
    parts = [format_html(
        '<div class="dag-scroll" tabindex="0" role="region" aria-label="lineage of dataset {}">'
        '<svg class="dag lineage" viewBox="0 0 {} {}" width="{}" height="{}" role="group"'
        ' aria-label="{} producer(s), dataset {}, {} consumer(s)">',
        dataset, width, height, width, height, len(producers), dataset, len(consumers))]
    middle = 1 if producers else 0
    (dx, dy), = where[middle]
    if producers:
        parts += [_edge(x + NODE_W, y, dx, dy) for x, y in where[0]]
    if consumers:
        parts += [_edge(dx + NODE_W, dy, x, y) for x, y in where[middle + 1]]
    for col, items in enumerate(columns):
        role = "dataset" if col == middle else "producer" if col < middle else "consumer"
        for (label, link), (x, y) in zip(items, where[col], strict=True):
            node = format_html(
                '<g class="node {}"><title>{}: {}</title><rect x="{}" y="{}" width="{}" height="{}" rx="{}"/>'
                '<text x="{}" y="{}"{}>{}</text></g>',
                "dataset" if role == "dataset" else "st-none lineage-" + role, label, role, x, y, NODE_W, NODE_H,
                NODE_H // 2 if role == "dataset" else 5, x + 12, y + NODE_H // 2 + 4, _fit(label, NODE_W - 24), label)
            parts.append(format_html('<a href="{}" aria-label="{}: {}">{}</a>', link, label, role, node)
                         if link else node)
    parts.append(mark_safe("</svg></div>"))
    return mark_safe("".join(str(part) for part in parts))


def _edge(x1: int, y1: int, x2: int, y2: int) -> SafeString:
    y1, y2 = y1 + NODE_H // 2, y2 + NODE_H // 2
    mid = (x1 + x2) / 2
    return format_html('<path class="edge" d="M{} {} C{} {} {} {} {} {}"/><path class="arrow" d="M{} {} l-6 -4 v8 z"/>',
                       x1, y1, _n(mid), y1, _n(mid), y2, x2 - 4, y2, x2, y2)


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

