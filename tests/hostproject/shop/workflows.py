"""The shop's workflow, found because ``shop`` is an installed app (as the admin finds admin.py)."""

from orchestrator.dsl import Param, Workflow
from shop.models import Order

fulfil = Workflow("fulfil_order", description="Pack and ship one order.", params={"order": Param(int)})


@fulfil.task
def pack(ctx):
    Order.objects.filter(pk=ctx.params["order"]).update(status="packed")
    return {"order": ctx.params["order"]}


@fulfil.task(retries=1, retry_delay=0)
def ship(ctx):
    order = Order.objects.get(pk=ctx.upstream["pack"]["order"])
    order.status = "shipped"
    order.save(update_fields=["status"])
    return {"shipped": order.number}


pack >> ship
