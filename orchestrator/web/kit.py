"""What every page of the web UI shares: who may see and change it, rendering a page (or only its
htmx partial), going back after an action, and the links of a keyset-paged list.

A page module (``dashboard``, ``workflows``, ``runs``, ``task_runs``, ``dead_letter``, ``audit``,
``lineage``) holds its views and a function that builds each page's context from plain
arguments (a workflow, a run, the time), so what a page computes is testable without a request.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_POST

from orchestrator import access, clock, reads
from orchestrator.conf import app_settings
from orchestrator.web import zones
from orchestrator.web.forms import JOBS

POLL = "2s"  # how often the live part of an unfinished run or task run is refreshed
NOT_A_VIEWER = ("You need to be in the Viewers or Operators group, or to have rights on a tenant or a workflow, "
                "to see these pages.")


def viewer_required(view):
    """Anonymous users go to the login page; a logged-in user who reads nothing (no global role,
    no tenant rights) gets 403, and so does any write (POST) by a user who operates nothing,
    before the view runs. The view then reads through ``access.visible`` and checks the right on
    the object it acts on (``access.require_operate``)."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), login_url=app_settings.LOGIN_URL)
        if not access.reads_anything(request.user):
            raise PermissionDenied(NOT_A_VIEWER)
        if request.method not in ("GET", "HEAD", "OPTIONS") and not access.operates_anything(request.user):
            raise PermissionDenied("Only operators can change anything here.")
        return view(request, *args, **kwargs)

    return wrapper


def operator_action(view):
    return viewer_required(require_POST(view))


def is_htmx(request) -> bool:
    # The header itself rather than django-htmx's middleware, which a project may leave out.
    return request.headers.get("HX-Request") == "true"


def page(request, template: str, context: dict, status: int = 200, partial: str | None = None):
    """Render a page, or only its partial when htmx asks for it."""
    # A page about one object says whether this user may act on it (``access.can_operate``).
    context.setdefault("can_operate", access.operates_anything(request.user))
    context.setdefault("now", clock.now())
    context.setdefault("clock", zones.for_request(request))
    if partial and is_htmx(request):
        template = f"{template}#{partial}"
    return render(request, template, context, status=status)


def safe_next(request, default: str) -> str:
    target = request.POST.get("next") or request.GET.get("next") or default
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        return default
    return target


def back(request, default: str) -> HttpResponse:
    """Redirect to ``next`` when it is a local URL; htmx gets an HX-Redirect instead."""
    target = safe_next(request, default)
    if is_htmx(request):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = target
        return response
    return HttpResponseRedirect(target)


def seconds(start: datetime | None, end: datetime | None, now: datetime) -> float | None:
    """How long something took, or has taken so far; None when it never started."""
    if start is None:
        return None
    return max(0.0, ((end or now) - start).total_seconds())


def id_cursor(data: dict) -> reads.Cursor | None:
    """The cursor of a list paged by id, from its ``after`` (newer rows) or ``before`` (older) filter."""
    if data.get("after"):
        return reads.Cursor(False, (data["after"],))
    if data.get("before"):
        return reads.Cursor(True, (data["before"],))
    return None


def valid_filters(form) -> dict:
    """The filters of a list's form that are valid: a bad one is dropped (and shown with its
    error), the rest still apply."""
    if not form.is_bound:
        return {}
    form.is_valid()
    return {key: value for key, value in form.cleaned_data.items() if key not in form.errors}


def workflow_filter(name: str | None):
    """The ``workflow`` of a read (``reads.runs``, ``reads.dead_letters``) for the lists' workflow filter."""
    if not name:
        return reads.ANY
    return reads.NO_WORKFLOW if name == JOBS else reads.workflow_id(name)


def page_links(request, page: reads.Page, keyset: reads.Keyset = reads.BY_ID) -> dict:
    """Whether older and newer pages exist, and the query strings of the links to them (or "")
    and to the first page, each keeping the list's filters. A list by id pages with ``before`` and
    ``after``; one ordered by time with the API's cursor."""

    def query(cursor: reads.Cursor | None) -> str:
        if cursor is None:
            return ""
        if keyset.time_field:
            cursor_params = {"cursor": keyset.text(cursor)}
        else:
            cursor_params = {"before" if cursor.older else "after": cursor.key[0]}
        return f"{base}&{urlencode(cursor_params)}".lstrip("&")

    params = request.GET.copy()
    for key in ("before", "after", "cursor"):
        params.pop(key, None)
    base = params.urlencode()
    return {"has_older": page.older is not None, "has_newer": page.newer is not None, "first_qs": base,
            "older_qs": query(page.older), "newer_qs": query(page.newer)}


def day_bounds(since: date | None, until: date | None, zone=UTC) -> tuple[datetime | None, datetime | None]:
    """The instants from the start of day ``since`` to the end of day ``until`` in ``zone`` (the
    user's clock: the date filters take dates in the zone the pages show)."""
    lo = datetime.combine(since, time.min, tzinfo=zone) if since else None
    # Up to the last day of the calendar means no upper bound (the day after it does not exist).
    hi = datetime.combine(until + timedelta(days=1), time.min, tzinfo=zone) if until and until < date.max else None
    return lo, hi
