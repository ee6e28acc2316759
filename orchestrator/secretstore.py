"""The secrets store: values encrypted at rest, the backends a task's secrets are looked up in,
the changes made by people (audited), the reads made by tasks (audited), and key rotation.

Encryption is ``cryptography``'s Fernet (AES-128-CBC with HMAC-SHA256), through MultiFernet:
``ORCHESTRATOR_SECRETS_KEYS`` holds one or more keys, newest first; a value is encrypted with
the first and read with whichever key encrypted it. Rotation without downtime:

1. put a new key first in ``ORCHESTRATOR_SECRETS_KEYS`` (the old ones after it) and restart the
   processes: every process reads old and new values alike;
2. ``manage.py rotate_secrets_key`` re-encrypts every row under the new key, in batches, each
   row by a guarded update (a value changed meanwhile is left as its writer stored it);
3. drop the old key once the command reports nothing left under it.

Backends (``ORCHESTRATOR_SECRETS_BACKENDS``, looked up in order, the first that holds the name
wins) implement ``SecretBackend``: ``get(kind, name)`` returns the value (a str for a secret;
for a connection a URL as str, or ``{"url": ...}`` / ``{"fields": {...}}``), or None.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.db import connection, transaction
from django.utils.module_loading import import_string

from orchestrator import audit, clock, limits
from orchestrator.conf import app_settings
from orchestrator.models import AuditEvent, Secret
from orchestrator.secrets import (
    CONNECTION,
    CONNECTION_FIELDS,
    KINDS,
    NAME_RE,
    NAME_RULE,
    SECRET,
    SecretError,
    SecretNotFound,
)

# The group whose members manage secrets (besides superusers): created by migration 0029.
MANAGERS = "Secrets managers"
ROTATE_BATCH = 200


class KeyMissing(SecretError):
    """No key is configured: nothing can be stored or read."""


class StoreError(ValueError):
    """Bad input to the store; ``field`` names the field at fault."""

    def __init__(self, message: str, field: str = "value"):
        super().__init__(message)
        self.field = field


# --- keys --------------------------------------------------------------------------------------


def key_id(key: str | bytes) -> str:
    """A key's fingerprint, stored beside each value (which key encrypted it), never the key."""
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw).hexdigest()[:16]


def new_key() -> str:
    return Fernet.generate_key().decode()


def key_problems() -> list[str]:
    """What is wrong with ``ORCHESTRATOR_SECRETS_KEYS`` (each key must be a Fernet key)."""
    found = []
    for index, key in enumerate(app_settings.SECRETS_KEYS):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            found.append(f"ORCHESTRATOR_SECRETS_KEYS[{index}] is not a Fernet key (32 bytes in URL-safe base64, "
                         "44 characters)")
    return found


def _keys() -> list[str]:
    keys = app_settings.SECRETS_KEYS
    if not keys:
        raise KeyMissing("the secrets store has no key: set ORCHESTRATOR_SECRETS_KEYS (make one with "
                         "manage.py rotate_secrets_key --new-key) in every process's environment")
    problems = key_problems()
    if problems:
        raise KeyMissing("; ".join(problems))
    return keys


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(key) for key in _keys()])


def encrypt(data: dict) -> tuple[str, str]:
    """The token of ``data``'s JSON under the newest key, and that key's id."""
    keys = _keys()
    return _fernet().encrypt(json.dumps(data).encode()).decode(), key_id(keys[0])


def decrypt(row: Secret) -> dict:
    try:
        return json.loads(_fernet().decrypt(row.value.encode()))
    except InvalidToken:
        raise SecretError(f"the {row.kind} {row.name!r} cannot be decrypted with any key of "
                          "ORCHESTRATOR_SECRETS_KEYS: the key that encrypted it was removed, or is not "
                          "set in this process") from None


# --- what people store ---------------------------------------------------------------------------


def stored_data(kind: str, value=None, *, url: str | None = None, fields: dict | None = None) -> dict:
    """The JSON that is encrypted: ``{"value": ...}`` for a secret; a connection's ``{"url": ...}``
    or ``{"fields": {...}}`` (a connection's value may also be given as a URL or a JSON object of
    fields, as text). Raises StoreError naming the field."""
    if kind == SECRET:
        if not isinstance(value, str) or value == "":
            raise StoreError("a secret's value must be a non-empty string")
        if problem := limits.text_error(value, "the value"):
            raise StoreError(problem)
        return {"value": value}
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            fields = json.loads(value)
        except ValueError as exc:
            raise StoreError(f"a connection's value is a URL or a JSON object of fields; this JSON is not "
                             f"valid: {exc.msg} at character {exc.pos}") from None
    elif isinstance(value, str) and value:
        url = value
    if url is not None and fields is not None:
        raise StoreError("give a connection a url or fields, not both", field="url")
    if url is not None:
        if not isinstance(url, str) or not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", url) or limits.text_error(url, "the url"):
            raise StoreError("a connection's url must look like scheme://user:password@host:port/database",
                             field="url")
        return {"url": url}
    if fields is not None:
        return {"fields": _checked_fields(fields)}
    raise StoreError("a connection needs a url (scheme://user:password@host/database) or its fields", field="url")


def _checked_fields(fields) -> dict:
    if not isinstance(fields, dict) or not fields:
        raise StoreError("a connection's fields are a JSON object (host, port, login, password, ...)", field="fields")
    unknown = sorted(str(key) for key in fields if key not in CONNECTION_FIELDS)
    if unknown:
        raise StoreError(f"unknown connection field(s) {', '.join(unknown)}; known: {', '.join(CONNECTION_FIELDS)}",
                         field="fields")
    port = fields.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise StoreError(f"port must be a whole number from 1 to 65535, got {limits.safe_repr(port)}", field="fields")
    if "extra" in fields and not isinstance(fields["extra"], dict):
        raise StoreError("extra must be a JSON object", field="fields")
    for key in ("scheme", "host", "login", "password", "database"):
        if key in fields and not isinstance(fields[key], str):
            raise StoreError(f"{key} must be a string", field="fields")
    return fields


def check_name(kind: str, name) -> None:
    if kind not in KINDS:
        raise StoreError(f"kind must be one of {', '.join(KINDS)}, got {limits.safe_repr(kind)}", field="kind")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise StoreError(f"{limits.safe_repr(name)} is not a valid name: {NAME_RULE}", field="name")


def put(kind: str, name: str, data: dict, *, user=None, request=None, description: str | None = None) -> Secret:
    """Create or replace the value of a secret or connection (``data`` from ``stored_data``), audited."""
    check_name(kind, name)
    token, kid = encrypt(data)
    now = clock.now()
    who = user if user is not None else getattr(request, "user", None)
    who = who if getattr(who, "is_authenticated", False) else None
    with transaction.atomic():
        row, created = Secret.objects.select_for_update().get_or_create(
            kind=kind, name=name, defaults={"value": token, "key_id": kid, "created_at": now, "updated_at": now,
                                            "description": description or ""})
        row.value, row.key_id, row.updated_at = token, kid, now
        row.updated_by, row.updated_by_name = who, who.get_username() if who is not None else audit.cli_user()
        if description is not None:
            row.description = description
        row.save()
        audit.record("secret_set", request=request, user=user, target=row, kind=kind, name=name,
                     change="created" if created else "changed")
    return row


def describe(row: Secret, description: str, *, user=None, request=None) -> Secret:
    """Change only the description (the value stays as it is), audited."""
    with transaction.atomic():
        Secret.objects.filter(pk=row.pk).update(description=description)
        row.description = description
        audit.record("secret_describe", request=request, user=user, target=row, kind=row.kind, name=row.name)
    return row


def delete(row: Secret, *, user=None, request=None) -> None:
    with transaction.atomic():
        audit.record("secret_delete", request=request, user=user, target=row, kind=row.kind, name=row.name)
        row.delete()


def may_manage(user) -> bool:
    """Superusers and the Secrets managers group manage secrets (never anyone else, staff or not)."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    return user.is_superuser or user.groups.filter(name=MANAGERS).exists()


# --- backends ---------------------------------------------------------------------------------------


class SecretBackend:
    """Where a task's secrets may come from. ``get`` returns the value or None (not held here)."""

    label = "backend"

    def get(self, kind: str, name: str):
        raise NotImplementedError


class DatabaseBackend(SecretBackend):
    """The encrypted store of the admin and the API."""

    label = "database"

    def get(self, kind: str, name: str):
        row = Secret.objects.filter(kind=kind, name=name).first()
        if row is None:
            return None
        data = decrypt(row)
        return data["value"] if kind == SECRET else data


def _variable(name: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", name.upper())


class EnvironmentBackend(SecretBackend):
    """``ORCHESTRATOR_SECRET_<NAME>`` and ``ORCHESTRATOR_CONNECTION_<NAME>`` (a URL) of the worker's
    environment: the name in capitals, other characters as ``_``."""

    label = "env"

    def get(self, kind: str, name: str):
        prefix = "ORCHESTRATOR_SECRET_" if kind == SECRET else "ORCHESTRATOR_CONNECTION_"
        return os.environ.get(prefix + _variable(name)) or None


class FileBackend(SecretBackend):
    """A file per secret in ``ORCHESTRATOR_SECRETS_DIR`` (``/run/secrets``: Docker's and Kubernetes'
    mounted secrets): ``<name>`` for a secret, ``connection-<name>`` for a connection (a URL or a JSON
    object of fields). One trailing line break is not part of the value."""

    label = "files"

    def get(self, kind: str, name: str):
        folder = app_settings.SECRETS_DIR
        path = folder / (name if kind == SECRET else f"connection-{name}")
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretError(f"the {kind} {name!r} cannot be read from {path}: {exc}") from None
        text = text[:-1] if text.endswith("\n") else text
        if kind == CONNECTION and text.lstrip().startswith("{"):
            try:
                return {"fields": json.loads(text)}
            except ValueError:
                raise SecretError(f"the connection file {path} is not a URL or a valid JSON object") from None
        return text or None


BACKENDS = {"database": DatabaseBackend, "env": EnvironmentBackend, "files": FileBackend}


def backends() -> list[SecretBackend]:
    found = []
    for name in app_settings.SECRETS_BACKENDS:
        try:
            cls = BACKENDS.get(name) or import_string(name)
        except ImportError as exc:
            raise SecretError(f"ORCHESTRATOR_SECRETS_BACKENDS names {name!r}, which is not a backend: {exc}") from None
        found.append(cls())
    return found


# --- what tasks read -----------------------------------------------------------------------------------


@dataclass
class Read:
    value: object
    source: str


def lookup(kind: str, name: str) -> Read:
    for backend in backends():
        value = backend.get(kind, name)
        if value is not None:
            return Read(value, getattr(backend, "label", type(backend).__name__))
    where = ", ".join(app_settings.SECRETS_BACKENDS) or "no backend"
    raise SecretNotFound(f"the {kind} {name!r} is not set (looked in: {where}); a secrets manager creates it in the "
                         "admin or the API")


def read_for_task(kind: str, name: str, access) -> object:
    """The value of a declared secret or connection for the attempt ``access`` describes; the read
    is written to the audit log (which task run, attempt, backend; never the value)."""
    found = lookup(kind, name)
    audit.record("secret_read", source=AuditEvent.Source.TASK, actor_name=f"task run {access.task_run_id}",
                 target_type="secret", target_id=f"{kind}:{name}", kind=kind, name=name,
                 task_run=access.task_run_id, run=access.run_id, attempt=access.attempt, workflow=access.workflow,
                 task=access.task, backend=found.source)
    return found.value


# --- rotation -------------------------------------------------------------------------------------------

# Rows not yet under the newest key, in id order from where the last batch stopped.
TO_ROTATE = """
SELECT id, value FROM orchestrator_secret WHERE key_id <> %(key_id)s AND id > %(after)s ORDER BY id LIMIT %(limit)s
"""

# Each row replaced only if its value is still the one read: a value stored meanwhile (by a
# process that already encrypts with the new key) is left as its writer stored it.
ROTATE = """
UPDATE orchestrator_secret s SET value = v.new, key_id = %(key_id)s
FROM (SELECT unnest(%(ids)s::bigint[]) AS id, unnest(%(old)s::text[]) AS old, unnest(%(new)s::text[]) AS new) v
WHERE s.id = v.id AND s.value = v.old
"""


@dataclass
class Rotation:
    rotated: int = 0
    changed_meanwhile: int = 0
    failed: list[str] | None = None


def rotate(batch: int = ROTATE_BATCH) -> Rotation:
    """Re-encrypt every row not under the newest key, ``batch`` rows per statement pair."""
    keys = _keys()
    fernet, newest = _fernet(), key_id(keys[0])
    outcome, after = Rotation(failed=[]), 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(TO_ROTATE, {"key_id": newest, "after": after, "limit": batch})
            rows = cursor.fetchall()
            if not rows:
                break
            after = rows[-1][0]
            ids, old, new = [], [], []
            for pk, value in rows:
                try:
                    token = fernet.rotate(value.encode()).decode()
                except InvalidToken:
                    outcome.failed.append(str(pk))
                    continue
                ids.append(pk)
                old.append(value)
                new.append(token)
            if ids:
                cursor.execute(ROTATE, {"key_id": newest, "ids": ids, "old": old, "new": new})
                outcome.rotated += cursor.rowcount
                outcome.changed_meanwhile += len(ids) - cursor.rowcount
    if outcome.failed:
        names = Secret.objects.filter(pk__in=outcome.failed).values_list("kind", "name")
        outcome.failed = [f"{kind} {name}" for kind, name in names]
    audit.record("secret_rotate", target_type="secret", rotated=outcome.rotated, key_id=newest,
                 changed_meanwhile=outcome.changed_meanwhile, failed=outcome.failed)
    return outcome


def under_old_keys() -> int:
    """How many rows are not yet under the newest key."""
    return Secret.objects.exclude(key_id=key_id(_keys()[0])).count()
