"""The in-process executor: jobs declared ``@job(executor="async")`` run concurrently on one
event loop, and ``@job(executor="thread")`` in a thread pool, in one child process of the worker
(the *host*), hundreds at a time; every other job keeps its own forked child (``pool``).

Why a child process rather than a thread of the worker: the worker's loop (claims, outcomes,
notifications, heartbeats) and the jobs then use separate interpreters, so they do not contend
for one GIL (on two cores the host takes one and the worker the other), a job that blocks the
event loop or crashes the interpreter stops only the host, and a host can be killed: that is how
a thread that cannot be stopped is ended in the end. The host dies with the worker
(PR_SET_PDEATHSIG), like every child: a SIGKILLed worker's in-process jobs stop with it and the
reaper gives them another attempt, as for forked children.

What differs from a forked child, per job:

- timeout: an async job is cancelled (``CancelledError`` is raised at its ``await``); a thread
  cannot be stopped, so its attempt is ended ``timed_out`` at once and the host is replaced: a
  fresh host takes the new jobs, the old one finishes its other jobs and is then killed (its
  stuck thread with it);
- cancellation by an operator (or an attempt that is no longer this worker's): the same;
- logs: each job's ``logging`` records, ``print`` and ``sys.stderr`` go to its own attempt's log,
  told apart by a context variable (an asyncio task's own context, a pool thread's own context),
  so concurrent jobs' logs do not mix; records emitted outside any job go where they always do;
- the database: an async job uses Django's async ORM (``await Model.objects.aget(...)``), whose
  calls run on one thread of the host with one connection; a thread job has its thread's own;
- isolation: jobs share a process, so module globals, ``os.environ`` and ``os.chdir`` are shared;
  a job that blocks the event loop (``time.sleep`` in an ``async def``) stalls every async job
  of the host until it returns.

The host and the worker speak over a pipe: the worker sends the messages of the jobs of one
claim as a list (or ``{"cancel": id}``, or None: exit), the host answers with lists of
``executor.run``'s outcome tuples, all those ready at once. Replies are written by a thread of
their own, so a full pipe never stops the event loop from reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import math
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.db import close_old_connections, connections

from orchestrator import executor, logformat, logs, registry, reload, results, secrets, secretstore, tracing
from orchestrator.masking import MaskedStream
from orchestrator.states import AttemptOutcome
from orchestrator.worker.pool import ForkedChildren

log = logging.getLogger(__package__)  # the worker's records under one name, orchestrator.worker

IN_PROCESS = ("async", "thread")

# How long (in 10 ms polls) a host whose pipe closed is given to exit, to tell how it ended.
DIED_POLLS = 50

# One claim fills at most this share of the places (rounded up). With every place in one claim, the
# batch that records all their outcomes and claims them again (40 ms for 500 no-op jobs on two
# cores) runs while the host has nothing to do; with half, the host runs one half while the batch
# of the other goes. bench --only peers, async executor, six rounds each way: 11,008-13,119 jobs/s
# against 10,500-12,153; bench --only io the same (6,556-6,770 against 6,353-6,801).
CLAIM_SHARE = 0.5

# A batch holds the worker's one connection: a job enqueued meanwhile (one that outranks the rest)
# waits for it and for the next one, which claims it. Claims of half of 500 places made batches of
# 35-40 ms (at most 108: 200 outcomes recorded and 200 jobs claimed) behind a deep backlog on two
# cores, and a priority job's start delay p99 190-255 ms (bench --only backlog). So what one
# claim may take follows how long the batches take: fewer while they take longer than
# BATCH_SECONDS, more (up to CLAIM_SHARE of the places) while they take less, never below
# CLAIM_LEAST.
BATCH_SECONDS = 0.02
CLAIM_LEAST = 16

UNKNOWN_END = "an unknown cause"  # pool.ForkedChildren.how_it_ended, for a child not ended (yet)


def runs_in_process(message: dict) -> bool:
    """Whether a claimed task run is a job its function declared for the in-process executor."""
    spec = message["spec"]
    return spec.get("call") == "job" and spec.get("kind", "python") == "python" and \
        registry.executor_of(spec.get("ref", "")) in IN_PROCESS


def runs_on_loop(message: dict) -> bool:
    """Whether an in-process job is an async one (cancellable), rather than a thread's."""
    return registry.executor_of(message["spec"].get("ref", "")) == "async"


# --- in the host: one attempt's log, by context ---------------------------------------------------

# The log of the attempt running in this asyncio task or thread (None: no job's).
_current: contextvars.ContextVar[logs.AttemptLog | None] = contextvars.ContextVar("orchestrator_attempt_log",
                                                                                  default=None)


class AttemptLogHandler(logging.Handler):
    """On the root logger of the host: a record goes to the log of the job that emitted it."""

    def __init__(self):
        super().__init__()
        self.setFormatter(executor.log_formatter())
        self.addFilter(logformat.ContextFilter())

    def emit(self, record: logging.LogRecord) -> None:
        attempt_log = _current.get()
        if attempt_log is None:
            return
        try:
            attempt_log.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging never fails the job
            self.handleError(record)


class AttemptStream:
    """``sys.stdout``/``sys.stderr`` of the host: what a job prints goes to its log, anything else
    where it went before."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        attempt_log = _current.get()
        return attempt_log.write(text) if attempt_log is not None else self.stream.write(text)

    def flush(self) -> None:
        attempt_log = _current.get()
        (attempt_log or self.stream).flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


class Attempt:
    """One job's attempt in the host: its log current while it runs, and its outcome tuple
    (``executor.run``'s) whatever it raised."""

    def __init__(self, message: dict):
        self.message = message
        # The secrets it may read, and the masker its log and outcome go through (orchestrator.secrets).
        self.access = secrets.Access.of_message(message, secretstore.read_for_task)
        self.log = MaskedStream(logs.AttemptLog(logs.name_for(message["run_id"], message["id"], message["number"])),
                                self.access.masker)
        self.outcome, self.result, self.error, self.traceback, self.exception_class = \
            AttemptOutcome.SUCCEEDED, None, "", "", ""

    def call(self):
        """The job's function called with its arguments (a coroutine for an async job)."""
        spec = self.message["spec"]
        fn = executor.resolve(self.message)
        secrets.allow_declared(fn, spec.get("ref", ""))
        if not callable(fn):
            raise executor.TaskFailure(f"task reference {spec.get('ref')!r} is not callable")
        return fn(*spec.get("args", []), **spec.get("kwargs", {}))

    def __enter__(self):
        self.token = _current.set(self.log)
        self.scope = secrets.attempt(self.access)
        self.scope.__enter__()
        self.span = tracing.attempt(self.message)
        self.bound = logformat.bind(run_id=self.message["run_id"], task=self.message["task"],
                                    attempt=self.message["number"], **self.span.log_fields)
        self.bound.__enter__()
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is not None:
            self.failed(exc)
        self.bound.__exit__(None, None, None)
        self.span.end(self.outcome, self.access.mask(self.error))
        self.scope.__exit__(None, None, None)
        _current.reset(self.token)
        return True  # the outcome says what happened; nothing unwinds into the host

    def failed(self, exc: BaseException) -> None:
        self.outcome = AttemptOutcome.FAILED
        if isinstance(exc, executor.TaskFailure):
            self.error = str(exc)
            cause = exc.__cause__
            self.exception_class = _class_path(cause or exc)
            if cause is not None:
                self.traceback = "".join(traceback.format_exception(cause))
        else:
            self.error = f"{type(exc).__name__}: {exc}"
            self.exception_class = _class_path(exc)
            self.traceback = "".join(traceback.format_exception(exc))
        with contextlib.suppress(Exception):
            self.log.write(self.traceback or self.error + "\n")

    def reply(self) -> tuple:
        log_name = ""
        with contextlib.suppress(Exception):
            log_name = self.log.finish()
        reply = self.access.mask_reply((self.message["id"], self.message["number"], self.outcome, self.result,
                                        self.error, self.traceback, log_name, None, self.exception_class[:300]))
        if self.outcome == AttemptOutcome.SUCCEEDED:
            reply = results.place(reply, self.message["run_id"])  # too large for a row: to the log storage
        return (*reply[:4], reply[4][:10000], *reply[5:])


def _class_path(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


async def run_async(message: dict) -> tuple:
    attempt = Attempt(message)
    with attempt:
        value = attempt.call()
        if inspect.isawaitable(value):
            value = await value
        attempt.result = executor.encode_result(value)
    return attempt.reply()


def run_in_thread(message: dict) -> tuple:
    attempt = Attempt(message)
    try:
        with attempt:
            value = attempt.call()
            if inspect.iscoroutine(value):  # registered as a thread job, "async def" since: run it here
                value = asyncio.run(value)
            attempt.result = executor.encode_result(value)
    finally:
        close_old_connections()  # this thread's connection, if the job broke it
    return attempt.reply()


# --- in the host: the loop ----------------------------------------------------------------------


class Host:
    """The host's side: read messages, start each job on the loop or in the pool, send outcomes."""

    def __init__(self, conn, threads: int):
        self.conn = conn
        self.threads = threads
        self.tasks: dict[int, asyncio.Task] = {}
        self.replies: queue.SimpleQueue = queue.SimpleQueue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pool: ThreadPoolExecutor | None = None

    def serve(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="orchestrator-job")
        logging.getLogger().addHandler(AttemptLogHandler())
        sys.stdout, sys.stderr = AttemptStream(sys.stdout), AttemptStream(sys.stderr)
        writer = threading.Thread(target=self.write_replies, name="orchestrator-replies", daemon=True)
        writer.start()
        self.conn.send(executor.READY)
        self.loop.add_reader(self.conn.fileno(), self.readable)
        try:
            self.loop.run_forever()
        finally:
            self.replies.put(None)
            writer.join(5)
            with contextlib.suppress(Exception):
                connections.close_all()

    def write_replies(self) -> None:
        """Send the outcomes as they come, all those ready in one message (one pickle, one write)."""
        while True:
            batch, last = [self.replies.get()], False
            while not self.replies.empty():
                batch.append(self.replies.get_nowait())
            if None in batch:
                batch, last = batch[:batch.index(None)], True
            try:
                if batch:
                    self.conn.send(batch)
            except OSError:
                return
            if last:
                return

    def readable(self) -> None:
        while True:
            try:
                if not self.conn.poll():
                    return
                message = self.conn.recv()
            except (EOFError, OSError):
                self.loop.stop()
                return
            if message is None:  # recycled or shutting down
                self.loop.stop()
                return
            if isinstance(message, list):  # the jobs of one claim
                for job_message in message:
                    self.start(job_message)
            elif "cancel" in message:
                task = self.tasks.get(message["cancel"])
                if task is not None:
                    task.cancel()

    def start(self, message: dict) -> None:
        fn = registry.get(message["spec"].get("ref", ""))
        if inspect.iscoroutinefunction(fn):
            task = self.loop.create_task(run_async(message))
            self.tasks[message["id"]] = task
        else:
            task = self.loop.run_in_executor(self.pool, run_in_thread, message)
        task.add_done_callback(functools.partial(self.finished, message))

    def finished(self, message: dict, task) -> None:
        self.tasks.pop(message["id"], None)
        if task.cancelled():
            return  # the worker ended this attempt already (timed out, cancelled)
        self.replies.put(task.result())


def host_main(conn, parent_pid: int, threads: int) -> None:
    """The host process's life; never returns."""
    code = 0
    try:
        executor.child_setup(parent_pid)
        tracing.child_started()
        try:
            reload.refresh()
        except Exception:  # noqa: BLE001 - the host runs what is registered rather than not at all
            logging.getLogger(__name__).exception("could not read the changed code anew")
        Host(conn, threads).serve()
    except BaseException:  # noqa: B036 - a child must never unwind into the worker's loop
        traceback.print_exc()
        code = 1
    finally:
        tracing.flush()
        os._exit(code)


# --- in the worker: the hosts -------------------------------------------------------------------


@dataclass
class HostProcess:
    pid: int
    conn: object
    generation: int = 0
    ready: bool = False
    retiring: bool = False  # takes no new job; killed once its last job ended
    messages: dict = field(default_factory=dict)  # task run id -> the message of a job it runs
    deadlines: dict = field(default_factory=dict)  # task run id -> time.monotonic() of its timeout


class InProcess:
    """The worker's side of the in-process executor: ``places`` jobs at once in one host process
    (threads: as many as the thread jobs among them). ``on_reply(message, reply)`` hears a job's
    outcome, ``on_died(message, how)`` that the host died while running it."""

    def __init__(self, *, places: int, on_reply: Callable[[dict, tuple], None],
                 on_died: Callable[[dict, str], None], children=None):
        self.places = places
        self.on_reply, self.on_died = on_reply, on_died
        self.children = children or ForkedChildren(main=functools.partial(host_main, threads=max(1, places)))
        self.host: HostProcess | None = None  # the one that takes new jobs
        self.hosts: list[HostProcess] = []  # it and the retiring ones
        self.generation = 0
        self.loop = None
        self.last_reply = 0.0  # time.monotonic() of the latest job outcome from a host
        self.claim_most = math.ceil(places * CLAIM_SHARE)  # what one claim may take (batch_took)

    # --- what it holds -----------------------------------------------------------------------

    def free(self) -> int:
        """How many more jobs it takes now (none until its host is ready)."""
        if not self.places or self.host is None or not self.host.ready:
            return 0
        return max(0, self.places - self.busy_count())

    def offer(self) -> int:
        """How many of the free places one claim may fill: at most CLAIM_SHARE of them all, fewer
        while batches take longer than BATCH_SECONDS (``batch_took``)."""
        return min(self.free(), self.claim_most)

    def batch_took(self, seconds: float) -> None:
        """A batch of the worker took this long: the next claims may take more, or fewer, so that
        batches take about BATCH_SECONDS (at most half as many, or 1.5 times as many, as now)."""
        most = math.ceil(self.places * CLAIM_SHARE)
        factor = min(1.5, max(0.5, BATCH_SECONDS / max(seconds, 1e-6)))
        self.claim_most = max(min(CLAIM_LEAST, most), min(most, round(self.claim_most * factor)))

    def busy_count(self) -> int:
        return sum(len(host.messages) for host in self.hosts)

    def messages(self) -> list[dict]:
        return [message for host in self.hosts for message in host.messages.values()]

    def deadlines(self) -> list[float]:
        return [deadline for host in self.hosts for deadline in host.deadlines.values()]

    # --- the host process ----------------------------------------------------------------------

    def start(self, loop, generation: int = 0) -> None:
        self.loop = loop
        self.generation = generation
        if self.places and self.host is None:
            self.host = self.fork()

    def fork(self) -> HostProcess:
        pid, conn = self.children.fork()
        host = HostProcess(pid=pid, conn=conn, generation=self.generation)
        self.hosts.append(host)
        self.loop.watch(conn, lambda _conn, host=host: self.readable(host))
        return host

    def readable(self, host: HostProcess) -> None:
        while True:
            try:
                if not host.conn.poll():
                    break
                replies = host.conn.recv()
            except (EOFError, OSError):
                self.died(host)
                return
            if not host.ready:
                host.ready = True
                log.info("in-process executor ready: host pid %d, %d places", host.pid, self.places,
                         extra={"action": "worker_inprocess_ready"})
                continue
            for reply in replies:
                message = host.messages.pop(reply[0], None)
                if message is None or message["number"] != reply[1]:
                    continue  # ended already (timed out, cancelled): the late outcome is not recorded
                host.deadlines.pop(reply[0], None)
                self.last_reply = time.monotonic()
                self.on_reply(message, reply)
        if host.retiring and not host.messages:
            self.end(host)

    def died(self, host: HostProcess) -> None:
        # Its pipe closed as it exited: wait a moment for the exit itself, to say how it ended.
        how = self.children.how_it_ended(host.pid)
        for _ in range(DIED_POLLS):
            if how != UNKNOWN_END:
                break
            time.sleep(0.01)
            how = self.children.how_it_ended(host.pid)
        messages = list(host.messages.values())
        host.messages.clear()
        self.end(host)
        for message in messages:
            self.on_died(message, how)

    def end(self, host: HostProcess) -> None:
        """Kill a host (its jobs are over or given up) and, if it was taking jobs, fork another."""
        self.loop.unwatch(host.conn)
        self.children.kill(host.pid)
        host.conn.close()
        self.hosts.remove(host)
        if host is self.host:
            self.host = self.fork()

    def retire(self, host: HostProcess) -> None:
        """A fresh host takes the new jobs; this one is killed once its last job ended."""
        if host.retiring:
            return
        host.retiring = True
        if host is self.host:
            self.host = self.fork()
        if not host.messages:
            self.end(host)

    def run(self, messages: list[dict]) -> None:
        """Start these jobs on the host, sent in one message (one pickle, one write)."""
        host = self.host
        now = time.monotonic()
        for message in messages:
            host.messages[message["id"]] = message
            if message.get("timeout"):
                host.deadlines[message["id"]] = now + message["timeout"]
        self.send(host, messages)

    def send(self, host: HostProcess, message) -> None:
        try:
            host.conn.send(message)
        except OSError:
            self.died(host)

    # --- ending jobs from outside ------------------------------------------------------------

    def give_up(self, task_run_id: int) -> dict | None:
        """Stop waiting for a job (timed out, cancelled, no longer this worker's): an async job is
        cancelled; a thread cannot be, so its host is retired. Its message, or None."""
        for host in list(self.hosts):
            message = host.messages.pop(task_run_id, None)
            if message is None:
                continue
            host.deadlines.pop(task_run_id, None)
            if runs_on_loop(message):
                self.send(host, {"cancel": task_run_id})
                if host.retiring and not host.messages and host in self.hosts:
                    self.end(host)
            else:
                self.retire(host)
            return message
        return None

    def overdue(self, now: float) -> list[dict]:
        """The jobs past their timeout, given up: their messages."""
        late = [task_run_id for host in self.hosts for task_run_id, deadline in host.deadlines.items()
                if now >= deadline]
        return [message for task_run_id in late if (message := self.give_up(task_run_id)) is not None]

    def recycle(self, generation: int) -> None:
        """After a sync (a new code generation): a fresh host reads the code now on disk."""
        self.generation = generation
        if self.host is not None and self.host.generation != generation:
            self.retire(self.host)

    def interrupt(self) -> list[dict]:
        """Kill the hosts that run jobs, without replacing them: those jobs' messages."""
        messages = self.messages()
        for host in list(self.hosts):
            if host.messages:
                host.messages.clear()
                host.deadlines.clear()
                if host is self.host:
                    self.host = None
                self.end(host)
        return messages

    def close(self) -> None:
        """On the way out: an idle host is told to exit, a busy one killed."""
        for host in list(self.hosts):
            if host.messages:
                self.children.kill(host.pid)
                continue
            with contextlib.suppress(OSError):
                host.conn.send(None)
            deadline = time.monotonic() + 5.0
            while not self.children.exited(host.pid):
                if time.monotonic() >= deadline:
                    self.children.kill(host.pid)
                    break
                time.sleep(0.01)
        for host in self.hosts:
            with contextlib.suppress(Exception):
                self.loop.unwatch(host.conn)
            host.conn.close()
        self.hosts = []
        self.host = None
