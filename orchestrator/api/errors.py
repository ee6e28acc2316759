"""Every API error is JSON: ``{"detail": "..."}`` and, for bad input, one list of messages per field
(``{"params": {"orders": ["expected an integer, got \\"x\\""]}}``).

DRF already turns its own exceptions into such responses; this handler adds the errors our
modules raise and the input problems that would otherwise surface from the database as a 500
(a value PostgreSQL cannot store), so no input produces a server error. A real bug still answers
JSON: ``{"detail": "internal server error"}`` with status 500 and nothing of the server's internals
(not even with DEBUG on); the traceback goes to the server's log.
"""

from __future__ import annotations

import logging

from django.core.exceptions import SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.signals import got_request_exception
from django.db import DataError
from django.http import JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from orchestrator.params import ParamError
from orchestrator.runs import IdempotencyConflict, RunError

log = logging.getLogger("django.request")


def field_errors(field: str | None, message: str) -> dict:
    return {field or "non_field_errors": [message]}


def param_errors(exc: ParamError) -> dict:
    # A message about the params object as a whole ("expected an object") is keyed "params" itself.
    if set(exc.errors) == {"params"}:
        return {"params": [exc.errors["params"]]}
    return {"params": {name: [message] for name, message in exc.errors.items()}}


def exception_handler(exc, context):
    if isinstance(exc, IdempotencyConflict):
        return Response({"detail": str(exc), "idempotency_key": [str(exc)], "existing_id": exc.existing.pk},
                        status=status.HTTP_409_CONFLICT)
    if isinstance(exc, ParamError):
        exc = ValidationError(param_errors(exc))
    elif isinstance(exc, RunError):
        exc = ValidationError(field_errors(exc.field, str(exc)))
    elif isinstance(exc, DjangoValidationError):
        exc = ValidationError(exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages})
    elif isinstance(exc, SuspiciousOperation):
        # Too many fields, a body over DATA_UPLOAD_MAX_MEMORY_SIZE: Django's own limits on input.
        exc = ValidationError({"non_field_errors": [str(exc) or "the request is too large"]})
    elif isinstance(exc, DataError):
        # PostgreSQL refused a value (out of range, NUL byte): the input was bad, not the server.
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "a value cannot be stored"
        exc = ValidationError({"non_field_errors": [f"invalid input: {reason}"]})
    response = drf_exception_handler(exc, context)
    if response is None:
        return server_error(exc, context)
    if isinstance(exc, ValidationError) and not isinstance(response.data, dict):
        response.data = {"non_field_errors": response.data}
    if isinstance(response.data, dict) and "detail" not in response.data:
        response.data = {"detail": summary(response.data), **response.data}
    return response


def server_error(exc, context) -> Response:
    """A bug, not bad input: logged with its traceback as Django logs one, announced to whoever
    listens for request exceptions (error trackers, the test client), and answered in JSON."""
    request = context["request"]
    log.error("Internal Server Error: %s", request.path, exc_info=(type(exc), exc, exc.__traceback__),
              extra={"status_code": 500, "request": request._request})
    got_request_exception.send(sender=None, request=request._request)
    return Response({"detail": "internal server error; the server's log has the details"},
                    status=status.HTTP_500_INTERNAL_SERVER_ERROR)


def summary(errors: dict) -> str:
    """One line for clients that show only ``detail``: the first message of the first field."""
    for field, messages in errors.items():
        while isinstance(messages, dict) and messages:
            field, messages = next(iter(messages.items()))
        if isinstance(messages, list) and messages:
            first = messages[0]
            while isinstance(first, dict | list) and first:
                first = next(iter(first.values())) if isinstance(first, dict) else first[0]
            return f"{field}: {first}" if field != "non_field_errors" else str(first)
    return "invalid input"


@csrf_exempt  # a JSON 404 for every method, never Django's HTML CSRF page
def not_found(request, *args, **kwargs):
    """Unknown /api/ URLs answer JSON, like every other API error. A missing trailing slash is
    named rather than redirected: a redirected POST would lose its body."""
    detail = f"no API endpoint at {request.path}"
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not not_found:
            detail += f"; did you mean {request.path}/ (with the trailing slash)?"
    return JsonResponse({"detail": detail}, status=404)
