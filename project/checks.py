"""The standalone project's system checks: its environment variables, reported with what to set."""

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.exceptions import ImproperlyConfigured


@register(Tags.compatibility, deploy=False)
def check_environment(app_configs=None, **kwargs):
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
            hint="Set it to a long random string, the same for every process: "
                 "export SECRET_KEY=\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')\"",
            id="orchestrator.E002",
        ))
    return problems


# A deployment check: only the web server answers requests, so the scheduler, dispatcher and
# workers start with DATABASE_URL and SECRET_KEY alone. wsgi.py runs deployment checks.
@register(Tags.security, deploy=True)
def check_web_hosts(app_configs=None, **kwargs):
    if not settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [Error(
            "ALLOWED_HOSTS is empty and DEBUG is off: every request would be refused.",
            hint="Set it to the host names the web server answers to, comma-separated: "
                 "export ALLOWED_HOSTS=localhost,127.0.0.1",
            id="orchestrator.E005",
        )]
    return []
