"""While a workflow module takes long to import, the console says which one, every few seconds, and
then that it was stopped at the limit: `sync_workflows` and `./dev run` (`up`) alike."""

import re
import signal
import subprocess
import sys
import uuid

import pytest

from orchestrator.models import Workflow
from tests.conftest import ROOT, process_env, wait_for
from tests.support.api_support import free_port

GOOD = "from orchestrator.dsl import Workflow\n\nwf = Workflow({name!r})\n\n@wf.task\ndef a(ctx):\n    return 1\n"
NEVER_ENDS = "import time\n\nwhile True:\n    time.sleep(0.1)\n"


def stuck_package(tmp_path, good: str) -> tuple[str, str]:
    """A package with a good module and one that never finishes importing: (package, stuck file)."""
    package = f"wfslow_{uuid.uuid4().hex[:10]}"
    folder = tmp_path / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "a_good.py").write_text(GOOD.format(name=good))
    (folder / "b_slow.py").write_text(NEVER_ENDS)
    return package, str(folder / "b_slow.py")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sync_workflows_names_the_slow_module_while_waiting_and_when_it_stops_it(tmp_path):
    good = f"quick_{uuid.uuid4().hex[:8]}"
    package, slow_file = stuck_package(tmp_path, good)
    env = process_env(ORCHESTRATOR_WORKFLOWS_PACKAGE=package, ORCHESTRATOR_SYNC_IMPORT_TIMEOUT="7",
                      PYTHONPATH=f"{tmp_path}:{ROOT}")
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "sync_workflows"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    # Every 5 s while it waits (at 5 s only, as the limit is 7 s), then once when it stopped it.
    still = [line for line in lines if line.startswith("still importing")]
    assert still == [f"still importing {slow_file} (5 s)"], done.stderr
    stopped = lines.index(f"stopped importing {slow_file} at the 7 s limit (ORCHESTRATOR_SYNC_IMPORT_TIMEOUT); "
                          "the other modules go on")
    assert lines.index(still[0]) < stopped < lines.index(
        f"module {package}.b_slow failed to import: TimeoutError: importing {package}.b_slow took longer than 7s "
        "(ORCHESTRATOR_SYNC_IMPORT_TIMEOUT); sync stopped it and went on"), done.stderr
    assert f"created   {good}" in done.stdout
    assert Workflow.objects.filter(name=good, present=True).exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_up_says_which_module_is_slow_before_it_is_ready(processes, tmp_path):
    good = f"quick_{uuid.uuid4().hex[:8]}"
    package, slow_file = stuck_package(tmp_path, good)
    env = process_env(ORCHESTRATOR_WORKFLOWS_PACKAGE=package, ORCHESTRATOR_SYNC_IMPORT_TIMEOUT="6",
                      ORCHESTRATOR_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=f"{tmp_path}:{ROOT}")
    up = processes.start("up", "--port", str(free_port()), env=env)
    wait_for(lambda: "Ready in" in processes.output(up) or up.poll() is not None, timeout=180,
             message="up to say it is ready")
    output = processes.output(up)
    still = output.index(f"[up] workflows: still importing {slow_file} (5 s)")
    stopped = output.index(f"[up] workflows: stopped importing {slow_file} at the 6 s limit")
    assert still < stopped < output.index("workflows: 1 synced, 0 broken") < output.index("Ready in"), output
    assert re.search(rf"module {package}\.b_slow failed to import: TimeoutError", output), output
    processes.send(up, signal.SIGINT)
    assert up.wait(timeout=90) == 0, processes.output(up)
