"""Sync of the workflow options beyond a fixed graph: mapping, branches, sensors, datasets and
data triggers, callbacks, deadline and run timeout. Each mistake names the workflow, the field
and the value; a graph that uses none of them keeps the hash it had before they existed."""

import pytest

from orchestrator.models import Workflow
from orchestrator.sync import graph_hash
from tests.test_sync import GOOD, Folder, broken_message

pytestmark = pytest.mark.django_db


@pytest.fixture
def folder(tmp_path):
    return Folder(tmp_path)

FEATURES = '''
from orchestrator.dsl import On, Param, Workflow

def alert(context):
    return context["event"]

wf = Workflow("{name}", triggers=[On("raw_orders")], on_failure=alert, on_retry=alert,
              deadline=3600, run_timeout=7200, params={{"n": Param(int, default=1)}})

@wf.task
def listing(ctx):
    return [1, 2, 3]

@wf.task(retries=1, on_success=alert)
def double(ctx):
    return ctx.item * 2

double.map(over=listing, max_parallel=2)

@wf.branch
def choose(ctx):
    return "small"

@wf.task
def small(ctx):
    return "small"

@wf.task
def large(ctx):
    return "large"

@wf.sensor(every=30, timeout=600)
def ready(ctx):
    return True

@wf.task(produces=["daily_totals"], trigger_rule="none_failed")
def total(ctx):
    ctx.metadata["daily_totals"] = {{"n": 1}}
    return sum(ctx.upstream["double"])

choose >> [small, large]
[ready, double, small, large] >> total
'''


def test_the_options_are_stored_in_the_graph_version(folder):
    folder.write("feat", FEATURES.format(name="feat"))
    report = folder.sync()
    assert report.ok, report
    spec = Workflow.objects.get(name="feat").current_version.spec
    tasks = spec["tasks"]
    assert tasks["double"]["map_over"] == "listing" and tasks["double"]["max_parallel"] == 2
    assert tasks["double"]["upstream"] == ["listing"]  # map(over=...) is also the edge
    assert tasks["listing"]["mapped_by"] == ["double"]
    assert tasks["choose"]["branch"] is True and tasks["choose"]["children"] == ["large", "small"]
    assert tasks["ready"]["sensor"] == {"every": 30, "timeout": 600}
    assert tasks["ready"]["timeout"] == 60  # one check that hangs is killed after poke_timeout
    assert tasks["total"]["produces"] == ["daily_totals"]
    ref = f"{folder.package}.feat:alert"
    # The workflow's on_retry applies to each task; on_success stays the task's own.
    assert tasks["double"]["callbacks"] == {"on_retry": [ref], "on_success": [ref]}
    assert tasks["listing"]["callbacks"] == {"on_retry": [ref]}
    assert spec["callbacks"] == {"on_failure": [ref], "on_retry": [ref]}
    assert spec["triggers"] == [{"datasets": ["raw_orders"], "mode": "any"}]
    assert (spec["deadline"], spec["run_timeout"]) == (3600, 7200)


def test_a_graph_without_the_new_options_keeps_its_hash(folder):
    folder.write("etl", GOOD.format(name="etl"))
    folder.sync()
    spec = Workflow.objects.get(name="etl").current_version.spec
    # The keys a plain graph had before mapping, branches, sensors and datasets existed: none added.
    assert set(spec) == {"name", "description", "tags", "owner", "tenant", "max_active_runs", "webhooks",
                         "params", "tasks"}
    assert set(spec["tasks"]["a"]) == {"kind", "max_attempts", "retry_delay", "retry_backoff", "retry_max_delay",
                                       "timeout", "queue", "priority", "trigger_rule", "upstream", "ref"}


def test_changing_a_mapping_option_makes_a_new_version(folder):
    folder.write("feat", FEATURES.format(name="feat"))
    folder.sync()
    first = Workflow.objects.get(name="feat").current_version
    folder.write("feat", FEATURES.format(name="feat").replace("max_parallel=2", "max_parallel=5"))
    report = folder.sync()
    second = Workflow.objects.get(name="feat").current_version
    assert report.new_versions == ["feat"] and second.number == first.number + 1
    assert first.hash == graph_hash(first.spec) and second.hash != first.hash


@pytest.mark.parametrize("change, field, expected", [
    ("max_parallel=2", "tasks.double.max_parallel=0", "at least 1"),
    ("every=30", "tasks.ready.every=-5", "positive number of seconds"),
    ("timeout=600)", "tasks.ready.timeout='soon'", "positive number of seconds"),
    ('produces=["daily_totals"]', "tasks.total.produces='bad name!'", "dataset name"),
    ('triggers=[On("raw_orders")]', "triggers[0].mode='some'", "must be one of any, all"),
    ("deadline=3600", "deadline=-1", "positive number"),
    ("run_timeout=7200", "run_timeout=0", "positive number"),
])
def test_a_bad_option_is_reported_with_its_field_and_value(folder, change, field, expected):
    bad = {
        "max_parallel=2": "max_parallel=0", "every=30": "every=-5", "timeout=600)": "timeout='soon')",
        'produces=["daily_totals"]': 'produces=["bad name!"]',
        'triggers=[On("raw_orders")]': 'triggers=[On("raw_orders", mode="some")]',
        "deadline=3600": "deadline=-1", "run_timeout=7200": "run_timeout=0",
    }[change]
    message = broken_message(folder, FEATURES.format(name="feat").replace(change, bad))
    assert "workflow 'feat'" in message and field in message and expected in message


def test_a_branch_without_children_and_a_callback_defined_in_a_function_are_reported(folder):
    source = FEATURES.format(name="feat").replace("choose >> [small, large]", "")
    source = source.replace("on_success=alert", "on_success=lambda context: None")
    message = broken_message(folder, source)
    assert "tasks.choose.branch='choose'" in message and "needs children" in message
    assert "tasks.double.on_success='<lambda>'" in message and "defined at module level" in message


def test_a_workflow_that_consumes_its_own_data_is_refused(folder):
    source = FEATURES.format(name="feat").replace('On("raw_orders")', 'On("daily_totals")')
    message = broken_message(folder, source)
    assert "triggers[0].datasets='daily_totals'" in message and "produces it" in message


def test_a_data_triggered_workflow_needs_a_default_for_each_param(folder):
    source = FEATURES.format(name="feat").replace("Param(int, default=1)", "Param(int)")
    message = broken_message(folder, source)
    assert "params.n='n'" in message and "data triggers needs a default" in message


def test_a_loop_of_data_triggers_across_workflows_is_refused_for_each_workflow_in_it(folder):
    folder.write("loop", '''
from orchestrator.dsl import On, Workflow

ping = Workflow("ping", triggers=[On("pong_data")])

@ping.task(produces=["ping_data"])
def send(ctx):
    return 1

pong = Workflow("pong", triggers=[On("ping_data")])

@pong.task(produces=["pong_data"])
def answer(ctx):
    return 2

other = Workflow("bystander", triggers=[On("ping_data")])

@other.task
def watch(ctx):
    return 3
''')
    report = folder.sync()
    assert set(report.broken) == {"ping", "pong"}
    assert "data triggers form a loop: ping -> ping_data -> pong -> pong_data -> ping" in report.broken["ping"]
    assert "bystander" in report.created


def test_a_dataset_in_two_triggers_and_mapping_over_a_branch_are_refused(folder):
    source = FEATURES.format(name="feat").replace('triggers=[On("raw_orders")]',
                                                  'triggers=[On("raw_orders"), On("raw_orders", "fx", mode="all")]')
    source = source.replace("double.map(over=listing, max_parallel=2)", "")
    source = source.replace("choose >> [small, large]", "choose >> [small, large]\ndouble.map(over=choose)")
    message = broken_message(folder, source)
    assert "triggers[1].datasets='raw_orders'" in message and "one trigger only" in message
    assert "tasks.double.map='choose'" in message and "cannot map over a branch" in message
