"""A small fan-out/fan-in workflow with params, fast enough for browser tests."""

from orchestrator.dsl import Param, Schedule, Workflow

report = Workflow(
    "sales_report",
    description="Counts orders per region in parallel and publishes a summary.",
    schedules=[Schedule("15 6 * * 1-5", timezone="Europe/Berlin")],
    params={
        "orders": Param(int, default=100, description="Orders per region."),
        "currency": Param(str, default="EUR", choices=["EUR", "USD"]),
        "dry_run": Param(bool, default=False),
    },
    tags=["sales"],
    owner="data-team@example.com",
)


@report.task
def extract(ctx):
    print(f"extracting {ctx.params['orders']} orders per region")
    return {"orders": ctx.params["orders"]}


def _count(ctx, region):
    count = ctx.upstream["extract"]["orders"]
    print(f"{region}: {count} orders")
    return {"region": region, "orders": count}


@report.task
def count_emea(ctx):
    return _count(ctx, "emea")


@report.task
def count_apac(ctx):
    return _count(ctx, "apac")


@report.task
def count_americas(ctx):
    return _count(ctx, "americas")


@report.task
def publish(ctx):
    total = sum(part["orders"] for part in ctx.upstream.values())
    print(f"Sales report: {total} orders in {ctx.params['currency']}")
    return {"total": total}


extract >> [count_emea, count_apac, count_americas] >> publish
