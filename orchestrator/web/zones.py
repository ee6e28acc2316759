"""The clock a user reads times in: their browser's local time or UTC, chosen once with the switch
in the page header and stored per user (``UserPreference``, cached in the session).

Pages put every time in a ``<time datetime="…Z">`` that app.js shows in the chosen clock. What
the server itself must interpret or print (the date filters of the lists, the admin) uses the
chosen zone too: UTC, or the browser's zone, which app.js reports in a cookie. Without that
cookie (a first request, no JavaScript) local time falls back on UTC, and the pages say so.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import UTC, tzinfo
from urllib.parse import unquote

from django.utils import timezone

from orchestrator.models import UserPreference

ZONE_COOKIE = "orchestrator_tz"  # written by app.js: the browser's IANA zone
SESSION_KEY = "orchestrator_clock"


@dataclass(frozen=True)
class Clock:
    choice: str  # UserPreference.Clock: "local" or "utc"
    zone_name: str  # what the date filters and the admin use: "UTC" or the browser's zone

    @property
    def zone(self) -> tzinfo:
        return UTC if self.zone_name == "UTC" else zoneinfo.ZoneInfo(self.zone_name)

    @property
    def utc(self) -> bool:
        return self.choice == UserPreference.Clock.UTC


def browser_zone(request) -> str | None:
    name = unquote(request.COOKIES.get(ZONE_COOKIE, "")).strip()
    if not name or len(name) > 64:
        return None
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None
    return name


def stored_choice(request) -> str:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return UserPreference.Clock.LOCAL
    session = getattr(request, "session", None)
    if session is not None and session.get(SESSION_KEY) in UserPreference.Clock.values:
        return session[SESSION_KEY]
    choice = (UserPreference.objects.filter(user=user).values_list("clock", flat=True).first()
              or UserPreference.Clock.LOCAL)
    if session is not None:
        session[SESSION_KEY] = choice
    return choice


def for_request(request) -> Clock:
    """The request's clock, worked out once per request."""
    cached = getattr(request, "_orchestrator_clock", None)
    if cached is None:
        choice = stored_choice(request)
        zone = "UTC" if choice == UserPreference.Clock.UTC else (browser_zone(request) or "UTC")
        cached = request._orchestrator_clock = Clock(choice, zone)
    return cached


def choose(request, choice: str) -> None:
    UserPreference.objects.update_or_create(user=request.user, defaults={"clock": choice})
    request.session[SESSION_KEY] = choice
    request.__dict__.pop("_orchestrator_clock", None)


class ClockMiddleware:
    """Activates the user's zone for the request, so the admin (and anything Django formats) shows
    times in the chosen clock. Goes after the authentication middleware."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        clock = for_request(request)
        timezone.activate(clock.zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
