"""Workflow discovery the Django way: every installed app's ``workflows`` module (or package) is
imported, as the admin imports ``admin.py``, plus the package and modules the settings name."""

import sys
import textwrap
import uuid

import pytest
from django.test.utils import override_settings

from orchestrator.models import Workflow
from orchestrator.sync import discover, sync_workflows

pytestmark = pytest.mark.django_db


def workflow_source(name: str) -> str:
    return textwrap.dedent(f"""
        from orchestrator.dsl import Workflow

        wf = Workflow({name!r})

        @wf.task
        def only():
            return {name!r}
    """)


@pytest.fixture
def code(tmp_path, monkeypatch):
    """Writes packages under a folder on the import path; names are unique per test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    suffix = uuid.uuid4().hex[:8]
    written = []

    def write(relative: str, text: str = "") -> str:
        relative = relative.replace("SUFFIX", suffix)
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(relative.split("/")[0])
        return relative

    write.suffix = suffix
    yield write
    for name in [name for name in sys.modules if any(name.split(".")[0] == top for top in written)]:
        del sys.modules[name]


def test_the_workflows_module_of_every_installed_app_is_discovered(settings, code):
    s = code.suffix
    code("shop_SUFFIX/__init__.py")
    code("shop_SUFFIX/workflows.py", workflow_source(f"orders_{s}"))
    code("billing_SUFFIX/__init__.py")
    code("billing_SUFFIX/workflows/__init__.py")
    code("billing_SUFFIX/workflows/invoices.py", workflow_source(f"invoices_{s}"))
    code("billing_SUFFIX/workflows/_helpers.py", "raise RuntimeError('a private module is never imported')")
    code("nothing_here_SUFFIX/__init__.py")  # an app without workflows
    apps = [*settings.INSTALLED_APPS, f"shop_{s}", f"billing_{s}", f"nothing_here_{s}"]
    with override_settings(INSTALLED_APPS=apps, ORCHESTRATOR_WORKFLOWS_PACKAGE=""):
        found, failed = discover()
    assert failed == {}
    names = {module: [wf.name for wf in workflows] for module, workflows in found.items()}
    assert names[f"shop_{s}.workflows"] == [f"orders_{s}"]
    assert names[f"billing_{s}.workflows.invoices"] == [f"invoices_{s}"]
    assert f"billing_{s}.workflows._helpers" not in names
    assert not any(module.startswith(f"nothing_here_{s}") for module in names)


def test_the_package_and_modules_named_in_the_settings_are_discovered_too(code):
    s = code.suffix
    code("flows_SUFFIX/__init__.py")
    code("flows_SUFFIX/nightly.py", workflow_source(f"nightly_{s}"))
    code("flows_SUFFIX/hourly.py", workflow_source(f"hourly_{s}"))
    code("extra_SUFFIX.py", workflow_source(f"extra_{s}"))
    with override_settings(ORCHESTRATOR_WORKFLOWS_PACKAGE=f"flows_{s}", ORCHESTRATOR_WORKFLOW_MODULES=[f"extra_{s}"]):
        report = sync_workflows()
    assert {f"nightly_{s}", f"hourly_{s}", f"extra_{s}"} <= set(report.created)
    assert Workflow.objects.get(name=f"extra_{s}").module == f"extra_{s}"
    assert Workflow.objects.get(name=f"nightly_{s}").module == f"flows_{s}.nightly"


def test_a_package_that_imports_its_own_modules_defines_each_workflow_once(settings, code):
    s = code.suffix
    code("reports_SUFFIX/__init__.py")
    code("reports_SUFFIX/workflows/__init__.py", "from . import daily  # noqa\n")
    code("reports_SUFFIX/workflows/daily.py", workflow_source(f"daily_{s}"))
    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, f"reports_{s}"], ORCHESTRATOR_WORKFLOWS_PACKAGE=""):
        report = sync_workflows()
    assert report.broken == {} and f"daily_{s}" in report.created
    assert Workflow.objects.get(name=f"daily_{s}").module == f"reports_{s}.workflows.daily"


def test_a_module_that_fails_to_import_is_reported_and_the_others_still_sync(code):
    s = code.suffix
    code("broken_SUFFIX.py", "import no_such_module_anywhere\n")
    code("fine_SUFFIX.py", workflow_source(f"fine_{s}"))
    with override_settings(ORCHESTRATOR_WORKFLOWS_PACKAGE="",
                           ORCHESTRATOR_WORKFLOW_MODULES=[f"broken_{s}", f"fine_{s}", f"missing_{s}"]):
        report = sync_workflows()
    assert f"fine_{s}" in report.created
    assert "no_such_module_anywhere" in report.import_errors[f"broken_{s}"]
    assert "ModuleNotFoundError" in report.import_errors[f"missing_{s}"]


def test_the_standalone_projects_example_workflows_come_from_its_workflows_package():
    # The repository's workflows/ folder is the standalone project's, named by its settings; it
    # is not an app and not part of the installed package.
    found, failed = discover()
    assert failed == {}
    assert {"workflows.nightly_etl", "workflows.maintenance"} <= set(found)
