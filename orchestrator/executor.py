"""What a worker's child process does: run one task run's attempt and report its outcome.

Children are forked by the worker after Django is set up and live for many tasks. A child is its
own process group (a SIGTERM to the worker's group reaches the worker only, so a draining
worker's tasks keep running) and dies with its parent (PR_SET_PDEATHSIG), so a task never
outlives a crashed worker and runs beside its retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import inspect
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from datetime import datetime

from django.db import close_old_connections, connections

from orchestrator import logformat, logs, registry, reload, results, secrets, secretstore, tracing
from orchestrator.conf import app_settings
from orchestrator.definition import Task as DslTask
from orchestrator.masking import MaskedStream
from orchestrator.states import AttemptOutcome
from orchestrator.taskcontext import TaskContext

PR_SET_PDEATHSIG = 1
READY = "ready"  # a fresh child's first message to the worker
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class AttemptLogFormatter(logging.Formatter):
    """LOG_FORMAT, and the trace and span of the attempt after each record when it is traced."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        trace_id = getattr(record, "trace_id", None)
        return f"{text} [trace_id={trace_id} span_id={getattr(record, 'span_id', '')}]" if trace_id else text


@functools.cache  # one per process: a formatter keeps no state between records
def log_formatter() -> logging.Formatter:
    """The format of ``logging`` records in an attempt's log: times in UTC whatever the project's
    TIME_ZONE, so the log view can show each line's time in the clock its reader chose."""
    formatter = AttemptLogFormatter(LOG_FORMAT)
    formatter.converter = time.gmtime
    return formatter


# Copies the bound fields (run, task, attempt) onto each record of an attempt's log; keeps no state.
CONTEXT_FILTER = logformat.ContextFilter()


class TaskFailure(Exception):
    """An attempt failed for a reason the product states itself. When an exception lies behind it
    (a return value JSON cannot hold, a module that cannot be imported), it is the cause
    (``raise TaskFailure(...) from exc``), and its class and traceback are recorded."""


class AttemptLost(TaskFailure):
    """The class recorded for an attempt whose worker went silent (no exception was seen)."""


class AttemptCancelled(TaskFailure):
    """The class recorded for an attempt whose task run was cancelled while it ran."""


def die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the worker's reaper still rescues the task
        pass


def child_setup(parent_pid: int) -> None:
    os.setpgid(0, 0)
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    signal.set_wakeup_fd(-1)  # the worker's wake-up socket is not the child's
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def reply(conn, outcome: tuple) -> None:
    """Send the worker an outcome, pickled as it is: ``Connection.send`` builds a pickler with the
    reducers of file descriptors and sockets for every message, and an outcome holds none."""
    conn.send_bytes(pickle.dumps(outcome, pickle.HIGHEST_PROTOCOL))


def child_main(conn, parent_pid: int, gate=None) -> None:
    """The child's loop: receive a task message, run it, send the outcome; never returns. A fresh
    child first reads anew the project code that changed on disk (``reload.refresh``). A batch
    (``{"batch": number, "jobs": [...]}``) is run in its order, each job only once ``gate`` (its
    ``worker.gate.Gate``) lets it begin, and each outcome sent as it comes."""
    code = 0
    try:
        child_setup(parent_pid)
        tracing.child_started()
        try:
            reload.refresh()
        except Exception:  # noqa: BLE001 - the child runs what is registered rather than not at all
            logging.getLogger(__name__).exception("could not read the changed code anew")
        conn.send(READY)  # the worker gives a child a task only once it is ready
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message is None:  # recycled or shutting down: leave the database cleanly
                with contextlib.suppress(Exception):
                    connections.close_all()
                break
            if "jobs" in message:
                for job in message["jobs"]:
                    if not gate.begin(message["batch"]):
                        break  # the worker took back the rest
                    reply(conn, run(job))
                    close_old_connections()
                continue
            reply(conn, run_checks(message) if "checks" in message else run(message))
            close_old_connections()  # a task that used the ORM must not leave a broken connection
    except BaseException:  # noqa: B036 - a child must never unwind into the worker's loop
        traceback.print_exc()
        code = 1
    finally:
        tracing.flush()
        os._exit(code)


def resolve(message: dict, declared: dict | None = None, functions: dict | None = None):
    """The registered object a Python task run names. A reference nothing registered is refused,
    however its row was written: a worker runs only the project's own code. ``declared``: the
    task's spec as its workflow declares it, when the caller holds the workflow itself (the local
    runner); otherwise it is read from the run's graph version. ``functions``: objects the caller
    holds itself, by reference (the local runner's workflow, possibly defined inside a test)."""
    ref = message["spec"].get("ref", "")
    if functions and ref in functions:
        return functions[ref]
    try:
        return registry.load_for_worker(ref, message["id"], declared=declared)
    except registry.NotRegistered as exc:
        raise TaskFailure(f"refused: {exc}") from exc


# A shell task's secrets and connections, by environment variable (orchestrator.secrets).
SECRET_ENV_KEYS = ("secret_env", "connection_env")


def check_shell(message: dict, declared: dict | None = None) -> None:
    """A shell command runs only as its workflow's graph version declares it (command and
    environment), as stored by sync from the project's code; any other row is refused."""
    spec = message["spec"]
    declared = (declared if declared is not None else registry.declared_task(message["id"])) or {}
    if (declared.get("kind") != "shell" or declared.get("command") != spec.get("command")
            or (declared.get("env") or {}) != (spec.get("env") or {})
            or any((declared.get(key) or {}) != (spec.get(key) or {}) for key in SECRET_ENV_KEYS)):
        raise TaskFailure(f"refused: the shell command of task {message['task']!r} is not one its workflow "
                          "declares (only commands stored by sync from the project's workflow modules run)")


def _takes_argument(fn) -> bool:
    """Whether a workflow task's function takes the TaskContext: read once per function (a
    signature costs about a sixth of a no-op task's whole call), each time for an unhashable one."""
    try:
        return _takes_argument_of(fn)
    except TypeError:
        return _takes_argument_of.__wrapped__(fn)


@functools.lru_cache(maxsize=4096)
def _takes_argument_of(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def task_context(message: dict) -> TaskContext:
    """The TaskContext of a workflow task's attempt, from the worker's message."""
    map_index = message.get("map_index")
    return TaskContext(
        run_id=message["run_id"], task=message["task"], logical_date=message.get("logical_date"),
        params=message.get("params") or {}, attempt=message["number"],
        upstream=results.load_upstream(message.get("upstream") or {}), workflow=message.get("workflow", ""),
        task_run_id=message["id"], map_index=map_index if map_index is not None and map_index >= 0 else None,
        item=message.get("item"), events=message.get("events") or [],
    )


def call_python(message: dict, ctx: TaskContext | None = None, declared: dict | None = None,
                functions: dict | None = None, attempt: dict | None = None):
    """The calling convention: jobs get their args, workflow tasks their TaskContext (``ctx``,
    made from the message when not given). A django.tasks task gets its TaskContext (when it
    takes one) and its ``task_started`` signal; ``attempt["django"]`` then holds its result, for
    ``task_finished``."""
    spec = message["spec"]
    obj = resolve(message, declared, functions)
    secrets.allow_declared(obj, spec.get("ref", ""))
    lead = []
    try:
        from django.tasks import Task as DjangoTask  # noqa: PLC0415 - guarded: a Django without django.tasks
    except ImportError:  # pragma: no cover - Django < 6
        DjangoTask = ()
    if isinstance(obj, DslTask):
        fn = obj.fn
    elif DjangoTask and isinstance(obj, DjangoTask):
        from django.tasks.base import TaskContext as DjangoTaskContext  # noqa: PLC0415 - guarded: a Django without django.tasks

        from orchestrator import tasks_backend  # noqa: PLC0415 - tasks_backend needs the app registry; this module is imported without it

        fn = obj.func
        started = tasks_backend.attempt_started(obj, message["id"])
        if attempt is not None:
            attempt["django"] = started
        if obj.takes_context:
            lead = [DjangoTaskContext(task_result=started)]
    else:
        fn = obj
    if not callable(fn):
        raise TaskFailure(f"task reference {spec.get('ref')!r} is not callable")
    if spec.get("call") == "job":
        value = fn(*lead, *spec.get("args", []), **spec.get("kwargs", {}))
    elif lead:
        value = fn(*lead)
    else:
        ctx = ctx or task_context(message)
        value = fn(ctx) if _takes_argument(fn) else fn()
    if inspect.iscoroutine(value):
        value = asyncio.run(value)
    return value


def shell_env(message: dict) -> dict:
    """A shell task's whole environment: the allow-listed variables of the worker
    (ORCHESTRATOR_SHELL_ENV_ALLOW), what the task declares (``env=``), its params and its place."""
    spec = message["spec"]
    env = {name: os.environ[name] for name in app_settings.SHELL_ENV_ALLOW if name in os.environ}
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    for name, value in (message.get("params") or {}).items():
        env[f"PARAM_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value, default=str)
    logical_date = message.get("logical_date")
    env.update({
        "RUN_ID": str(message["run_id"]), "TASK": message["task"], "ATTEMPT": str(message["number"]),
        "LOGICAL_DATE": logical_date.isoformat() if isinstance(logical_date, datetime) else str(logical_date or ""),
    })
    if message.get("map_index") is not None and message["map_index"] >= 0:
        # A mapped shell task's instance: its position and its item (as JSON).
        env.update({"MAP_INDEX": str(message["map_index"]), "ITEM": json.dumps(message.get("item"), default=str)})
    return env


def secret_env(message: dict) -> dict:
    """A shell task's declared secrets and connections (URLs), by the variables it declared them
    as: each read (audited, and masked in the attempt's log) before the command starts."""
    spec = message["spec"]
    access = secrets.current()
    secret_vars, connection_vars = (spec.get(key) or {} for key in SECRET_ENV_KEYS)
    access.allow(secret_vars.values(), connection_vars.values())
    env = {variable: access.secret(name) for variable, name in secret_vars.items()}
    env.update({variable: access.connection(name).url for variable, name in connection_vars.items()})
    return env


def call_shell(message: dict, log: logs.AttemptLog, declared: dict | None = None) -> None:
    command = message["spec"].get("command")
    if not command:
        raise TaskFailure("shell task has no command")
    check_shell(message, declared)
    env = shell_env(message)
    env.update(secret_env(message))
    fd = log.fileno_for_subprocess() if hasattr(log, "fileno_for_subprocess") else None
    # The shell dies with this child too (a timeout kills the child's whole process group).
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command], env=env, stdin=subprocess.DEVNULL,
        stdout=fd if fd is not None else subprocess.PIPE, stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe enough
    )
    if fd is None:
        for line in proc.stdout:
            log.write(line.decode("utf-8", errors="replace"))
    code = proc.wait()
    if code != 0:
        raise TaskFailure(f"exit code {code}" if code > 0 else f"killed by signal {-code}")


def encode_result(value, in_row: str = "") -> str | None:
    """The JSON text of a task's return value, within the limits: ``ORCHESTRATOR_MAX_STORED_RESULT_BYTES``
    for any result (one over ``ORCHESTRATOR_MAX_RESULT_BYTES`` is kept in the log storage:
    ``results.place``), ``ORCHESTRATOR_MAX_RESULT_BYTES`` for one the graph reads in the row
    (``in_row`` says why: a mapped-over list, a branch's choice)."""
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False)  # PostgreSQL's JSON has no NaN or Infinity either
    except (TypeError, ValueError) as exc:
        raise TaskFailure(f"the task's return value is not JSON-serialisable: {exc}") from exc
    inline, limit = app_settings.MAX_RESULT_BYTES, results.hard_limit()
    size = len(text.encode()) if len(text) > inline // 4 else len(text)
    if in_row and size > inline:
        raise TaskFailure(
            f"the task's result is {size} bytes of JSON, over the limit of {inline} bytes "
            f"(ORCHESTRATOR_MAX_RESULT_BYTES) for a result kept in the database ({in_row}); return fewer or "
            "smaller items, or store large data elsewhere and return a reference"
        )
    if size > limit:
        raise TaskFailure(
            f"the task's result is {size} bytes of JSON, over the limit of {limit} bytes "
            f"(ORCHESTRATOR_MAX_STORED_RESULT_BYTES; a result over {inline} bytes, ORCHESTRATOR_MAX_RESULT_BYTES, "
            "is kept in the log storage up to that limit); store large data elsewhere and return a reference"
        )
    refused = results.refuse_marker(value)
    if refused:
        raise TaskFailure(refused)
    return text


def encode_metadata(metadata) -> str:
    if not isinstance(metadata, dict) or not all(isinstance(key, str) for key in metadata):
        raise TaskFailure("ctx.metadata maps each produced dataset's name to a dict of metadata")
    try:
        text = json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise TaskFailure(f"ctx.metadata is not JSON-serialisable: {exc}") from None
    if len(text.encode()) > app_settings.MAX_RESULT_BYTES:
        raise TaskFailure("ctx.metadata is over the result size limit (ORCHESTRATOR_MAX_RESULT_BYTES)")
    return text


def check_result(message: dict, value) -> None:
    """What the graph needs of a result: a mapped-over task returns a list within the item limit,
    a branch the name(s) of children. Raises TaskFailure saying what is wrong."""
    spec = message["spec"]
    instance = (message.get("map_index") if message.get("map_index") is not None else -1) >= 0
    if spec.get("mapped_by") and not instance:
        mapped = ", ".join(spec["mapped_by"])
        if not isinstance(value, list):
            raise TaskFailure(f"{mapped} is mapped over this task, so it must return a list; "
                              f"it returned {type(value).__name__}")
        limit = app_settings.MAX_MAP_ITEMS
        if len(value) > limit:
            raise TaskFailure(f"{mapped} is mapped over this task's result of {len(value)} items, over the limit "
                              f"of {limit} (ORCHESTRATOR_MAX_MAP_ITEMS): return fewer, larger items")
    if spec.get("branch"):
        chosen = [value] if isinstance(value, str) else value
        children = spec.get("children", [])
        if not isinstance(chosen, list) or not all(isinstance(name, str) for name in chosen):
            raise TaskFailure(f"a branch task returns the name or a list of names of the children to follow "
                              f"({', '.join(children)}); it returned {value!r:.200}")
        unknown = [name for name in chosen if name not in children]
        if unknown:
            raise TaskFailure(f"the branch chose {', '.join(map(repr, unknown))}, not among its children "
                              f"({', '.join(children)})")


def _kept_in_row(message: dict) -> str:
    """Why this task's result must stay in its row (the graph reads it in SQL), or ""."""
    spec = message["spec"]
    instance = (message.get("map_index") if message.get("map_index") is not None else -1) >= 0
    if spec.get("mapped_by") and not instance:
        return f"{', '.join(spec['mapped_by'])} is mapped over it"
    return "a branch's choice" if spec.get("branch") else ""


def _call(message: dict, declared: dict | None, functions: dict | None, attempt: dict) -> tuple:
    """Call a Python task: (outcome, result, metadata) of what it returned (raises as it does)."""
    spec = message["spec"]
    outcome, result, metadata = AttemptOutcome.SUCCEEDED, None, None
    ctx = task_context(message) if spec.get("call") != "job" else None
    value = call_python(message, ctx, declared, functions, attempt)
    if spec.get("sensor") and not value:
        outcome = AttemptOutcome.RESCHEDULED  # not yet: checked again after the sensor's interval
        result = answer_text(value, secrets.current().mask)
    elif spec.get("approval"):
        outcome = AttemptOutcome.ASKED  # the question is out: the task run awaits its answer
    else:
        check_result(message, value)
        result = encode_result(value, in_row=_kept_in_row(message))
        if ctx is not None and ctx.metadata:
            metadata = encode_metadata(ctx.metadata)
    if attempt.get("django") is not None:
        # Inside the try, as django-tasks-db does: a receiver that raises fails the attempt.
        from orchestrator import tasks_backend  # noqa: PLC0415 - tasks_backend needs the app registry; this module is imported without it

        tasks_backend.attempt_finished(attempt["django"], value=json.loads(result) if result else None)
    return outcome, result, metadata


def run(message: dict, log_stream=None, declared: dict | None = None, functions: dict | None = None,
        store_result: bool = True) -> tuple:
    """Run one attempt; returns (task_run_id, number, outcome, result, error, traceback, log,
    metadata, exception class). The outcome is "rescheduled" when a sensor's check answered "not
    yet"; metadata is the JSON text of ``ctx.metadata`` (for the datasets the task produces) or
    None; the exception class is the dotted path of the exception object that failed the attempt.
    ``log_stream``: write the log there instead of the attempt's log in storage; ``declared``:
    the task's spec as the caller's own workflow object declares it, ``functions`` the objects it
    holds (see ``resolve``); ``store_result``: a result too large for a row is written to the log
    storage (``results.place``), unless the caller only shows it (``run_task``)."""
    spec = message["spec"]
    # What the attempt may read of the secrets store, and the masker of the values it read: the
    # log is written through it, and the outcome is masked before it leaves this process.
    access = secrets.Access.of_message(message, secretstore.read_for_task)
    log = MaskedStream(log_stream or logs.AttemptLog(logs.name_for(message["run_id"], message["id"], message["number"]),
                                                     append=message.get("check") is not None), access.masker)
    handler = logging.StreamHandler(log)
    handler.setFormatter(log_formatter())
    handler.addFilter(CONTEXT_FILTER)
    root = logging.getLogger()
    saved = sys.stdout, sys.stderr
    outcome, result, error, tb, metadata, exception_class = AttemptOutcome.SUCCEEDED, None, "", "", None, ""
    attempt = {}  # filled by call_python: the django.tasks result of this attempt, if it is one
    root.addHandler(handler)
    sys.stdout = sys.stderr = log
    # Current until the outcome is made: a failure's records (task_finished receivers) are masked too.
    scope = secrets.attempt(access)
    scope.__enter__()
    span = tracing.attempt(message)
    try:
        with logformat.bind(run_id=message["run_id"], task=message["task"], attempt=message["number"],
                            **span.log_fields):
            if spec.get("kind") == "shell":
                call_shell(message, log, declared)
            else:
                outcome, result, metadata = _call(message, declared, functions, attempt)
    except TaskFailure as exc:
        outcome, error = AttemptOutcome.FAILED, str(exc)
        # The class and traceback of the exception behind a failure the product states itself.
        failure = exc.__cause__ or exc
        exception_class = _class_path(failure)
        if exc.__cause__ is not None:
            tb = "".join(traceback.format_exception(exc.__cause__))
            with contextlib.suppress(Exception):
                log.write(f"{error}\n{tb}")
        _django_finished(attempt, failure, access.mask(tb or error), log)
    except BaseException as exc:  # noqa: B036 - SystemExit/KeyboardInterrupt in a task fail it too
        outcome = AttemptOutcome.FAILED
        error = f"{type(exc).__name__}: {exc}"
        exception_class = _class_path(exc)
        tb = traceback.format_exc()
        with contextlib.suppress(Exception):
            log.write(tb)
        _django_finished(attempt, exc, access.mask(tb), log)
    finally:
        span.end(outcome, access.mask(error))
        sys.stdout, sys.stderr = saved
        root.removeHandler(handler)
        log.release()
        log_name = log.stream.finish() if log_stream is None else ""
        scope.__exit__(None, None, None)
    # Masked before the error is cut to size: a cut through a value would leave its first part.
    reply = access.mask_reply((message["id"], message["number"], outcome, result, error, tb, log_name, metadata,
                               exception_class[:300]))
    if store_result and outcome == AttemptOutcome.SUCCEEDED:
        reply = results.place(reply, message["run_id"])
    return (*reply[:4], reply[4][:10000], *reply[5:])


def answer_text(value, mask=str) -> str:
    """A sensor's "not yet" answer as kept on its task run (``last_answer``): short JSON text,
    masked (``mask``) before it is cut, so a cut never leaves part of a secret."""
    try:
        text = json.dumps(value, allow_nan=False, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return mask(text)[:200]


class CheckTimedOut(TaskFailure):
    """A sensor's check that outlived its own timeout (``poke_timeout``) inside a batch of checks."""


def _check_alarm(signum, frame):
    raise CheckTimedOut("the check outlived its timeout")


def run_checks(message: dict) -> list[tuple]:
    """Run a batch of waiting sensors' checks (``message["checks"]``, claimed together by
    worker.batch.CLAIM_CHECKS) one after the other in this child: one round trip to the worker for
    all of them. Each check keeps its own timeout (a timer interrupts one that hangs in Python
    code; the worker kills the child when the batch as a whole outlives the sum). Returns one
    ``run`` reply per check, a timed-out one with the outcome timed_out."""
    replies = []
    previous = signal.signal(signal.SIGALRM, _check_alarm)
    try:
        for check in message["checks"]:
            timeout = check.get("timeout")
            if timeout:
                signal.setitimer(signal.ITIMER_REAL, float(timeout))
            try:
                reply = run(check)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if reply[8] == _class_path(CheckTimedOut("")):
                reply = (*reply[:2], AttemptOutcome.TIMED_OUT, None,
                         f"timed out after {timeout:g}s: the check was interrupted", *reply[5:])
            replies.append(reply)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return replies


def _class_path(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


def _django_finished(attempt: dict, exc: BaseException, tb: str, log) -> None:
    """``task_finished`` for a django.tasks task's failed attempt, sent while its exception is being
    handled (Django's own receiver logs it with its traceback). A receiver's own error is written
    to the attempt's log; the attempt has failed already."""
    if attempt.get("django") is None:
        return
    from orchestrator import tasks_backend  # noqa: PLC0415 - tasks_backend needs the app registry; this module is imported without it

    try:
        tasks_backend.attempt_finished(attempt["django"], exc=exc, tb=tb)
    except Exception:  # noqa: BLE001 - reported in the log, never raised over the task's own error
        with contextlib.suppress(Exception):
            log.write("a task_finished receiver failed:\n" + traceback.format_exc())
