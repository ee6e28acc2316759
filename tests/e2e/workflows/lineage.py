"""Workflows with every kind of node the pages draw: a sensor, a branch, a mapped task, a task
that produces a dataset, and a workflow that the dataset starts. The browser tests seed their
runs; nothing here is meant to run for long."""

from orchestrator.dsl import On, Workflow

daily = Workflow("orders_daily", description="Waits for the export, maps over the shops and publishes the day.")


@daily.sensor(every=60, timeout=3600)
def export_ready(ctx):
    return {"ready": True}


@daily.task(branch=True)
def choose(ctx):
    return ["shops"]


@daily.task
def shops(ctx):
    return ["north", "south", "east"]


@daily.task
def count_shop(ctx):
    return {"shop": ctx.item, "orders": 3}


count_shop.map(over=shops)


@daily.task(produces=["s3://warehouse/orders/daily"])
def publish(ctx):
    return {"published": True}


export_ready >> choose >> shops
count_shop >> publish

refresh = Workflow("orders_dashboard", description="Refreshes the dashboard when a day of orders is published.",
                   triggers=[On("s3://warehouse/orders/daily")])


@refresh.task
def refresh_dashboard(ctx):
    return None
