"""The shop's django.tasks tasks: enqueued with .enqueue(), run by the orchestrator's workers."""

from django.tasks import task

from shop.models import Order


@task(queue_name="mail")
def send_invoice(order_id):
    order = Order.objects.get(pk=order_id)
    order.invoiced = True
    order.notes = [*order.notes, "invoice sent"]
    order.save(update_fields=["invoiced", "notes"])
    return {"invoiced": order.number}


@task
def never_runs(order_id):
    Order.objects.filter(pk=order_id).update(status="should-never-happen")
