"""Regional sales, an example of the dynamic features: a sensor waits for the day's export
without holding a worker, one task run per region is created from a list known only at run time
(mapping), and the summary it produces starts another workflow (a data trigger).

``regional_sales`` runs at 07:00 UTC; ``sales_dashboard`` has no schedule: each successful
``publish`` of ``regional_sales`` produces the dataset ``regional_sales_daily``, and that starts
exactly one ``sales_dashboard`` run, with the event in ``ctx.events``.
"""

import logging
import random
from pathlib import Path

from orchestrator.dsl import On, Param, Schedule, Workflow

log = logging.getLogger(__name__)

sales = Workflow(
    "regional_sales",
    description=__doc__,
    schedules=[Schedule("0 7 * * *", timezone="UTC", catchup="latest", overlap="forbid")],
    params={
        "inbox": Param(str, default="", description="A folder where the export drops <date>.done; empty: no "
                                                     "wait (the simulated export is always ready)."),
        "regions": Param(list, default=["emea", "americas", "apac"], description="The regions to summarize."),
    },
    tags=["sales", "example"],
    owner="data-team@example.com",
    deadline=3 * 3600,  # a run not finished three hours after 07:00 shows as late on the dashboard
)


@sales.sensor(every=60, timeout=6 * 3600)
def export_ready(ctx):
    """Checked once a minute; between checks the task run waits as a row, not in a worker."""
    inbox = ctx.params["inbox"]
    if not inbox:
        return {"ready": "simulated"}
    marker = Path(inbox) / f"{ctx.logical_date.date().isoformat()}.done"
    return {"ready": str(marker)} if marker.exists() else False


@sales.task
def regions(ctx):
    """The list to map over: one instance of ``summarize`` per item."""
    return list(ctx.params["regions"])


@sales.task(retries=2, retry_delay=10, timeout=120)
def summarize(ctx):
    """One region (``ctx.item``); instance ``ctx.map_index`` of the map."""
    rng = random.Random(f"{ctx.logical_date.date()}-{ctx.item}")
    amounts = [round(rng.uniform(5, 500), 2) for _ in range(50)]
    log.info("%s: %d orders", ctx.item, len(amounts))
    return {"region": ctx.item, "orders": len(amounts), "total": round(sum(amounts), 2)}


summarize.map(over=regions, max_parallel=2)


@sales.task(produces=["regional_sales_daily"])
def publish(ctx):
    """Gets the list of the instances' results, in the order of the regions."""
    parts = ctx.upstream["summarize"]
    summary = {"day": ctx.logical_date.date().isoformat(), "regions": len(parts),
               "total": round(sum(part["total"] for part in parts), 2)}
    ctx.metadata["regional_sales_daily"] = summary  # travels with the dataset event
    return summary


export_ready >> regions
summarize >> publish


dashboard = Workflow(
    "sales_dashboard",
    description="Refreshes the sales dashboard whenever regional_sales publishes a day.",
    triggers=[On("regional_sales_daily")],
    tags=["sales", "example"],
    owner="data-team@example.com",
)


@dashboard.task(retries=1)
def refresh(ctx):
    """``ctx.events``: the dataset events that started this run, with their metadata."""
    days = [event["metadata"] for event in ctx.events]
    log.info("refreshing the dashboard for %s", ", ".join(day.get("day", "?") for day in days))
    return {"refreshed": [day.get("day") for day in days]}
