"""One broken workflow module never stops the others: every exception of a module's import (exit
and Ctrl-C included), an import that never ends, and every value the database cannot hold are
reported with the workflow, field and value, before anything is written."""

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from orchestrator.models import Schedule, Workflow
from orchestrator.sync import sync_workflows
from tests.conftest import ROOT, process_env

GOOD = '''
from orchestrator.dsl import Workflow

wf = Workflow("zz_good")

@wf.task
def a(ctx):
    return 1
'''

BAD = '''
from orchestrator.dsl import Workflow, Schedule, Param

wf = Workflow({args})

@wf.task
def a(ctx):
    return 1
'''


class Folder:
    def __init__(self, tmp_path):
        self.package = f"wfi_{uuid.uuid4().hex[:10]}"
        self.path = tmp_path / self.package
        self.path.mkdir()

    def write(self, module: str, source: str):
        (self.path / f"{module}.py").write_text(textwrap.dedent(source))

    def sync(self):
        return sync_workflows(self.path, self.package)


@pytest.fixture
def folder(tmp_path):
    made = Folder(tmp_path)
    made.write("zz_good", GOOD)  # imported after the bad module: it must still be stored
    return made


def assert_good_stored(report):
    assert report.created == ["zz_good"], report
    assert Workflow.objects.get(name="zz_good").current_version is not None


BAD_VALUES = [
    # (Workflow(...) arguments, the report key, what the message must name)
    ('"w_owner", owner="o" * 300', "w_owner", ["owner='ooo", "300 characters long; at most 200"]),
    ('"w_tenant", tenant="t" * 300', "w_tenant", ["tenant='ttt", "300 characters long; at most 200"]),
    ('"n" * 300', "n" * 300, ["name='nnn", "300 characters long; at most 200"]),
    ('"w_sched", schedules=[Schedule("0 * * * *", name="s" * 150)]', "w_sched",
     ["schedules[0].name='sss", "150 characters long; at most 100"]),
    ("None", "None", ["workflow None: name=None", "must be a string"]),
    ('"nul\\x00name"', "'nul\\x00name'", ["name='nul\\x00name'", "NUL"]),
    ('"w_desc", description="a\\x00b"', "w_desc", ["description='a\\x00b'", "NUL"]),
    ('"w_tag", tags=["ok", "t\\x00"]', "w_tag", ["tags[1]='t\\x00'", "NUL"]),
    ('"w_default", params={"x": Param(list, default=[float("nan")])}', "w_default",
     ["params.x.default=[nan]", "not a JSON number"]),
    ('"w_sparams", params={"x": Param(int, default=1)}, '
     'schedules=[Schedule("0 * * * *", params={"x": float("inf")})]', "w_sparams",
     ["schedules[0].params={'x': inf}", "not a JSON number"]),
    ('"w_sobj", schedules=[Schedule("0 * * * *", params={"x": object()})]', "w_sobj",
     ["schedules[0].params=", "JSON cannot hold"]),
    ('"sec/slash"', "sec/slash", ["name='sec/slash'", "cannot appear in a URL"]),
]


@pytest.mark.django_db
@pytest.mark.parametrize("args, key, expected", BAD_VALUES, ids=[
    "owner-300", "tenant-300", "name-300", "schedule-name-150", "name-None", "nul-in-name", "nul-in-description",
    "nul-in-tag", "nan-param-default", "inf-schedule-param", "object-schedule-param", "slash-in-name"])
def test_a_value_the_database_cannot_hold_is_reported_and_the_other_workflows_sync(folder, args, key, expected):
    folder.write("a_bad", BAD.format(args=args))
    report = folder.sync()
    assert_good_stored(report)
    assert list(report.broken) == [key], report.broken
    for text in expected:
        assert text in report.broken[key], report.broken[key]
    # A name the database or a URL cannot hold is never stored; another broken one is, marked.
    stored = set(Workflow.objects.values_list("name", flat=True))
    assert stored == ({"zz_good", key} if key.startswith("w_") else {"zz_good"})
    if key.startswith("w_"):
        row = Workflow.objects.get(name=key)
        assert row.broken and row.current_version is None and expected[0] in row.sync_error


@pytest.mark.django_db
@pytest.mark.parametrize("statement, error", [
    ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
    ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    ("raise GeneratorExit('odd')\n", "GeneratorExit: odd"),
    ("raise ValueError('bad \\x00 byte')\n", "ValueError: bad \\x00 byte"),
])
def test_any_exception_at_import_is_that_modules_error(folder, statement, error):
    folder.write("a_bad", statement)
    report = folder.sync()
    assert_good_stored(report)
    assert report.import_errors[f"{folder.package}.a_bad"].startswith(error), report.import_errors


STUCK = '''
import pathlib
import time

FLAG = pathlib.Path({flag!r})
deadline = time.monotonic() + 120  # the test releases it long before
while not FLAG.exists() and time.monotonic() < deadline:
    {body}

from orchestrator.dsl import Workflow

wf = Workflow("late")

@wf.task
def a(ctx):
    return 1
'''


@pytest.mark.django_db
@pytest.mark.parametrize("body", ["pass", "time.sleep(0.02)"], ids=["busy-loop", "sleeping"])
def test_an_import_that_does_not_end_is_stopped_at_the_limit_and_the_others_sync(folder, tmp_path, settings, body):
    settings.ORCHESTRATOR_SYNC_IMPORT_TIMEOUT = 2.0
    flag = tmp_path / "release"
    folder.write("a_stuck", STUCK.format(flag=str(flag), body=body))
    module = f"{folder.package}.a_stuck"
    report = folder.sync()
    assert_good_stored(report)
    assert "took longer than 2s" in report.import_errors[module], report.import_errors
    assert "ORCHESTRATOR_SYNC_IMPORT_TIMEOUT" in report.import_errors[module]
    # The import was stopped, not left running: once the module can end, the next sync imports it
    # afresh in a child of its own, and stores its workflow.
    flag.touch()
    recovered = folder.sync()
    assert recovered.created == ["late"] and not recovered.import_errors, recovered


@pytest.mark.django_db(transaction=True)
def test_sync_workflows_command_exits_with_a_module_stuck_at_import(tmp_path):
    folder = Folder(tmp_path)
    folder.write("zz_good", GOOD)
    folder.write("a_stuck", STUCK.format(flag=str(tmp_path / "never"), body="time.sleep(0.02)"))
    (folder.path / "__init__.py").write_text("")
    env = process_env(ORCHESTRATOR_WORKFLOWS_PACKAGE=folder.package, ORCHESTRATOR_SYNC_IMPORT_TIMEOUT="1",
                      PYTHONPATH=f"{tmp_path}:{ROOT}")
    done = subprocess.run([sys.executable, str(Path(ROOT) / "manage.py"), "sync_workflows"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert "created   zz_good" in done.stdout
    assert f"module {folder.package}.a_stuck failed to import: TimeoutError: importing" in done.stderr
    assert Workflow.objects.filter(name="zz_good", present=True).exists()


@pytest.mark.django_db
def test_a_schedule_without_a_required_param_is_refused_naming_the_schedule_and_the_param(folder):
    folder.write("a_bad", BAD.format(args='"w_req", params={"day": Param(str), "n": Param(int, default=1)}, '
                                          'schedules=[Schedule("0 * * * *", name="nightly", params={"n": 2})]'))
    report = folder.sync()
    assert_good_stored(report)
    message = report.broken["w_req"]
    assert "schedules[0].params.day=None" in message
    assert "schedule 'nightly' gives no value for the required param 'day'" in message
    assert not Schedule.objects.filter(workflow__name="w_req").exists()


@pytest.mark.django_db
def test_a_schedule_with_a_bad_param_value_is_refused_and_one_that_gives_them_all_syncs(folder):
    folder.write("a_bad", BAD.format(args='"w_val", params={"n": Param(int)}, '
                                          'schedules=[Schedule("0 * * * *", params={"n": "many"})]'))
    folder.write("b_ok", BAD.format(args='"w_ok", params={"n": Param(int)}, '
                                         'schedules=[Schedule("0 * * * *", params={"n": 3})]'))
    report = folder.sync()
    assert "schedules[0].params.n='many'" in report.broken["w_val"]
    assert "in the params of schedule 'default'" in report.broken["w_val"]
    assert sorted(report.created) == ["w_ok", "zz_good"]
    assert Schedule.objects.get(workflow__name="w_ok").params == {"n": 3}
