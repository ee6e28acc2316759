"""What a launcher (``manage.py up``, ``manage.py deploy_local``) makes sure of before it starts
any role, so that a start fails once, at once, with everything to fix, instead of roles failing
one setting at a time and being restarted into the same error:

* the configuration: every system check, and the deployment checks that refuse to serve (the
  web server's host names), reported together, each with its hint;
* the address the web server is to listen on is free (a server left running there would
  answer in its place);
* with DEBUG off, the collected static files match the project's: collected again when the
  manifest is missing or older than a static file, since pages name their files by the
  manifest's fingerprinted names.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import ManifestFilesMixin, staticfiles_storage
from django.core import checks
from django.core.checks.registry import registry
from django.core.management import call_command
from django.core.management.base import CommandError

from orchestrator.management.roles import CONFIG_ERROR

# collectstatic's default ignore patterns: what it does not collect is not missing.
IGNORED = ["CVS", ".*", "*~"]


def require_configured(launcher: str, production_advice: str = "") -> list[checks.CheckMessage]:
    """Raise one CommandError (exit code CONFIG_ERROR) listing every error of the system checks
    and every error of the deployment checks; returns the warnings, for the launcher to show.

    The deployment checks' warnings (HSTS, secure cookies) are left to ``check --deploy``: only
    what would stop a role (a web server without host names refuses every request) is an error.
    ``production_advice`` ends the message when DEBUG is off (e.g. how to start for development)."""
    messages = _check_messages()
    errors = [m for m in messages if m.is_serious()]
    if errors:
        raise CommandError(_refusal(launcher, errors, production_advice), returncode=CONFIG_ERROR)
    return [m for m in messages if not m.is_serious()]


def _check_messages() -> list[checks.CheckMessage]:
    """The system checks' messages and the deployment checks' errors, silenced ones left out."""
    messages = [m for m in checks.run_checks() if not m.is_silenced()]
    for check in registry.get_checks(include_deployment_checks=True):
        if check in registry.deployment_checks:
            messages += [m for m in check(app_configs=None, databases=None) if m.is_serious() and not m.is_silenced()]
    return messages


def _refusal(launcher: str, errors: list[checks.CheckMessage], production_advice: str) -> str:
    mode = " (DEBUG is off: this is a production start)" if not settings.DEBUG else ""
    lines = [f"{launcher} started nothing: {len(errors)} problem(s) of the configuration to fix first{mode}:"]
    for error in errors:
        lines.append(f"  {error.id}: {error.msg}")
        if error.hint:
            lines.append(f"      {error.hint}")
    if production_advice and not settings.DEBUG:
        lines.append(production_advice)
    return "\n".join(lines)


def require_free_address(host: str, port: int, option: str) -> None:
    """Refuse to start when something already listens on host:port (with SO_REUSEADDR, as the
    web servers bind: a closed connection's TIME_WAIT does not count)."""
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): another server is listening there, "
            f"perhaps one started earlier and still running. Stop it, or choose another address with {option}.",
            returncode=CONFIG_ERROR) from None


def bind_address(bind: str) -> tuple[str, int] | None:
    """(host, port) of a gunicorn ``--bind`` value; None for a Unix socket or a file descriptor."""
    if bind.startswith(("unix:", "fd://")):
        return None
    host, _, port = bind.rpartition(":")
    if not port.isdigit():
        return None
    return host or "0.0.0.0", int(port)


def static_files_outdated(storage=staticfiles_storage) -> str | None:
    """Why the collected static files do not match the project's, or None when they do (or when
    the storage is not a folder of this machine: collecting there is a deployment step)."""
    try:
        root = Path(storage.path(""))
    except NotImplementedError:
        return None
    manifest = root / storage.manifest_name if isinstance(storage, ManifestFilesMixin) else None
    if manifest is not None:
        try:
            collected_at = manifest.stat().st_mtime
            collected = set(json.loads(manifest.read_text())["paths"])
        except (OSError, ValueError, KeyError, TypeError):
            return f"there is no manifest of collected static files in {root}"
    for finder in finders.get_finders():
        for path, source in finder.list(IGNORED):
            prefix = getattr(source, "prefix", None)
            name = os.path.join(prefix, path) if prefix else path
            changed_at = os.stat(source.path(path)).st_mtime
            if manifest is None:
                target = root / name
                collected_at = target.stat().st_mtime if target.exists() else None
                if collected_at is None:
                    return f"{name} is not collected in {root}"
            elif name not in collected:
                return f"{name} is not in the manifest of {root}"
            if changed_at > collected_at:
                return f"{name} changed after it was collected in {root}"
    return None


def collect_static_files(say: Callable[[str], None]) -> None:
    """With DEBUG off, run collectstatic when the collected files are outdated (with DEBUG on the
    pages are served from the apps' own folders)."""
    if settings.DEBUG:
        return
    reason = static_files_outdated()
    if reason is None:
        return
    say(f"collecting the static files: {reason}")
    call_command("collectstatic", interactive=False, verbosity=0)
