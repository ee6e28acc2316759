"""The header's switch: times in local time or UTC, remembered for this user on every page."""

from __future__ import annotations

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.urls import reverse
from django.views.decorators.http import require_POST

from orchestrator import access
from orchestrator.conf import app_settings
from orchestrator.models import UserPreference
from orchestrator.web import zones
from orchestrator.web.errors import bad_request
from orchestrator.web.kit import NOT_A_VIEWER, back


@require_POST
def clock_choice(request):
    """Any viewer may choose (it changes nothing but how they read the pages)."""
    if not request.user.is_authenticated:
        return redirect_to_login(reverse("orchestrator:web:dashboard"), login_url=app_settings.LOGIN_URL)
    if not access.reads_anything(request.user):
        raise PermissionDenied(NOT_A_VIEWER)
    choice = request.POST.get("clock", "")
    if choice not in UserPreference.Clock.values:
        return bad_request(request, "clock", f'clock must be "local" or "utc", got {choice[:40]!r}')
    zones.choose(request, choice)
    return back(request, reverse("orchestrator:web:dashboard"))
