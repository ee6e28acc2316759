"""Graph nodes say what a task is: a sensor, a branch, an approval or a mapped task carries a
badge (in its text and its accessible name); the datasets that start the workflow are drawn before
its first tasks and the datasets a task produces after it, each linking to its dataset page."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from orchestrator import access
from orchestrator.models import Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from orchestrator.web import lineage, svg
from tests.test_grid import user

SPEC = {
    "tasks": {
        "wait": {"upstream": [], "sensor": {"every": 60}},
        "pick": {"upstream": ["wait"], "branch": True, "children": ["big", "small"]},
        "big": {"upstream": ["pick"], "map_over": "pick"},
        "small": {"upstream": ["pick"], "approval": {"ask": "ok?"}},
        "publish": {"upstream": ["big", "small"], "produces": ["s3://b/../x", "daily"]},
    },
    "triggers": [{"datasets": ["raw <orders>"], "mode": "any"}],
}


def labels(drawing: str) -> list[str]:
    return [html.unescape(label) for label in re.findall(r'aria-label="([^"]*)"', drawing)]


def test_each_node_says_what_its_task_is_and_datasets_are_nodes_linking_to_their_pages():
    shape = svg.shape_of(SPEC, lineage.url)
    assert shape.kinds == {"wait": "sensor", "pick": "branch", "big": "mapped", "small": "approval"}
    links = {name: f"/t/{name}/" for name in SPEC["tasks"]}
    drawing = str(svg.graph(svg.upstream_of(SPEC), {"wait": "sensing"}, links, None, shape))

    found = labels(drawing)
    assert "task graph, 5 tasks" in found  # dataset nodes are not counted as tasks
    # Each accessible name starts with the node's visible text (its name, then its badge).
    assert "wait sensor: sensing" in found
    assert "pick branch: no run" in found and "big mapped: no run" in found
    assert "small approval: no run" in found and "publish: no run" in found
    assert "raw <orders>: dataset, starts this workflow" in found
    assert "s3://b/../x: dataset, produced" in found and "daily: dataset, produced" in found
    # The badge is drawn in the name's text; every name is escaped; a dataset links by query.
    assert '<tspan class="kind" ' in drawing and ">sensor</tspan></text>" in drawing
    assert "raw <orders>" not in drawing and "raw &lt;orders&gt;" in drawing
    assert f'href="{html.escape(lineage.url("s3://b/../x"))}"' in drawing
    # The consumed dataset is drawn left of the first task, the produced ones right of publish.
    x = {name: int(re.search(rf'<title>{re.escape(title)}[^<]*</title><rect x="(\d+)"', drawing).group(1))
         for name, title in [("in", "raw &lt;orders&gt;: dataset"), ("wait", "wait sensor:"),
                             ("publish", "publish:"), ("out", "daily: dataset")]}
    assert x["in"] < x["wait"] < x["publish"] < x["out"]


def test_a_plain_graph_is_drawn_as_before():
    upstream = {"a": [], "b": ["a"]}
    assert str(svg.graph(upstream, {}, {})) == str(svg.graph(upstream, {}, {}, None, svg.Shape()))
    assert "kind" not in str(svg.graph(upstream, {}, {}))


@pytest.mark.django_db
def test_the_workflow_and_run_pages_draw_kinds_and_datasets(client):
    sync_workflows()
    client.force_login(user("victor", access.VIEWERS))
    sales = Workflow.objects.get(name="regional_sales")
    page = html.unescape(client.get(reverse("orchestrator:web:workflow", args=[sales.name])).content.decode())
    assert "export_ready sensor: no run" in page and "summarize mapped: no run" in page
    assert "regional_sales_daily: dataset, produced" in page
    dashboard = Workflow.objects.get(name="sales_dashboard")
    page = html.unescape(client.get(reverse("orchestrator:web:workflow", args=[dashboard.name])).content.decode())
    assert "regional_sales_daily: dataset, starts this workflow" in page

    run, _ = create_run(sales, trigger="manual")
    page = html.unescape(client.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode())
    assert "export_ready sensor: " in page and "regional_sales_daily: dataset, produced" in page


def test_a_long_dataset_name_is_drawn_whole_squeezed_into_its_node():
    name = "s3://a-rather-long-bucket-name/with/a/deep/path/daily.parquet"
    shape = svg.shape_of({"tasks": {"t": {"upstream": [], "produces": [name]}}}, lineage.url)
    drawing = html.unescape(str(svg.graph({"t": []}, {}, {}, None, shape)))
    assert f'lengthAdjust="spacingAndGlyphs">{name}</text>' in drawing
