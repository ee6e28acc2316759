"""Datasets on the pages: which workflows and tasks produce each dataset (``produces=[...]``),
which workflows it triggers (``triggers=[On(...)]``), and its recent events with the runs they
started. What is declared is read from the current versions of the workflows present; what
happened from the events, so a dataset keeps its history after its producer is removed.

A dataset's page draws its lineage (producers → dataset → consumers) and lets an operator record
an event by hand (data that arrived outside the orchestrator): the form asks for confirmation,
saying which workflows the event will start, and the event is written to the audit log. The API
does the same with ``POST api/dataset-events/``.

A user with rights on some tenants sees the datasets that their workflows declare or produced, the
events of their workflows, and only their workflows among producers and consumers. An event
recorded by hand starts the consumers of every tenant, so only a global operator records one."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, Prefetch
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import urlencode

from orchestrator import access, audit, clock, datasets, limits
from orchestrator.models import ConsumerRun, Dataset, DatasetEvent, Workflow
from orchestrator.web import svg
from orchestrator.web.errors import InvalidInput
from orchestrator.web.kit import operator_action, page, viewer_required

EVENTS_SHOWN = 50
MAX_METADATA = 65_536  # characters of metadata in an event recorded by hand


@dataclass
class Declared:
    """One dataset as the workflows declare it."""

    name: str
    producers: list[tuple[str, str]] = field(default_factory=list)  # (workflow, task)
    consumers: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (workflow, mode, datasets)


def declared(workflows=None) -> dict[str, Declared]:
    """Every dataset named by a present workflow's current version (of ``workflows``, a queryset:
    those a user may read, when given)."""
    found: dict[str, Declared] = {}
    workflows = Workflow.objects.all() if workflows is None else workflows
    for wf in workflows.filter(present=True, current_version__isnull=False).select_related("current_version") \
            .order_by("name"):
        spec = wf.current_version.spec
        for task_name, task in sorted(spec.get("tasks", {}).items()):
            for dataset in task.get("produces", []):
                found.setdefault(dataset, Declared(dataset)).producers.append((wf.name, task_name))
        for trigger in spec.get("triggers", []):
            for dataset in trigger.get("datasets", []):
                found.setdefault(dataset, Declared(dataset)).consumers.append(
                    (wf.name, trigger.get("mode", "any"), list(trigger.get("datasets", []))))
    return found


def of_workflow(wf: Workflow, workflows=None) -> dict:
    """The workflow page's data section: what its tasks produce and who consumes it, what it is
    triggered by and who produces that (among ``workflows`` when given)."""
    spec = wf.spec if wf.current_version_id else {}
    produces = {task: list(t.get("produces", [])) for task, t in sorted(spec.get("tasks", {}).items())
                if t.get("produces")}
    triggers = spec.get("triggers", [])
    if not produces and not triggers:
        return {}
    everything = declared(workflows)
    produced = [(task, [(name, [c for c in everything[name].consumers if c[0] != wf.name] if name in everything else [])
                        for name in names]) for task, names in produces.items()]
    consumed = [(trigger.get("mode", "any"),
                 [(name, [p for p in everything[name].producers] if name in everything else [])
                  for name in trigger.get("datasets", [])]) for trigger in triggers]
    return {"produced": produced, "consumed": consumed}


@viewer_required
def dataset_list(request):
    everything = declared(access.visible(request.user, Workflow.objects.all()))
    events = access.visible(request.user, DatasetEvent.objects.all())
    stats = {row["dataset__name"]: row for row in events.values("dataset__name").order_by()
             .annotate(n=Count("id"), last_at=Max("created_at"))}
    names = set(everything) | set(stats)
    if not access.is_scoped(request.user):
        names |= set(Dataset.objects.values_list("name", flat=True))  # also those no event or workflow names now
    names = sorted(names)
    datasets = [{"name": name, "declared": everything.get(name, Declared(name)),
                 "events": stats.get(name, {}).get("n", 0), "last": stats.get(name, {}).get("last_at")}
                for name in names]
    return page(request, "orchestrator/web/datasets.html", {"datasets": datasets})


def url(name: str) -> str:
    """A dataset page's address, the name in the query: a name such as ``s3://b/../x`` or ``a/./b``
    in the path would be rewritten by the browser (dot segments removed) into another address."""
    return f"{reverse('orchestrator:web:dataset_named')}?{urlencode({'name': name})}"


@viewer_required
def dataset_named(request):
    """The dataset page of ``?name=`` (what every link uses)."""
    name = request.GET.get("name", "")
    if not name:
        raise InvalidInput("name", "which dataset? Give its name as ?name=")
    return dataset_detail(request, name)


def known(name: str, user) -> tuple[Dataset | None, Declared, object]:
    """The dataset's row (None before its first event), what the workflows ``user`` may read
    declare of it and the events of it they may read; a 404 for a name none of them knows (a
    dataset none of a tenant user's workflows declares or produced is unknown to them)."""
    everything = declared(access.visible(user, Workflow.objects.all()))
    dataset = Dataset.objects.filter(name=name).first() if "\x00" not in name else None
    of_dataset = access.visible(user, DatasetEvent.objects.filter(dataset=dataset))
    seen = dataset is not None and (not access.is_scoped(user) or of_dataset.exists())
    if name not in everything and not seen:
        raise Http404(f"No dataset named {name!r}.")
    return dataset, everything.get(name, Declared(name)), of_dataset


def lineage_graph(name: str, found: Declared) -> str:
    """Producers (workflow.task) → the dataset → the workflows its events start."""
    producers = [(f"{wf}.{task}", reverse("orchestrator:web:workflow", args=[wf])) for wf, task in found.producers]
    consumers = [(wf, reverse("orchestrator:web:workflow", args=[wf])) for wf, _mode, _all in found.consumers]
    return svg.lineage(name, producers, consumers)


def dataset_context(user, name: str, dataset: Dataset | None, found: Declared, of_dataset, **form) -> dict:
    events = []
    if dataset is not None:
        consumers = access.visible(user, ConsumerRun.objects.select_related("workflow", "run")).order_by("id")
        events = list(of_dataset.order_by("-id").prefetch_related(Prefetch("consumers", queryset=consumers))
                      [:EVENTS_SHOWN])
    return {
        "name": name, "dataset": dataset, "declared": found, "events": events,
        "event_count": of_dataset.count() if dataset else 0, "shown": EVENTS_SHOWN,
        "lineage": lineage_graph(name, found), "metadata_text": "", "metadata_error": "", **form,
    }


@viewer_required
def dataset_detail(request, name):
    dataset, found, of_dataset = known(name, request.user)
    return page(request, "orchestrator/web/dataset.html", dataset_context(request.user, name, dataset, found,
                                                                          of_dataset))


def parse_metadata(text: str) -> dict:
    """The metadata of an event recorded by hand: a JSON object (empty text: none)."""
    if not text.strip():
        return {}
    if len(text) > MAX_METADATA:
        raise ValueError(f"metadata is {len(text):,} characters; at most {MAX_METADATA:,}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"metadata is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"metadata must be a JSON object ({{...}}), got a {type(value).__name__}")
    problem = limits.json_problem(value)
    if problem:
        raise ValueError(f"metadata: {problem}")
    return value


@operator_action
def dataset_event(request):
    """Record an event of dataset ``name`` by hand: the form, then a confirmation that says which
    workflows it starts, then the event (audited) and back to the dataset's page."""
    name = request.POST.get("name", "")
    if not name:
        raise InvalidInput("name", "which dataset? Give its name in the form's name field")
    if not access.is_operator(request.user):
        raise PermissionDenied("Recording a dataset event takes a global operator: it starts the consumers of "
                               "every tenant.")
    dataset, found, of_dataset = known(name, request.user)
    text = request.POST.get("metadata", "")
    try:
        metadata = parse_metadata(text)
    except ValueError as exc:
        return page(request, "orchestrator/web/dataset.html", dataset_context(
            request.user, name, dataset, found, of_dataset, metadata_text=text, metadata_error=str(exc)), status=400)
    if request.POST.get("confirm") != "yes":
        return page(request, "orchestrator/web/dataset_event_confirm.html",
                    {"name": name, "declared": found, "metadata": metadata, "metadata_text": text})
    event = datasets.record_by_hand(name, metadata, now=clock.now())
    audit.record("dataset_event", request=request, target=event, target_type="dataset_event", dataset=name,
                 metadata=metadata)
    starts = ", ".join(wf for wf, _mode, _all in found.consumers) or "no workflow"
    messages.success(request, f"Recorded event #{event.pk} of {name}; consumers: {starts}.")
    return HttpResponseRedirect(url(name))
