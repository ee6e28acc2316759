"""Nightly sales ETL: extract the day's orders, transform them per region in parallel, load the
totals and publish a report. Fans out after ``extract`` and fans in at ``load``.

Runs at 02:30 Berlin time. Task functions receive a TaskContext: the run's params, the
logical date (the fire time), the attempt number, and their parents' results.
"""

import logging
import random

from orchestrator.dsl import Param, Schedule, Workflow

log = logging.getLogger(__name__)

REGIONS = ("emea", "americas", "apac")

etl = Workflow(
    "nightly_etl",
    description=__doc__,
    schedules=[Schedule("30 2 * * *", timezone="Europe/Berlin", catchup="latest", overlap="forbid")],
    params={
        "orders": Param(int, default=500, description="How many orders to simulate per region."),
        "currency": Param(str, default="EUR", choices=["EUR", "USD"]),
        "dry_run": Param(bool, default=False, description="Compute the report without publishing it."),
    },
    tags=["etl", "sales"],
    owner="data-team@example.com",
    tenant="analytics",
    max_active_runs=2,
)


@etl.task(retries=3, retry_delay=5, timeout=300)
def extract(ctx):
    """Pull the day's orders (simulated, deterministic per logical date)."""
    rng = random.Random(ctx.logical_date.date().toordinal())
    count = ctx.params["orders"]
    orders = {region: [round(rng.uniform(5, 500), 2) for _ in range(count)] for region in REGIONS}
    log.info("extracted %d orders for %s", count * len(REGIONS), ctx.logical_date.date())
    return {"day": ctx.logical_date.date().isoformat(), "orders": orders}


def _transform(ctx, region):
    amounts = ctx.upstream["extract"]["orders"][region]
    total = round(sum(amounts), 2)
    log.info("%s: %d orders, total %.2f %s", region, len(amounts), total, ctx.params["currency"])
    return {"region": region, "orders": len(amounts), "total": total}


@etl.task(retries=2, timeout=120)
def transform_emea(ctx):
    return _transform(ctx, "emea")


@etl.task(retries=2, timeout=120)
def transform_americas(ctx):
    return _transform(ctx, "americas")


@etl.task(retries=2, timeout=120)
def transform_apac(ctx):
    return _transform(ctx, "apac")


@etl.task(retries=3, retry_delay=10, timeout=300)
def load(ctx):
    """Combine the regional totals (the fan-in)."""
    parts = [ctx.upstream[f"transform_{region}"] for region in REGIONS]
    # ctx.upstream holds the direct parents only (the transforms), not extract.
    return {"day": ctx.logical_date.date().isoformat(), "total": round(sum(p["total"] for p in parts), 2),
            "orders": sum(p["orders"] for p in parts)}


@etl.task(trigger_rule="all_success")
def publish_report(ctx):
    summary = ctx.upstream["load"]
    if ctx.params["dry_run"]:
        log.info("dry run: not publishing %s", summary)
        return {"published": False, **summary}
    print(f"Sales {summary['day']}: {summary['orders']} orders, {summary['total']} {ctx.params['currency']}")
    return {"published": True, **summary}


extract >> [transform_emea, transform_americas, transform_apac] >> load >> publish_report
