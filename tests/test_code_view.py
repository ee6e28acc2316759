"""A workflow's code, read-only: the module's text escaped with line numbers, read from its file
and never imported; what is shown is said (the file as it is now, its digest, the graph version a
run used), and a module name that is not a plain dotted name reads nothing."""

from __future__ import annotations

import hashlib
import html
import re
import sys

import pytest
from django.urls import reverse

from orchestrator import access
from orchestrator.models import Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows
from orchestrator.web import code
from tests.conftest import ROOT
from tests.test_grid import user

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client):
    sync_workflows()
    client.force_login(user("victor", access.VIEWERS))
    return client


def test_the_code_page_shows_the_module_text_escaped_with_what_it_is(viewer):
    wf = Workflow.objects.get(name="regional_sales")
    path = ROOT / "workflows" / "regional_sales.py"
    response = viewer.get(reverse("orchestrator:web:workflow_code", args=[wf.name]))
    assert response.status_code == 200
    raw = response.content.decode()
    page = html.unescape(raw)
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        assert f'<tr id="L{number}"><td class="ln">{number}</td><td><pre>{line}</pre></td></tr>' in page
    # Markup in the source is text: "<date>.done" in a description is escaped.
    assert "&lt;date&gt;.done" in raw and "<date>.done" not in raw
    assert hashlib.sha256(path.read_bytes()).hexdigest() in page
    assert "the code of earlier versions is not kept" in page
    # Linked from the workflow page.
    assert 'id="workflow-code"' in viewer.get(reverse("orchestrator:web:workflow", args=[wf.name])).content.decode()


def test_a_run_names_the_graph_version_it_used(viewer):
    wf = Workflow.objects.get(name="regional_sales")
    run, _ = create_run(wf, trigger="manual")
    page = re.sub(r"<[^>]+>", "", html.unescape(
        viewer.get(reverse("orchestrator:web:workflow_code", args=[wf.name]) + f"?run={run.pk}").content.decode()))
    assert f"Run #{run.pk} used graph version {wf.current_version.number}, the current one." in page
    run_page = viewer.get(reverse("orchestrator:web:run", args=[run.pk])).content.decode()
    assert f'/code/?run={run.pk}"' in run_page
    other = Workflow.objects.get(name="nightly_etl")
    response = viewer.get(reverse("orchestrator:web:workflow_code", args=[other.name]) + f"?run={run.pk}")
    assert response.status_code == 400 and "not a run of nightly_etl" in html.unescape(response.content.decode())


def test_the_file_is_read_not_imported_and_odd_module_names_read_nothing(viewer, monkeypatch):
    wf = Workflow.objects.get(name="regional_sales")
    monkeypatch.delitem(sys.modules, "workflows.regional_sales", raising=False)
    assert code.module_file("workflows.regional_sales") == ROOT / "workflows" / "regional_sales.py"
    assert "workflows.regional_sales" not in sys.modules  # found as a file, not imported
    for bad in ["../etc/passwd", "workflows/../../x", "os.path;rm", "", "a..b"]:
        assert code.module_file(bad) is None
    Workflow.objects.filter(pk=wf.pk).update(module="../../etc/passwd")
    response = viewer.get(reverse("orchestrator:web:workflow_code", args=[wf.name]))
    assert response.status_code == 200 and 'id="no-source"' in response.content.decode()
