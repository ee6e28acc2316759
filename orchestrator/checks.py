"""System checks of the app: what it needs from the project, and its own settings, each reported
with what is wrong and how to fix it."""

import importlib.util
import os

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from orchestrator import conf, secretstore, tracing
from orchestrator.channels import listen_params
from orchestrator.conf import app_settings
from orchestrator.database_url import is_transaction_pooled

# The apps the orchestrator's pages, API and admin are built on.
REQUIRED_APPS = {
    "django.contrib.admin": "the admin (backfills, limits, schedules)",
    "django.contrib.auth": "accounts and the Viewers/Operators groups",
    "django.contrib.contenttypes": "the admin",
    "django.contrib.sessions": "logging in to the pages",
    "django.contrib.messages": "the pages' confirmations",
    "django.contrib.staticfiles": "the pages' CSS and JavaScript",
    "django.contrib.postgres": "the models' array fields",
    "django_htmx": "the live parts of the pages",
    "rest_framework": "the API",
    "knox": "API tokens (stored hashed)",
    "drf_spectacular": "the API schema",
    "drf_spectacular_sidecar": "the API docs page without a CDN",
}


@register(Tags.compatibility)
def check_installed_apps(app_configs=None, **kwargs):
    missing = [name for name in REQUIRED_APPS if not apps.is_installed(name)]
    return [Error(
        f"The orchestrator needs {name!r} in INSTALLED_APPS (for {REQUIRED_APPS[name]}).",
        hint=f"Add {', '.join(repr(m) for m in missing)} to INSTALLED_APPS.",
        id="orchestrator.E006",
    ) for name in missing]


@register(Tags.compatibility)
def check_configuration(app_configs=None, **kwargs):
    problems = [Error(message, hint="See the settings table of the README.", id="orchestrator.E007")
                for message in conf.problems()]
    if problems:
        return problems
    package = app_settings.WORKFLOWS_PACKAGE
    for name in ([package] if package else []) + app_settings.WORKFLOW_MODULES:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            problems.append(Error(
                f"The workflow module {name!r} cannot be found.",
                hint="Make it importable (on the Python path), or correct ORCHESTRATOR_WORKFLOWS_PACKAGE / "
                     "ORCHESTRATOR_WORKFLOW_MODULES.",
                id="orchestrator.E003",
            ))
    if app_settings.LOG_STORAGE == conf.FILE_STORAGE:
        location = app_settings.LOG_STORAGE_OPTIONS.get("location") or str(app_settings.DATA_DIR)
        probe = os.path.abspath(location)
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        if not os.access(probe, os.W_OK):
            problems.append(Error(
                f"The task log folder {location} is not writable.",
                hint="Point ORCHESTRATOR_DATA_DIR (or ORCHESTRATOR_LOG_STORAGE_OPTIONS) at a writable folder.",
                id="orchestrator.E004",
            ))
    problems += _listen_problems()
    if app_settings.HEARTBEAT_TIMEOUT_SECONDS <= 2 * app_settings.HEARTBEAT_SECONDS:
        problems.append(Warning(
            "ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS is at most twice the heartbeat interval: "
            "healthy workers may be reaped.",
            id="orchestrator.W001",
        ))
    return problems


def _listen_problems() -> list:
    """A LISTEN URL that cannot be used, or a pooled database whose psycopg connections would
    prepare statements a pooler in transaction mode loses (PgBouncer before 1.21)."""


    found = []
    try:
        listen_params()
    except ImproperlyConfigured as exc:
        found.append(Error(str(exc), hint="Set it to the direct postgres:// URL of the database, or to \"poll\".",
                           id="orchestrator.E010"))
    database = connections["default"].settings_dict
    if is_transaction_pooled(database) and (database.get("OPTIONS") or {}).get("prepare_threshold") is not None:
        found.append(Warning(
            "The default database is behind a transaction pooler (DISABLE_SERVER_SIDE_CURSORS) and its psycopg "
            "connections prepare statements (OPTIONS prepare_threshold): a pooler that does not track them "
            "(PgBouncer before 1.21, or max_prepared_statements = 0) fails with 'prepared statement does not exist'.",
            hint="Remove prepare_threshold from OPTIONS (Django's default is None), or set PgBouncer's "
                 "max_prepared_statements.",
            id="orchestrator.W002",
        ))
    return found


@register(Tags.security)
def check_secrets(app_configs=None, **kwargs):
    """In production webhook calls are signed with a secret of their own, never the SECRET_KEY
    (which signs sessions and password resets: a webhook receiver must not hold it)."""
    if conf.problems():
        return []  # reported by check_configuration
    secret = app_settings.WEBHOOK_SECRET
    if not secret and not settings.DEBUG:
        return [Error(
            "ORCHESTRATOR_WEBHOOK_SECRET is not set and DEBUG is off: webhook calls would be unsigned.",
            hint="Set it to a long random string of its own, not the SECRET_KEY: export "
                 "ORCHESTRATOR_WEBHOOK_SECRET=\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')\"",
            id="orchestrator.E008",
        )]
    try:
        secret_key = settings.SECRET_KEY
    except ImproperlyConfigured:  # empty: reported by the project
        secret_key = ""
    if secret and secret == secret_key:
        return [Error(
            "ORCHESTRATOR_WEBHOOK_SECRET is the SECRET_KEY: every webhook receiver would hold the key "
            "that signs this site's sessions.",
            hint="Give ORCHESTRATOR_WEBHOOK_SECRET a random value of its own.",
            id="orchestrator.E009",
        )]
    return []


@register(Tags.security)
def check_secrets_store(app_configs=None, **kwargs):
    """The keys of the secrets store are Fernet keys, and a store that holds values has a key:
    without one no task could read them (a clear error at start, not a failed task later)."""
    if conf.problems():
        return []  # reported by check_configuration
    problems = [Error(problem, hint="Make a key with manage.py rotate_secrets_key --new-key.", id="orchestrator.E014")
                for problem in secretstore.key_problems()]
    try:
        secretstore.backends()
    except secretstore.SecretError as exc:
        problems.append(Error(str(exc), hint="Name database, env, files or the dotted path of a SecretBackend class.",
                              id="orchestrator.E014"))
    if problems or app_settings.SECRETS_KEYS or "database" not in app_settings.SECRETS_BACKENDS:
        return problems
    try:
        stored = secretstore.Secret.objects.exists()
    except DatabaseError:  # no database yet, or not migrated: nothing is stored
        return []
    if stored:
        return [Error(
            "The secrets store holds values but ORCHESTRATOR_SECRETS_KEYS is not set: no task can read them.",
            hint="Set ORCHESTRATOR_SECRETS_KEYS to the key(s) they were stored with, newest first.",
            id="orchestrator.E014",
        )]
    return []


@register(Tags.compatibility)
def check_tracing(app_configs=None, **kwargs):
    """The OTEL_* variables ask for traces, but the SDK is not installed (the [otel] extra)."""
    if not tracing.configured():
        return []
    try:
        if importlib.util.find_spec("opentelemetry.sdk") is not None:
            return []
    except ImportError:  # not even the opentelemetry namespace is there
        pass
    return [Warning(
        "The OTEL_* environment variables ask for traces, but the OpenTelemetry SDK is not installed: "
        "runs are not traced.",
        hint="pip install 'django-dag-orchestrator[otel]', or unset OTEL_TRACES_EXPORTER and "
             "OTEL_EXPORTER_OTLP_ENDPOINT.",
        id="orchestrator.W003",
    )]
