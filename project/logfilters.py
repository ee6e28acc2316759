"""The console's filter: each answer with a client error (4xx) logged once, without a traceback.

Django logs a 4xx answer on ``django.request`` (or ``django.security.*`` for a CSRF failure or a
bad host), with the reason ("Not Found: /x", "Forbidden (CSRF cookie not set.): /login/"), and
with the traceback of the PermissionDenied that made a 403; the development server logs the same
answer again on ``django.server``. A client error is not a fault of the server: the reason line
stays, without traceback, and the development server's second line for it goes.
"""

import logging


class ClientErrorsOnce(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if not isinstance(status, int) or not 400 <= status < 500:
            return True
        if record.name == "django.server":
            return False  # already logged, with its reason, by django.request or django.security
        record.exc_info = None
        record.exc_text = None
        return True
