"""The audit log page: every operator action, newest first, filtered by action, person, source
and target; operators only (it says who did what from which address). An operator of some
tenants reads the records of their objects only."""

from __future__ import annotations

import json

from django import forms
from django.core.exceptions import PermissionDenied

from orchestrator import access, reads
from orchestrator.models import AuditEvent
from orchestrator.web.kit import id_cursor, page, page_links, valid_filters, viewer_required


class AuditFilterForm(forms.Form):
    action = forms.CharField(required=False, max_length=50)
    actor = forms.CharField(required=False, max_length=150, label="who")
    source = forms.ChoiceField(required=False, choices=[("", "from anywhere"), *AuditEvent.Source.choices])
    target_type = forms.CharField(required=False, max_length=50, label="target type")
    target_id = forms.CharField(required=False, max_length=255, label="target id")
    before = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    after = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1)

    def clean(self):
        data = super().clean()
        for key, value in data.items():
            if isinstance(value, str) and "\x00" in value:
                self.add_error(key, "contains a NUL character")
        return data


def filter_events(data: dict):
    events = AuditEvent.objects.all()
    for key, lookup in (("action", "action"), ("actor", "actor_name"), ("source", "source"),
                        ("target_type", "target_type"), ("target_id", "target_id")):
        if data.get(key):
            events = events.filter(**{lookup: data[key]})
    return events


@viewer_required
def audit_log(request):
    if not access.operates_anything(request.user):
        raise PermissionDenied("The audit log is for operators.")
    form = AuditFilterForm(request.GET or None)
    data = valid_filters(form)
    events = reads.BY_ID.page(access.operable(request.user, filter_events(data)), id_cursor(data))
    for event in events.rows:
        event.detail_text = detail_text(event)
    return page(request, "orchestrator/web/audit.html",
                {"form": form, "events": events.rows, **page_links(request, events)})


SHOWN_IN_TARGET = ("workflow", "task", "run")  # a task run's record shows these in its target cell


def detail_text(event: AuditEvent) -> str:
    """The detail as ``key=value`` pairs in JSON (a param's type shows: ``5`` is a number, ``"5"``
    text), without what the target cell already says; a list of task run ids as its count."""
    detail = dict(event.detail or {})
    if event.target_type == "taskrun" and detail.get("task"):
        for key in SHOWN_IN_TARGET:
            detail.pop(key, None)
    parts = []
    for key, value in detail.items():
        if key == "changed" and isinstance(value, list) and "changed_tasks" in detail:
            # The record lists the first ids; its count, when it has one, counts them all.
            count = detail.get("count", len(value))
            parts.append(f"changed {count} task run{'s' if count != 1 else ''}")
        elif key == "count" and "changed_tasks" in detail:
            continue
        else:
            parts.append(f"{key}={json.dumps(value, ensure_ascii=False)}")
    return ", ".join(parts)

