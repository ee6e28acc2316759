"""Each workflow module is imported in a child process of its own: one that spins the CPU or never
ends is stopped at its own budget while the others sync at once; what comes back is data; a
second module claiming a stored workflow's name never takes it over."""

import importlib
import os
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from orchestrator.discovery import discover_all
from orchestrator.models import Workflow
from orchestrator.sync import graph_hash, sync_workflows

pytestmark = pytest.mark.django_db


def workflow(name: str, tasks: str = "a") -> str:
    body = "".join(f"\n@wf.task\ndef {task}(ctx):\n    return {task!r}\n" for task in tasks.split())
    return f"from orchestrator.dsl import Workflow\n\nwf = Workflow({name!r})\n{body}"


class Folder:
    def __init__(self, tmp_path: Path):
        self.package = f"wfc_{uuid.uuid4().hex[:10]}"
        self.path = tmp_path / self.package
        self.path.mkdir()

    def write(self, module: str, source: str) -> str:
        (self.path / f"{module}.py").write_text(textwrap.dedent(source))
        return f"{self.package}.{module}"

    def file(self, module: str) -> str:
        """How sync names the module's file: from the current folder when under it."""
        path = str(self.path / f"{module}.py")
        relative = os.path.relpath(path)
        return path if relative.startswith("..") else relative

    def sync(self):
        return sync_workflows(self.path, self.package)


@pytest.fixture
def folder(tmp_path):
    return Folder(tmp_path)


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie no one reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


SPIN = '''
import os, pathlib
pathlib.Path({pidfile!r}).write_text(str(os.getpid()))
while True:
    pass
'''

NEVER_ENDS = '''
import os, pathlib, subprocess, time
helper = subprocess.Popen(["sleep", "600"])  # started by the module: stopped with it
pathlib.Path({pidfile!r}).write_text(f"{{os.getpid()}} {{helper.pid}}")
while True:
    time.sleep(1)
'''


def test_a_spinning_and_a_never_ending_module_are_stopped_at_their_own_budget_and_the_others_sync(
        folder, tmp_path, settings):
    settings.ORCHESTRATOR_SYNC_IMPORT_TIMEOUT = 2.0
    spin = folder.write("a_spin", SPIN.format(pidfile=str(tmp_path / "spin.pid")))
    stuck = folder.write("b_never", NEVER_ENDS.format(pidfile=str(tmp_path / "never.pid")))
    good = [folder.write(f"c_good{index}", workflow(f"good{index}")) for index in range(4)]
    report = folder.sync()
    assert sorted(report.created) == [f"good{index}" for index in range(4)], report
    for module in (spin, stuck):
        assert report.import_errors[module].startswith(f"TimeoutError: importing {module} took longer than 2s")
    seconds = report.import_seconds
    # Each good module's child ended well within the budget though the stuck ones were importing
    # beside it (a spin in the same process would have held them); each stuck child was stopped
    # at its own budget, not one after the other (two budgets).
    assert all(seconds[module] < 2.0 for module in good), seconds
    assert all(2.0 <= seconds[module] < 4.0 for module in (spin, stuck)), seconds
    # Stopped, with what the module started: nothing of either import runs on.
    pids = [int(pid) for name in ("spin.pid", "never.pid") for pid in (tmp_path / name).read_text().split()]
    assert len(pids) == 3 and not any(alive(pid) for pid in pids), pids


def test_a_module_that_ends_its_own_process_is_that_modules_error(folder):
    ended = folder.write("a_exit", "import os\nos._exit(3)\n")
    crashed = folder.write("b_crash", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    folder.write("c_good", workflow("fine"))
    report = folder.sync()
    assert report.created == ["fine"]
    assert report.import_errors[ended] == f"importing {ended} ended its process (exit code 3) before it reported anything"
    assert "(killed by SIGKILL)" in report.import_errors[crashed], report.import_errors


def test_the_syncing_process_never_imports_a_workflow_module_and_gets_the_same_graph(folder):
    module = folder.write("a_flow", workflow("same", "extract load"))
    found = discover_all(folder.path, folder.package)
    assert module not in sys.modules  # imported in the child only
    [definition] = found.found[module]
    assert found.files[module] == folder.file("a_flow")
    # The child sent data: the graph is the one an import here gives, to the hash.
    here = importlib.import_module(module)
    try:
        assert definition.spec == here.wf.to_spec()
        assert graph_hash(definition.spec) == graph_hash(here.wf.to_spec())
    finally:
        del sys.modules[module]


def test_a_module_may_query_the_database_in_its_child_and_this_process_keeps_its_connection(folder):
    folder.write("a_query", "from django.db import connection\n"
                            "with connection.cursor() as c:\n    c.execute('SELECT 1')\n" + workflow("queried"))
    Workflow.objects.create(name="made_here", module="elsewhere")  # in this test's transaction
    report = folder.sync()
    assert report.created == ["queried"] and not report.import_errors, report
    assert Workflow.objects.filter(name="made_here").exists()  # the transaction is still this process's


@pytest.mark.parametrize("owner, newcomer", [("z_owner", "a_newcomer"), ("a_owner", "z_newcomer")],
                         ids=["newcomer-first-by-path", "newcomer-last-by-path"])
def test_a_second_module_claiming_a_stored_workflow_is_reported_and_the_stored_one_keeps_working(
        folder, owner, newcomer):
    owner_module = folder.write(owner, workflow("shared", "a"))
    assert folder.sync().created == ["shared"]
    version = Workflow.objects.get(name="shared").current_version_id
    folder.write(newcomer, workflow("shared", "b c"))
    report = folder.sync()
    row = Workflow.objects.get(name="shared")
    assert (row.module, row.broken, row.present, row.current_version_id) == (owner_module, False, True, version)
    assert report.unchanged == ["shared"]
    message = report.broken[f"shared ({folder.file(newcomer)})"]
    assert message == (f"workflow 'shared' is defined in {folder.file(newcomer)} and in {folder.file(owner)}: "
                       f"{folder.file(owner)} keeps it (the module it was stored from); the definition in "
                       f"{folder.file(newcomer)} is ignored: rename one of them")
    assert list(report.broken) == [f"shared ({folder.file(newcomer)})"]


@pytest.mark.parametrize("written", [("b_one", "a_two"), ("a_two", "b_one")], ids=["a-written-last", "a-written-first"])
def test_when_neither_was_stored_the_first_by_path_keeps_the_name_and_says_so(folder, written):
    for module in written:
        folder.write(module, workflow("both", "x" if module == "a_two" else "y"))
    report = folder.sync()
    assert report.created == ["both"]
    row = Workflow.objects.get(name="both")
    assert row.module == f"{folder.package}.a_two" and list(row.current_version.spec["tasks"]) == ["x"]
    message = report.broken[f"both ({folder.file('b_one')})"]
    assert f"{folder.file('a_two')} keeps it (the first by path: neither was stored before)" in message
    assert f"the definition in {folder.file('b_one')} is ignored" in message


def test_a_stored_workflow_whose_module_fails_to_import_stays_its_modules(folder):
    owner = folder.write("z_owner", workflow("kept"))
    folder.sync()
    folder.write("z_owner", "raise RuntimeError('half-edited')\n")
    folder.write("a_newcomer", workflow("kept", "other"))
    report = folder.sync()
    row = Workflow.objects.get(name="kept")
    assert row.module == owner and row.broken and "half-edited" in row.sync_error
    assert "the module it was stored from, which failed to import now" in \
        report.broken[f"kept ({folder.file('a_newcomer')})"]


def test_one_module_defining_a_name_twice_keeps_the_first(folder):
    folder.write("a_twice", workflow("twice", "first") + "\nwf2 = Workflow('twice')\n\n@wf2.task\ndef second(ctx):\n"
                                                         "    return 2\n")
    report = folder.sync()
    assert report.created == ["twice"]
    assert list(Workflow.objects.get(name="twice").current_version.spec["tasks"]) == ["first"]
    assert "is defined again in" in report.broken[f"twice ({folder.file('a_twice')})"]
