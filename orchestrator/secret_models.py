"""The table of the secrets store: named secrets and connections, each value encrypted (a Fernet
token of its JSON) under a key kept outside the database (``ORCHESTRATOR_SECRETS_KEYS``).

Defined here rather than in ``models.py`` to keep that module to the core of runs and tasks;
``models.py`` imports it, so it is one of the app's models like the others. What reads and writes
it is ``orchestrator.secretstore``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Secret(models.Model):
    """A secret (one value) or a connection (a URL or a set of fields). The value is write-only:
    no page, API answer or admin form shows it, only who set it and when."""

    class Kind(models.TextChoices):
        SECRET = "secret", "secret"
        CONNECTION = "connection", "connection"

    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.SECRET)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    # The Fernet token of the value's JSON ({"value": ...}, {"url": ...} or {"fields": {...}}).
    value = models.TextField()
    # Which key encrypted it (a fingerprint, not the key): what rotation has still to do.
    key_id = models.CharField(max_length=16)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    # The user name at the time, kept when the user is deleted.
    updated_by_name = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [models.UniqueConstraint(fields=["kind", "name"], name="secret_unique_kind_name")]

    def __str__(self):
        return f"{self.kind} {self.name}"

    @property
    def set_on(self) -> str:
        """What the pages show instead of the value."""
        return f"set on {self.updated_at:%Y-%m-%d %H:%M} UTC by {self.updated_by_name or 'system'}"
