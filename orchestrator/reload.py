"""Code reloading: a running worker's children run the project's code as it is on disk now.

A worker forks its children ahead and reuses them, so a child keeps the code it once imported.
Children are replaced, never the worker: after each ``sync_workflows`` (the *code generation*
below), after ``--max-tasks-per-child`` tasks, and whenever one dies or is killed. What a fresh
child runs:

* **Workflow modules**: imported in the child when one of its tasks first runs there, never in
  the worker itself, so a fresh child imports the file on disk.
* **Job modules** (``ORCHESTRATOR_JOB_MODULES``, each installed app's ``jobs`` and ``tasks``
  modules): imported by the worker at start-up and inherited by its children through the fork.
  When any project module the worker imported has changed on disk since it started, a fresh
  child imports every job module again (its ``@job`` and ``@task`` functions are registered
  anew). A job module that now fails to import is logged (module, first line of the error) and
  its functions as the worker started with stay registered; the other modules reload. An import
  stuck past ``ORCHESTRATOR_SYNC_IMPORT_TIMEOUT`` fails the same way.
* **Helper modules**: a project module (anything not installed in the Python environment, and
  not the orchestrator itself) the worker imported whose source file changed since it started is
  forgotten in a fresh child, so the job and workflow modules that import it read the new file.
  A module that did not change keeps what it bound at start-up, except the job modules above.
* **Not picked up** (the worker must restart): modules that define models or app configs, the
  ``admin``, ``apps``, ``models`` and ``migrations`` modules, the settings module, installed
  packages (``pip install``), and the orchestrator's own code. The worker logs the ones that
  changed when it sees a new generation.

The generation is a counter row in the database: every sync bumps it in its transaction and
NOTIFYs ``orchestrator_code``; a worker also reads it with each heartbeat, so one that missed the
NOTIFY (a LISTEN reconnect, polling behind a pooler) still notices within a heartbeat.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import site
import sys
import sysconfig

from django.apps import apps
from django.conf import settings
from django.db import connection

from orchestrator import channels, registry
from orchestrator.conf import app_settings

log = logging.getLogger(__name__)

# --- SQL ---------------------------------------------------------------------------------------

# One row, bumped by every sync (the migration inserts it; the upsert makes it should it be gone).
BUMP = """
INSERT INTO orchestrator_codegeneration (id, generation, changed_at) VALUES (1, 1, now())
ON CONFLICT (id) DO UPDATE SET generation = orchestrator_codegeneration.generation + 1, changed_at = now()
RETURNING generation
"""

# The current generation (0 before the first sync), as a subquery the worker's statements embed.
CURRENT = "COALESCE((SELECT generation FROM orchestrator_codegeneration WHERE id = 1), 0)"


def bump() -> int:
    """A sync completed: a new code generation, announced when the caller's transaction commits."""
    with connection.cursor() as cursor:
        cursor.execute(BUMP)
        generation = cursor.fetchone()[0]
    channels.announce_code(generation)
    return generation


def current() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {CURRENT}")
        return cursor.fetchone()[0]


# --- what the worker imported, and what changed since ------------------------------------------

# Module name -> (source file, (mtime_ns, size)) of the project modules the worker had imported
# when it started (taken before the first fork, so every child inherits it).
_baseline: dict[str, tuple[str, tuple[int, int]]] = {}
# Of those, the ones a fresh child never reads anew (see the module's docstring).
_pinned: set[str] = set()

PINNED_NAMES = ("admin", "apps", "models", "migrations")


def _installed_dirs() -> tuple[str, ...]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values()}
    try:
        paths.update(site.getsitepackages())
        paths.add(site.getusersitepackages())
    except AttributeError:  # pragma: no cover - a virtualenv without these
        pass
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths if p)


def _source(module, folders: dict[str, str]) -> str | None:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    folder, name = os.path.split(path)
    if folder not in folders:  # a thousand modules live in a few dozen folders
        folders[folder] = os.path.realpath(folder)
    return os.path.join(folders[folder], name)


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _pinned_modules() -> set[str]:
    """Modules whose objects Django holds in its registries: reading them anew would give a
    second copy of a model or app config beside the one every other module uses."""

    pinned = {settings.SETTINGS_MODULE} if settings.SETTINGS_MODULE else set()
    for config in apps.get_app_configs():
        pinned.update({config.name, type(config).__module__})
    pinned.update(model.__module__ for model in apps.get_models(include_auto_created=True))
    return pinned


def snapshot() -> None:
    """In the worker, before its first fork: the project modules imported so far and their files."""
    installed = _installed_dirs()
    own = __name__.partition(".")[0]
    pinned = _pinned_modules()
    _baseline.clear()
    _pinned.clear()
    folders: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        path = _source(module, folders)
        if path is None or path.startswith(installed) or name.partition(".")[0] == own:
            continue
        stamp = _stamp(path)
        if stamp is None:
            continue
        _baseline[name] = (path, stamp)
        if name in pinned or set(name.split(".")) & set(PINNED_NAMES):
            _pinned.add(name)


def changed() -> list[str]:
    """The project modules the worker imported whose source file changed since it started."""
    return [name for name, (path, stamp) in _baseline.items() if _stamp(path) != stamp]


def needing_restart() -> list[str]:
    """Changed modules a fresh child does not read anew (models, settings, ...)."""
    return [name for name in changed() if name in _pinned]


# --- in a fresh child --------------------------------------------------------------------------


def forget(name: str):
    """Drop a module from sys.modules (and from its package's attributes, or ``from package import
    name`` would still find it there); returns it."""
    module = sys.modules.pop(name, None)
    package, _, attribute = name.rpartition(".")
    if package and module is not None and getattr(sys.modules.get(package), attribute, None) is module:
        delattr(sys.modules[package], attribute)
    return module


def _put_back(name: str, module) -> None:
    sys.modules[name] = module
    package, _, attribute = name.rpartition(".")
    if package and package in sys.modules:
        setattr(sys.modules[package], attribute, module)


def refresh() -> list[str]:
    """In a fresh child, before its first task: when project code changed on disk since the
    worker started, forget the changed modules and import the job modules again. Returns the job
    modules that failed to import (each logged; its functions as before stay registered)."""
    stale = [name for name in changed() if name not in _pinned]
    if not stale:
        return []
    importlib.invalidate_caches()
    own = __name__.partition(".")[0]
    job_modules = [name for name in registry.job_modules
                   if name in sys.modules and name not in _pinned and name.partition(".")[0] != own]
    saved = {name: registry.registered_in(name) for name in job_modules}
    old = {name: forget(name) for name in dict.fromkeys([*stale, *job_modules])}
    for name in job_modules:
        registry.forget_module(name)
    failed = []
    for name in job_modules:
        if name in sys.modules:  # imported already by an earlier job module
            continue
        try:
            with _time_limit(app_settings.SYNC_IMPORT_TIMEOUT, name):
                importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - whatever the module raises, the child keeps running
            failed.append(name)
            registry.forget_module(name)
            registry.restore(saved[name])
            _put_back(name, old[name])
            log.error("job module %s could not be imported again (%s): its functions as the worker started "
                      "with stay registered", name, _first_line(exc),
                      extra={"action": "job_module_reload_failed", "job_module": name})
    log.info("imported %d job module(s) again after changes on disk to %s", len(job_modules) - len(failed),
             ", ".join(sorted(stale)[:10]) + (", ..." if len(stale) > 10 else ""),
             extra={"action": "job_modules_reloaded"})
    return failed


@contextlib.contextmanager
def _time_limit(seconds: float, name: str):
    """An import stuck for longer than sync allows one fails, rather than the child hanging with
    the tasks the worker sends it. The child is single-threaded: SIGALRM interrupts the import."""
    def expired(signum, frame):
        raise TimeoutError(f"importing {name} took longer than {seconds:g}s (ORCHESTRATOR_SYNC_IMPORT_TIMEOUT)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}, line {exc.lineno})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
