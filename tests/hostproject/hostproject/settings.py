"""A small shop's settings, as `django-admin startproject` makes them, plus the orchestrator."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SECRET_KEY", "the-shop's-own-development-key")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "shop",
    # --- README: Add it to an existing Django project (INSTALLED_APPS)
    "django.contrib.postgres",
    "django_htmx",
    "rest_framework",
    "knox",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "orchestrator",
    # --- end
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "hostproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The shop's own database, named by the test that runs this project.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["SHOP_DB_NAME"],
        "USER": os.environ.get("SHOP_DB_USER", ""),
        "PASSWORD": os.environ.get("SHOP_DB_PASSWORD", ""),
        "HOST": os.environ.get("SHOP_DB_HOST", ""),
        "PORT": os.environ.get("SHOP_DB_PORT", ""),
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "Europe/Berlin"
STATIC_URL = "static/"
STATIC_ROOT = os.environ.get("SHOP_STATIC_ROOT", str(BASE_DIR / "staticfiles"))

# --- README: Add it to an existing Django project (TASKS)
TASKS = {"default": {"BACKEND": "orchestrator.tasks_backend.OrchestratorBackend"}}
# --- end

# Task logs in a folder of the test's own (every ORCHESTRATOR_* setting is optional).
ORCHESTRATOR_DATA_DIR = os.environ.get("SHOP_DATA_DIR", str(BASE_DIR / ".data"))
