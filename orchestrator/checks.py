"""System checks: misconfiguration is reported with what is wrong and how to fix it."""

import os

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured


@register(Tags.compatibility, deploy=False)
def check_configuration(app_configs=None, **kwargs):
    problems = []
    if settings.DATABASE_CONFIG_ERROR:
        problems.append(Error(
            f"DATABASE_URL is invalid: {settings.DATABASE_CONFIG_ERROR}",
            hint="Use postgres://USER:PASSWORD@HOST:PORT/NAME, or unset it to use the embedded PostgreSQL.",
            id="orchestrator.E001",
        ))
    try:
        secret_key = settings.SECRET_KEY
    except ImproperlyConfigured:  # Django refuses to hand out an empty key
        secret_key = ""
    if not secret_key:
        problems.append(Error(
            "SECRET_KEY is not set and DEBUG is off: refusing to start without a secret key.",
            hint="Set the SECRET_KEY environment variable to a long random string "
                 "(python -c 'import secrets; print(secrets.token_urlsafe(50))').",
            id="orchestrator.E002",
        ))
    if not settings.WORKFLOWS_DIR.is_dir():
        problems.append(Error(
            f"The workflows folder {settings.WORKFLOWS_DIR} does not exist.",
            hint="Create it, or point ORCHESTRATOR_WORKFLOWS_DIR at the folder that holds your workflow modules.",
            id="orchestrator.E003",
        ))
    data_dir = settings.DATA_DIR
    probe = data_dir if data_dir.exists() else data_dir.parent
    if not os.access(probe, os.W_OK):
        problems.append(Error(
            f"The data folder {data_dir} is not writable.",
            hint="Point ORCHESTRATOR_DATA_DIR at a writable folder; logs are stored there.",
            id="orchestrator.E004",
        ))
    options = settings.ORCHESTRATOR
    if options["HEARTBEAT_TIMEOUT_SECONDS"] <= 2 * options["HEARTBEAT_SECONDS"]:
        problems.append(Warning(
            "ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS is at most twice the heartbeat interval: "
            "healthy workers may be reaped.",
            id="orchestrator.W001",
        ))
    return problems


# A deployment check: only the web server answers requests, so the scheduler, dispatcher and
# workers start with DATABASE_URL and SECRET_KEY alone. wsgi.py runs deployment checks.
@register(Tags.security, deploy=True)
def check_web_hosts(app_configs=None, **kwargs):
    if not settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [Error(
            "ALLOWED_HOSTS is empty and DEBUG is off: every request would be refused.",
            hint="Set ALLOWED_HOSTS to a comma-separated list of the host names the web server answers to.",
            id="orchestrator.E005",
        )]
    return []
