"""The site's own 404 page under DEBUG too.

With DEBUG on, Django answers an unknown address with its technical page: every URL pattern of
the project, to anyone (anonymous users included), without the Content-Security-Policy header
(the page is exempt, for its inline styles). The site is often run with DEBUG on (``./dev run``),
so this middleware answers what it answers with DEBUG off: the project's 404 handler (the
``404.html`` page), inside the CSP middleware, which adds the header. With DEBUG off it does
nothing: Django calls the handler itself.
"""

from django.conf import settings
from django.http import Http404
from django.urls import get_resolver, get_urlconf


def not_found(request, exception):
    """The project's 404 answer (``handler404``, Django's page_not_found by default)."""
    return get_resolver(get_urlconf()).resolve_error_handler(404)(request, exception)


class NotFoundPageMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        # No view ran (request.resolver_match is unset): the address matched no URL pattern, and
        # the answer is Django's technical 404 page.
        if settings.DEBUG and response.status_code == 404 and request.resolver_match is None:
            return not_found(request, Http404(f"No page at {request.path}"))
        return response

    def process_exception(self, request, exception):
        if settings.DEBUG and isinstance(exception, Http404):
            return not_found(request, exception)
        return None
