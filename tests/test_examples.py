"""The example workflows in workflows/ that show the dynamic features: a sensor, a map over a
list known at run time, and a dataset that starts another workflow."""

from datetime import UTC, datetime

import pytest

from orchestrator.models import Run, TaskRun, Workflow
from orchestrator.runs import trigger_workflow
from orchestrator.sync import sync_workflows
from tests.support.features_support import run_to_end, scheduler_tick, worker_loop
from workflows import regional_sales

pytestmark = pytest.mark.django_db

DAY = datetime(2026, 3, 1, 7, 0, tzinfo=UTC)


def test_regional_sales_waits_for_the_export_then_maps_one_instance_per_region(tmp_path):
    (tmp_path / "2026-03-01.done").touch()
    result = regional_sales.sales.test(params={"inbox": str(tmp_path), "regions": ["north", "south", "east"]},
                                       logical_date=DAY)
    assert result.state == "succeeded"
    assert result["export_ready"].result == {"ready": str(tmp_path / "2026-03-01.done")}
    assert [i.result["region"] for i in result["summarize"].instances] == ["north", "south", "east"]
    publish = result["publish"].result
    assert publish["regions"] == 3 and publish["day"] == "2026-03-01"
    assert publish["total"] == round(sum(i.result["total"] for i in result["summarize"].instances), 2)


def test_a_regional_sales_run_starts_one_sales_dashboard_run_with_the_days_event(clock):
    assert sync_workflows().ok
    workflows = {wf.name: wf for wf in Workflow.objects.select_related("current_version")}
    run, _ = trigger_workflow(workflows["regional_sales"], {}, logical_date=DAY, now=clock.now())
    run = run_to_end(run, clock, worker_loop())
    assert run.state == "succeeded"
    assert TaskRun.objects.filter(run=run, task="summarize", map_index__gte=0).count() == 3
    scheduler_tick(clock)
    [dashboard] = Run.objects.filter(workflow=workflows["sales_dashboard"])
    assert dashboard.trigger == "dataset" and dashboard.logical_date == DAY
    dashboard = run_to_end(dashboard, clock, worker_loop())
    assert dashboard.state == "succeeded"
    assert TaskRun.objects.get(run=dashboard, task="refresh").result == {"refreshed": ["2026-03-01"]}
    # Another tick starts nothing more for the same event.
    scheduler_tick(clock)
    assert Run.objects.filter(workflow=workflows["sales_dashboard"]).count() == 1
