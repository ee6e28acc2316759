"""Datasets on the pages: which workflows and tasks produce each dataset (``produces=[...]``),
which workflows it triggers (``triggers=[On(...)]``), and its recent events with the runs they
started. What is declared is read from the current versions of the workflows present; what
happened from the events, so a dataset keeps its history after its producer is removed.

A user with rights on some tenants sees the datasets that their workflows declare or produced, the
events of their workflows, and only their workflows among producers and consumers."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, Max, Prefetch
from django.http import Http404
from django.urls import reverse
from django.utils.http import urlencode

from orchestrator import access
from orchestrator.models import ConsumerRun, Dataset, DatasetEvent, Workflow
from orchestrator.web.errors import InvalidInput
from orchestrator.web.kit import page, viewer_required

EVENTS_SHOWN = 50


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


@viewer_required
def dataset_detail(request, name):
    everything = declared(access.visible(request.user, Workflow.objects.all()))
    dataset = Dataset.objects.filter(name=name).first() if "\x00" not in name else None
    of_dataset = access.visible(request.user, DatasetEvent.objects.filter(dataset=dataset))
    # A dataset none of this user's workflows declares or produced is unknown to them.
    known = dataset is not None and (not access.is_scoped(request.user) or of_dataset.exists())
    if name not in everything and not known:
        raise Http404(f"No dataset named {name!r}.")
    events = []
    if dataset is not None:
        consumers = access.visible(request.user, ConsumerRun.objects.select_related("workflow", "run")).order_by("id")
        events = list(of_dataset.order_by("-id").prefetch_related(Prefetch("consumers", queryset=consumers))
                      [:EVENTS_SHOWN])
    return page(request, "orchestrator/web/dataset.html", {
        "name": name, "dataset": dataset, "declared": everything.get(name, Declared(name)), "events": events,
        "event_count": of_dataset.count() if dataset else 0, "shown": EVENTS_SHOWN,
    })
