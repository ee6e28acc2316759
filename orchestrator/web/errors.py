"""Bad input on the web pages: a 400 page in the site's style that says what is wrong, never a
server error.

``BadInputMiddleware`` refuses what no page or API call can use before any view (or the session
and authentication lookups) sees it: a NUL character or an unpaired surrogate in the path, a query
parameter, a cookie or a header. PostgreSQL cannot compare such text, so letting it through would
fail in the database. It also turns an ``InvalidInput`` raised by a view into that 400 page (JSON
under the API). ``server_error`` is the project's handler500: a plain page, or JSON under the API,
with nothing of the server's internals.
"""

from __future__ import annotations

import re

from django.http import HttpResponseServerError, JsonResponse
from django.shortcuts import render
from django.template import TemplateDoesNotExist, loader
from django.urls import Resolver404, resolve

from orchestrator import access
from orchestrator.limits import text_error


class InvalidInput(Exception):
    """A query parameter (or another part of a request) a page cannot use; ``field`` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 80 else f"{text[:80]!r}... ({len(text):,} characters)"


def query_int(request, name: str, default: int | None, minimum: int, maximum: int) -> int | None:
    """The whole number in ``?name=``, or ``default`` when it is absent or empty."""
    text = request.GET.get(name, "")
    if text == "":
        return default
    # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
    if not re.fullmatch(r"[0-9]{1,20}", text) or not minimum <= int(text) <= maximum:
        raise InvalidInput(name, f"{name} must be a whole number from {minimum} to {maximum:,}, got {_shown(text)}")
    return int(text)


def is_api(request) -> bool:
    """Whether the request is for this app's API (mounted under any prefix)."""
    try:
        return resolve(request.path_info).app_names[-2:] == ["orchestrator", "api"]
    except Resolver404:
        return False


def bad_request(request, field: str, message: str):
    if is_api(request):
        return JsonResponse({"detail": message, field: [message]}, status=400)
    context = {"title": "Bad request", "message": message, "can_operate": access.operates_anything(request.user)
               if hasattr(request, "user") else False}
    return render(request, "orchestrator/web/error.html", context, status=400)


def _unstorable(request) -> tuple[str, str] | None:
    """(field, message) for the first part of the request that holds text PostgreSQL cannot take."""
    checks = [("path", request.path_info, "the address")]
    for key, values in request.GET.lists():
        checks.append((key, key, "a query parameter's name"))
        checks.extend((key, value, f"the query parameter {_shown(key)}") for value in values)
    checks.extend((key, value, f"the cookie {_shown(key)}") for key, value in request.COOKIES.items())
    checks.extend((key, value, f"the header {key}") for key, value in request.headers.items())
    for field, text, where in checks:
        if message := text_error(text, where):
            return field, message
    return None


class BadInputMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        found = _unstorable(request)
        if found is not None:
            return bad_request(request, *found)
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, InvalidInput):
            return bad_request(request, exception.field, str(exception))
        return None


def server_error(request):
    """handler500 (DEBUG off): JSON under the API, else the plain 500.html, rendered without a
    context (a broken context processor must not break the error page too)."""
    if is_api(request):
        return JsonResponse({"detail": "internal server error; the server's log has the details"}, status=500)
    try:
        return HttpResponseServerError(loader.get_template("500.html").render())
    except TemplateDoesNotExist:
        return HttpResponseServerError("<h1>Server error</h1>", content_type="text/html")
