"""Discovery: each workflow module imported in a child process of its own, its workflows sent
back as plain data.

Sync imports code it trusts but cannot vouch for: a module may raise, spin the CPU
(``while True: pass``), wait forever or end its process. So each module is imported in a fork of
the syncing process, several at once, and each child has its own budget,
``ORCHESTRATOR_SYNC_IMPORT_TIMEOUT`` from its own start: a child past it is killed (with its
process group, so what the module started goes too), reported as that module's error, and holds
no other module's import for longer than its own. The syncing process never imports a workflow
module itself.

What a child sends back is data, never code: for each workflow it found, its name, the checks'
messages (``orchestrator.validation``), and, when it is valid, the graph spec, the workflow's
options and its schedules, as JSON (one line of it on a pipe). Sync stores that; a worker
imports the module of a task it runs, as always (``orchestrator.registry.load_for_worker``), so
nothing a child did lives on anywhere but in the database.

While children run longer than a few seconds, ``notice`` (the console of ``sync_workflows`` and
``./dev run``) hears which module is slow, and then that it was stopped at the limit.

Cost: a fork per module and the module's own import, run in parallel. Measured on the demo
``workflows/`` (five modules with the package) on a loaded two-core machine: about 0.06 s more
CPU time than importing them all in this process (0.11 s against 0.05 s), the pages of the
parent shared until written. A fork in a process that runs threads could inherit a lock held by
one of them; the child would then hang on it, and its budget ends it like any stuck import.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import pkgutil
import selectors
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from asgiref.local import Local
from django.apps import apps
from django.db import connections
from django.utils.module_loading import module_has_submodule

from orchestrator import dsl, limits, reload
from orchestrator.conf import app_settings
from orchestrator.supervisor import die_with_parent
from orchestrator.validation import dataset_links, schedule_name, validate

# Children importing at once: a stuck module holds one of these places for its budget, the other
# modules go on in the others (at least four, so that two or three stuck modules hold up nothing).
PARALLEL = min(8, max(4, os.cpu_count() or 1))
# How often the console hears of a module still importing (after it took this long).
NOTICE_EVERY = 5.0


@dataclass
class Definition:
    """A workflow as its module's import described it: plain data, no code."""

    key: str  # how reports name it
    name: str | None  # None when the name is not text (never stored)
    module: str  # the module that created it (Workflow.module)
    errors: list[str] = field(default_factory=list)
    spec: dict | None = None  # the graph, when valid
    fields: dict = field(default_factory=dict)  # description, tags, owner, tenant, ...
    schedules: list[tuple[str, dict]] = field(default_factory=list)  # (schedule name, values)
    produces: list[str] = field(default_factory=list)
    consumes: list[str] = field(default_factory=list)


@dataclass
class Discovery:
    found: dict[str, list[Definition]] = field(default_factory=dict)  # module -> its workflows
    failed: dict[str, str] = field(default_factory=dict)  # module -> error
    files: dict[str, str] = field(default_factory=dict)  # module -> its file, as shown to people
    seconds: dict[str, float] = field(default_factory=dict)  # module -> how long its child took


def storable(text: str) -> str:
    """Text as PostgreSQL and a terminal can take it: NUL and unpaired surrogates escaped."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def import_error(exc: BaseException) -> str:
    return storable(f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)[-3:]))


def report_key(name) -> str:
    """How the report names a workflow: its name, or the name quoted when it is not plain text."""
    return name if isinstance(name, str) and limits.text_error(name, "") is None else limits.safe_repr(name)


# --- which modules ------------------------------------------------------------------------------


def workflow_modules() -> list[str]:
    """The ``workflows`` module of every installed app, found the way the admin finds
    ``admin.py`` (when it is a package, each of its modules is imported too)."""
    return [f"{config.name}.workflows" for config in apps.get_app_configs()
            if module_has_submodule(config.module, "workflows")]


def _queue() -> list[tuple[str, bool]]:
    """The modules to import, in order, each with whether its submodules are imported too: the
    apps' workflows packages, the configured package, the configured modules."""
    queue = [(name, True) for name in workflow_modules()]
    if app_settings.WORKFLOWS_PACKAGE:
        queue.append((app_settings.WORKFLOWS_PACKAGE, True))
    return queue + [(name, False) for name in app_settings.WORKFLOW_MODULES]


def _submodules(module) -> list[str]:
    """A package's own modules, not starting with ``_``, in name order."""
    return sorted(f"{module.__name__}.{info.name}" for info in pkgutil.iter_modules(module.__path__)
                  if not info.name.startswith("_"))


def _folder_queue(directory: Path, package: str) -> list[tuple[str, bool]]:
    directory = Path(directory)
    parts = package.split(".")
    # The folder that holds the package's top (tests/e2e/workflows as tests.e2e.workflows: the
    # folder above tests), put last on the path: the children inherit it, and so do the workers'
    # imports here, and it never hides a module of the project's own (``workflows`` above all).
    top = directory.parents[len(parts) - 1] if directory.parts[-len(parts):] == tuple(parts) else directory.parent
    if str(top) not in sys.path:
        sys.path.append(str(top))
    return [(f"{package}.{path.stem}", False) for path in sorted(directory.glob("*.py"))
            if not path.name.startswith("_")]


def discover(directory: Path | None = None, package: str | None = None):
    """({module: [Definition]}, {module: import error}): see discover_all()."""
    found = discover_all(directory, package)
    return found.found, found.failed


def discover_all(directory: Path | None = None, package: str | None = None,
                 notice: Callable[[str], None] | None = None) -> Discovery:
    """Import the workflow modules, each in a child process. With ``directory`` and ``package``
    (tools and tests), only the modules of that folder, imported as that package; otherwise the
    apps' ``workflows`` modules and the modules the settings name."""
    importlib.invalidate_caches()
    queue = _folder_queue(directory, package) if directory is not None and package is not None else _queue()
    result = _Imports(notice or (lambda message: None)).run(queue)
    # A module that imports another workflow module created that one's workflows too: each
    # belongs to the module that defines it, which was imported on its own.
    for name, definitions in result.found.items():
        result.found[name] = [d for d in definitions if d.module == name or d.module not in result.found]
    return result


# --- in the child -------------------------------------------------------------------------------

# The parent's database connections, which the child must neither use nor close (closing one
# would end the parent's session): kept referenced here until the child exits with os._exit().
_inherited: list = []


def _describe(wf) -> dict:
    """A workflow as plain data: its checks' messages and, when valid, what sync stores."""
    try:
        messages = [str(error) for error in validate(wf)]
    except Exception as exc:  # noqa: BLE001 - a user value that breaks a check breaks its workflow only
        messages = [f"workflow {limits.safe_repr(wf.name)} could not be checked: {type(exc).__name__}: {exc}"]
    described = {"key": report_key(wf.name), "name": wf.name if isinstance(wf.name, str) else None,
                 "module": wf.module if isinstance(wf.module, str) else "", "errors": messages}
    if isinstance(wf.name, str):
        described["produces"], described["consumes"] = dataset_links(wf)
    if messages:
        return described
    described["spec"] = wf.to_spec()
    described["fields"] = {"description": wf.description, "tags": wf.tags, "owner": wf.owner, "tenant": wf.tenant,
                           "max_active_runs": wf.max_active_runs, "webhooks": wf.webhooks}
    described["schedules"] = [(schedule_name(wf, index), {
        "cron": " ".join(schedule.cron.split()), "timezone": schedule.timezone, "catchup": schedule.catchup,
        "max_catchup": schedule.max_catchup, "overlap": schedule.overlap,
        "start_deadline": schedule.start_deadline, "jitter": schedule.jitter, "params": schedule.params,
    }) for index, schedule in enumerate(wf.schedules)]
    try:
        json.dumps(described, allow_nan=False)
    except (TypeError, ValueError) as exc:  # what the checks let through but JSON cannot carry
        return {**{key: described[key] for key in ("key", "name", "module")},
                "errors": [f"workflow {limits.safe_repr(wf.name)} cannot be written down: {exc}"]}
    return described


def _import_here(name: str, expand: bool, send: Callable[[dict], None]) -> dict:
    package = name.rpartition(".")[0]
    if package:
        importlib.import_module(package)  # outside collect(): a package's workflows are its own module's
    reload.forget(name)  # imported before the fork (a test, a helper): its code runs again here
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    send({"file": spec.origin if spec.has_location else None})
    imported = []
    workflows = dsl.collect(lambda: imported.append(importlib.import_module(name)))
    module = imported[0]
    submodules = _submodules(module) if expand and hasattr(module, "__path__") else []
    return {"workflows": [_described(wf) for wf in workflows], "submodules": submodules}


def _described(wf) -> dict:
    try:
        return _describe(wf)
    except Exception as exc:  # noqa: BLE001 - a user value that breaks the description breaks its workflow only
        name = getattr(wf, "name", None)
        return {"key": report_key(name), "name": name if isinstance(name, str) else None, "module": "",
                "errors": [f"workflow {limits.safe_repr(getattr(wf, 'name', None))} could not be written down: "
                           f"{type(exc).__name__}: {exc}"]}


def _child(name: str, expand: bool, fd: int, parent: int) -> None:
    """The child's whole life: import, send, exit (never returns; never runs the parent's atexit)."""
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides, and stops its children
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        die_with_parent(parent)
        _inherited.append(connections._connections)
        connections._connections = Local(connections.thread_critical)

        def send(message: dict) -> None:
            data = (json.dumps(message, allow_nan=False) + "\n").encode()
            while data:
                data = data[os.write(fd, data):]

        try:
            outcome = _import_here(name, expand, send)
        except BaseException as exc:  # noqa: BLE001 - anything the module's code raises is its error
            outcome = {"error": import_error(exc)}
        send(outcome)
        with contextlib.suppress(Exception):
            connections.close_all()  # the child's own, if the module queried the database
    except BaseException:  # noqa: BLE001 - the parent reports a child that sent nothing
        code = 70
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# --- in the parent ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Running:
    name: str
    expand: bool
    pid: int
    fd: int
    started: float
    noticed: float
    data: bytearray = field(default_factory=bytearray)


def _shown(path: str | None, name: str) -> str:
    if not path:
        return name
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


class _Imports:
    """The parent's side: start children (PARALLEL at a time), read what they send, kill those
    past their budget, say which are slow."""

    def __init__(self, notice: Callable[[str], None]):
        self.notice = notice
        self.timeout = float(app_settings.SYNC_IMPORT_TIMEOUT)
        self.result = Discovery()
        self.outcomes: dict[str, dict] = {}
        self.selector = selectors.DefaultSelector()
        self.running: dict[int, _Running] = {}  # fd -> child

    def run(self, queue: list[tuple[str, bool]]) -> Discovery:
        pending = list(queue)
        order: list[str] = []
        try:
            while pending or self.running:
                while pending and len(self.running) < PARALLEL:
                    name, expand = pending.pop(0)
                    if name not in order:
                        order.append(name)
                        self._start(name, expand)
                for child in self._wait():
                    submodules = self._finish(child)
                    # A package's modules come right after it, before the rest of the queue.
                    pending[:0] = [(sub, False) for sub in submodules if sub not in order]
        finally:
            for child in list(self.running.values()):
                self._kill(child)
            self.selector.close()
        for name in order:
            outcome = self.outcomes[name]
            if "error" in outcome:
                self.result.failed[name] = outcome["error"]
            else:
                self.result.found[name] = [Definition(**{**described, "schedules": [
                    tuple(pair) for pair in described.get("schedules", [])]}) for described in outcome["workflows"]]
        return self.result

    def _start(self, name: str, expand: bool) -> None:
        read, write = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write the parent's buffered text again
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _child(name, expand, write, parent)
        os.close(write)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the child does: whichever runs first
        os.set_blocking(read, False)
        now = time.monotonic()
        child = _Running(name, expand, pid, read, now, now)
        self.running[read] = child
        self.selector.register(read, selectors.EVENT_READ, child)

    def _wait(self) -> list[_Running]:
        """The children that ended (their pipe closed) or ran out of time, after one wait."""
        now = time.monotonic()
        wake = min(min(c.started + self.timeout, c.noticed + NOTICE_EVERY) for c in self.running.values())
        ended = []
        for key, _ in self.selector.select(max(0.0, wake - now)):
            child = key.data
            try:
                chunk = os.read(child.fd, 65536)
            except BlockingIOError:
                continue
            if chunk:
                child.data += chunk
                self._header(child)
            else:
                ended.append(child)
        now = time.monotonic()
        for child in list(self.running.values()):
            if child in ended:
                continue
            if now - child.started >= self.timeout:
                self._kill(child)
                self.notice(f"stopped importing {self._file(child)} at the {self.timeout:g} s limit "
                            "(ORCHESTRATOR_SYNC_IMPORT_TIMEOUT); the other modules go on")
                self.outcomes[child.name] = {"error": (
                    f"TimeoutError: importing {child.name} took longer than {self.timeout:g}s "
                    "(ORCHESTRATOR_SYNC_IMPORT_TIMEOUT); sync stopped it and went on")}
                ended.append(child)
            elif now - child.noticed >= NOTICE_EVERY:
                child.noticed = now
                self.notice(f"still importing {self._file(child)} ({now - child.started:.0f} s)")
        return ended

    def _header(self, child: _Running) -> None:
        if child.name in self.result.files or b"\n" not in child.data:
            return
        line = bytes(child.data).split(b"\n", 1)[0]
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict) and "file" in message:
                self.result.files[child.name] = _shown(message["file"], child.name)

    def _file(self, child: _Running) -> str:
        return self.result.files.get(child.name, child.name)

    def _finish(self, child: _Running) -> list[str]:
        """Reap a child and record its outcome; returns the package's modules to import next."""
        if child.name in self.outcomes:  # killed at the limit, and reaped
            return []
        self._close(child)
        _, status = os.waitpid(child.pid, 0)
        self.result.seconds[child.name] = time.monotonic() - child.started
        lines = [line for line in bytes(child.data).split(b"\n") if line.strip()]
        outcome = None
        with contextlib.suppress(ValueError, IndexError):
            outcome = json.loads(lines[-1])
        if not isinstance(outcome, dict) or not ("error" in outcome or "workflows" in outcome):
            outcome = {"error": f"importing {child.name} ended its process ({_ended(status)}) "
                                "before it reported anything"}
        self.outcomes[child.name] = outcome
        return outcome.get("submodules", []) if child.expand else []

    def _kill(self, child: _Running) -> None:
        for kill in (lambda: os.killpg(child.pid, signal.SIGKILL), lambda: os.kill(child.pid, signal.SIGKILL)):
            with contextlib.suppress(OSError):
                kill()
                break
        if child.fd in self.running:
            self._close(child)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, 0)
        self.result.seconds[child.name] = time.monotonic() - child.started

    def _close(self, child: _Running) -> None:
        self.selector.unregister(child.fd)
        os.close(child.fd)
        del self.running[child.fd]


def _ended(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
