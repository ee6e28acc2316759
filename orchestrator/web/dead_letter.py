"""The dead-letter queue: task runs that used every attempt, filtered and paged, retried or
discarded in bulk after a confirmation page that shows what will change."""

from __future__ import annotations

from datetime import UTC

from django.contrib import messages
from django.urls import reverse

from orchestrator import access, audit, control, reads
from orchestrator.models import TaskRun
from orchestrator.states import TaskState
from orchestrator.web import zones
from orchestrator.web.forms import BulkTaskRunForm, DeadLetterFilterForm
from orchestrator.web.kit import (
    back,
    day_bounds,
    page,
    page_links,
    safe_next,
    valid_filters,
    viewer_required,
    workflow_filter,
)


def dead_task_runs(data: dict, zone=UTC):
    """The dead task runs matching the list's filters, without pagination; dates are days in ``zone``."""
    since, until = day_bounds(data.get("since"), data.get("until"), zone)
    return reads.dead_letters(workflow=workflow_filter(data.get("workflow")), queue=data.get("queue"),
                              error=data.get("error"), died_from=since, died_before=until)


@viewer_required
def dead_letter(request):
    if request.method == "POST":
        return dead_letter_action(request)
    form = DeadLetterFilterForm(request.GET or None, user=request.user)
    data = valid_filters(form)
    dead = reads.DEAD_LETTER_ORDER.page(access.visible(request.user, dead_task_runs(data, zones.for_request(request).zone))
                                        .select_related("run__workflow"), data.get("cursor"))
    return page(request, "orchestrator/web/dead_letter.html", {
        "form": form, "rows": dead.rows, **page_links(request, dead, reads.DEAD_LETTER_ORDER),
        "paged": bool(data.get("cursor")),
        "queues": access.visible(request.user, TaskRun.objects.filter(state=TaskState.DEAD))
        .values_list("queue", flat=True).distinct().order_by("queue"),
    })


def dead_letter_action(request):
    """Retry or discard the selected dead task runs: the first POST shows what will change and
    asks for confirmation; only the confirmed POST acts."""
    home = reverse("orchestrator:web:dead_letter")
    form = BulkTaskRunForm(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            for error in errors:
                messages.error(request, error if field in ("ids", "__all__") else f"{field}: {error}")
        return back(request, home)
    action, ids = form.cleaned_data["action"], sorted(set(form.cleaned_data["ids"]))
    # Another tenant's task run reads as gone; one this user reads but may not act on is refused.
    rows = list(access.visible(request.user, TaskRun.objects.filter(pk__in=ids, state=TaskState.DEAD))
                .select_related("run__workflow"))
    for row in rows:
        access.require_operate(request.user, row)
    if not rows:
        messages.warning(request, "None of the selected task runs is in the dead-letter queue any more.")
        return back(request, home)
    if not form.cleaned_data["confirmed"]:
        return page(request, "orchestrator/web/dead_letter_confirm.html", {
            "action": action, "rows": rows, "next": safe_next(request, home), "gone": len(ids) - len(rows),
        })
    ids = [tr.pk for tr in rows]
    if action == "retry":
        count = control.retry_task_runs(ids)
        messages.success(request, f"Retrying {count} task run{'s' if count != 1 else ''}.")
    else:
        count = control.discard_task_runs(ids)
        messages.success(request, f"Discarded {count} task run{'s' if count != 1 else ''} (now failed).")
    audit.record_each(action, "taskrun", ids, request=request, changed=count)
    return back(request, home)
