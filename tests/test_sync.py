"""Discovery and sync of workflow modules: validation messages, idempotence, versions."""

import textwrap
import uuid

import pytest

from orchestrator.models import Schedule, Workflow
from orchestrator.runs import create_run
from orchestrator.sync import sync_workflows

pytestmark = pytest.mark.django_db

GOOD = '''
from orchestrator.dsl import Workflow, Schedule, Param

wf = Workflow("{name}", schedules=[Schedule("30 2 * * *", timezone="Europe/Berlin")],
              params={{"n": Param(int, default=1)}})

@wf.task(retries=2)
def a(ctx):
    return 1

@wf.task
def b(ctx):
    return 2

@wf.task
def c(ctx):
    return 3

a >> [b, c]
'''


class Folder:
    """A throwaway workflows package, so each test imports its own modules."""

    def __init__(self, tmp_path):
        self.package = f"wf_{uuid.uuid4().hex[:10]}"
        self.path = tmp_path / self.package
        self.path.mkdir()

    def write(self, module: str, source: str):
        (self.path / f"{module}.py").write_text(textwrap.dedent(source))

    def sync(self):
        return sync_workflows(self.path, self.package)


@pytest.fixture
def folder(tmp_path):
    return Folder(tmp_path)


def broken_message(folder, source):
    folder.write("mod", source)
    report = folder.sync()
    assert len(report.broken) == 1, report
    return next(iter(report.broken.values()))


def test_sync_stores_a_workflow_with_its_graph_and_schedule(folder):
    folder.write("etl", GOOD.format(name="etl"))
    report = folder.sync()
    assert report.created == ["etl"] and report.ok
    wf = Workflow.objects.get(name="etl")
    tasks = wf.current_version.spec["tasks"]
    assert tasks["b"]["upstream"] == ["a"] and tasks["a"]["max_attempts"] == 3
    assert tasks["a"]["ref"] == f"{folder.package}.etl:a"
    schedule = wf.schedules.get()
    assert (schedule.source, schedule.cron, schedule.timezone) == ("code", "30 2 * * *", "Europe/Berlin")
    assert schedule.next_fire_at is not None


def test_syncing_twice_changes_nothing(folder):
    folder.write("etl", GOOD.format(name="etl"))
    folder.sync()
    wf = Workflow.objects.get(name="etl")
    before = (wf.current_version_id, wf.versions.count(), list(Schedule.objects.values()))
    report = folder.sync()
    wf.refresh_from_db()
    assert report.unchanged == ["etl"] and not report.new_versions
    assert (wf.current_version_id, wf.versions.count(), list(Schedule.objects.values())) == before


def test_a_changed_graph_makes_a_new_version_and_old_runs_keep_theirs(folder):
    folder.write("etl", GOOD.format(name="etl"))
    folder.sync()
    wf = Workflow.objects.get(name="etl")
    old_run, _ = create_run(wf, trigger="manual")
    folder.write("etl", GOOD.format(name="etl").replace("a >> [b, c]", "a >> b >> c"))
    report = folder.sync()
    wf.refresh_from_db()
    old_run.refresh_from_db()
    assert report.new_versions == ["etl"]
    assert wf.versions.count() == 2 and wf.current_version.number == 2
    assert old_run.version.number == 1
    assert old_run.version.spec["tasks"]["c"]["upstream"] == ["a"]
    assert wf.current_version.spec["tasks"]["c"]["upstream"] == ["b"]


def test_a_cycle_is_reported_with_the_tasks_in_it(folder):
    message = broken_message(folder, GOOD.format(name="cyc") + "\nc >> a\n")
    assert "workflow 'cyc'" in message and "cycle" in message
    assert "a -> c -> a" in message or "c -> a -> c" in message


def test_a_dependency_on_an_unknown_task_is_reported(folder):
    source = GOOD.format(name="unk").replace("@wf.task\ndef c", '@wf.task(upstream=["ghost"])\ndef c')
    message = broken_message(folder, source)
    assert "workflow 'unk'" in message and "tasks.c.upstream='ghost'" in message and "unknown task" in message


def test_a_duplicate_task_name_is_reported(folder):
    source = GOOD.format(name="dup") + '\nwf.shell("a", "echo again")\n'
    message = broken_message(folder, source)
    assert "tasks.a='a'" in message and "duplicate task name" in message


def test_an_invalid_cron_is_reported_with_its_value(folder):
    message = broken_message(folder, GOOD.format(name="badcron").replace("30 2 * * *", "61 2 * * *"))
    assert "workflow 'badcron'" in message and "schedules[0].cron='61 2 * * *'" in message


def test_an_unknown_timezone_is_reported_with_its_value(folder):
    message = broken_message(folder, GOOD.format(name="badtz").replace("Europe/Berlin", "Mars/Olympus"))
    assert "schedules[0].timezone='Mars/Olympus'" in message and "unknown timezone" in message


@pytest.mark.parametrize("option, field, expected", [
    ("retries=-1", "tasks.a.retries=-1", "whole number"),
    ("timeout=0", "tasks.a.timeout=0", "positive number"),
    ("trigger_rule='sometimes'", "tasks.a.trigger_rule='sometimes'", "must be one of all_success"),
    ("queue='bad queue'", "tasks.a.queue='bad queue'", "letters, digits"),
    ("priority=1000", "tasks.a.priority=1000", "-100 to 100"),
])
def test_a_bad_task_option_is_reported(folder, option, field, expected):
    message = broken_message(folder, GOOD.format(name="opt").replace("retries=2", option))
    assert field in message and expected in message


def test_a_bad_param_default_is_reported(folder):
    message = broken_message(folder, GOOD.format(name="param").replace("Param(int, default=1)", 'Param(int, default="x")'))
    assert "params.n.default='x'" in message and "expected an integer" in message


def test_a_module_that_fails_to_import_does_not_stop_the_others(folder):
    folder.write("good", GOOD.format(name="good"))
    folder.write("bad", "import nowhere_to_be_found\n")
    report = folder.sync()
    assert report.created == ["good"]
    assert "ModuleNotFoundError" in report.import_errors[f"{folder.package}.bad"]


def test_a_workflow_broken_after_being_valid_keeps_its_last_good_version(folder):
    folder.write("etl", GOOD.format(name="etl"))
    folder.sync()
    good_version = Workflow.objects.get(name="etl").current_version_id
    folder.write("etl", GOOD.format(name="etl") + "\nc >> a\n")
    report = folder.sync()
    wf = Workflow.objects.get(name="etl")
    assert "etl" in report.broken
    assert wf.broken and "cycle" in wf.sync_error and wf.current_version_id == good_version
    # Fixed again: no longer broken, and the old version is reused rather than duplicated.
    folder.write("etl", GOOD.format(name="etl"))
    folder.sync()
    wf.refresh_from_db()
    assert not wf.broken and wf.sync_error == "" and wf.current_version_id == good_version


def test_a_module_that_stops_importing_marks_its_workflows_broken_not_deleted(folder):
    folder.write("etl", GOOD.format(name="etl"))
    folder.sync()
    folder.write("etl", "raise RuntimeError('boom')\n")
    report = folder.sync()
    wf = Workflow.objects.get(name="etl")
    assert wf.broken and "RuntimeError: boom" in wf.sync_error and wf.current_version is not None
    assert "etl" in report.broken


def test_admin_schedules_survive_sync_and_code_schedules_follow_the_code(folder):
    folder.write("etl", GOOD.format(name="etl"))
    folder.sync()
    wf = Workflow.objects.get(name="etl")
    Schedule.objects.create(workflow=wf, name="ops-extra", source="admin", cron="0 6 * * *")
    folder.write("etl", GOOD.format(name="etl").replace("30 2 * * *", "45 3 * * *"))
    folder.sync()
    assert set(wf.schedules.values_list("name", "source", "cron")) == {
        ("default", "code", "45 3 * * *"), ("ops-extra", "admin", "0 6 * * *")}


def test_the_example_workflows_sync_cleanly():
    report = sync_workflows()
    assert report.ok, (report.broken, report.import_errors)
    assert {"nightly_etl", "maintenance"} <= set(report.created + report.new_versions + report.unchanged)
    etl = Workflow.objects.get(name="nightly_etl")
    assert etl.schedules.get().timezone == "Europe/Berlin"
    assert etl.current_version.spec["tasks"]["load"]["upstream"] == [
        "transform_americas", "transform_apac", "transform_emea"]
    assert Workflow.objects.get(name="maintenance").current_version.spec["tasks"]["disk_report"]["kind"] == "shell"
