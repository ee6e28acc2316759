"""Supervising a set of role processes on one machine: start each, restart one that dies, and on
SIGTERM, Ctrl-C or SIGHUP (its terminal closed) pass SIGTERM on to each so it drains, then report
how each ended. Used by ``manage.py up`` (development) and ``manage.py deploy_local`` (servers).

The restart policy (the README's "Running in production" says the same):

* a child that exits is restarted after a back-off: 1 s, then 2, 4, 8, 16, up to 30 s for each
  further exit in a row;
* a child that ran healthily for 60 s before it exited gets its budget back: it is restarted
  after 1 s again, however often it exited before;
* a child crash-loops when it exits 10 times within 10 minutes; only then, as the last resort,
  the supervisor stops everything (logging which child, how often and how it last ended) and
  exits non-zero, so the machine's own service manager (systemd, a container runtime) sees the
  failure. A database restart is not a reason: the roles ride it out without exiting;
* a child that exits with ``CONFIG_ERROR`` (78: it cannot run as configured, and said why) is not
  restarted into the same error: the supervisor stops everything at once and exits non-zero.

No child outlives the supervisor, however the supervisor ends: each asks Linux for SIGTERM when
its parent dies (``PR_SET_PDEATHSIG``), so a SIGKILLed supervisor's roles drain and end as on a
stop, instead of serving its port for ever.

A child is a new interpreter (``subprocess``), or, for ``Child(fork=True)``, a fork of the
supervisor (``ForkedRole``): it then shares the memory Django's start-up filled in the supervisor
until either writes to it, instead of filling its own (``manage.py up`` runs its roles so).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connections

from orchestrator.management.roles import CONFIG_ERROR, run_command


@dataclass(frozen=True)
class RestartPolicy:
    first_delay: float = 1.0
    max_delay: float = 30.0
    healthy_seconds: float = 60.0
    crash_loop_exits: int = 10
    crash_loop_window: float = 600.0


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path | None = None
    proc: subprocess.Popen | None = None
    restarts: int = 0  # exits in a row since the child last ran healthily
    restart_at: float | None = None
    started_at: float = 0.0
    exits: deque = field(default_factory=deque)  # time.monotonic() of each exit within the window
    pids: list[int] = field(default_factory=list)
    stop_sent: bool = False
    fork: bool = False  # run the role in a fork of the supervisor (see ForkedRole)
    # Exit codes that mean "cannot run as configured": never restarted. gunicorn's own are 3 (a
    # worker failed to boot) and 4 (the application failed to load).
    config_error_codes: frozenset[int] = frozenset({CONFIG_ERROR})


def role_argv(role: str, *extra: str) -> list[str]:
    """The command line of a role: the project's manage.py that started this process, else
    ``python -m django`` (the same DJANGO_SETTINGS_MODULE, inherited)."""
    script = Path(sys.argv[0])
    if script.name == "manage.py" and script.is_file():
        return [sys.executable, str(script.resolve()), role, *extra]
    return [sys.executable, "-m", "django", role, *extra]


# What stops a supervisor: a stop, Ctrl-C, and the hang-up of a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: a child may then outlive a killed supervisor
        return None


_PRCTL = _prctl()  # looked up once, before any fork: a preexec function should only call it


def die_with_parent(parent: int) -> None:
    """In a child of ``parent``: have the kernel send this process SIGTERM when its parent ends,
    however it ends (SIGKILL included), so that a role drains and ends as on a stop. A parent
    that died before the request took effect would never send it: the child is then already
    an orphan (another parent), and stops at once."""
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, *(ctypes.c_ulong(arg) for arg in (signal.SIGTERM, 0, 0, 0)))
    if os.getppid() != parent:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # whatever handler the parent had installed
        os.kill(os.getpid(), signal.SIGTERM)


class ForkedRole:
    """A role run in a fork of this (single-threaded, Django set up) process instead of a new
    interpreter, with the part of ``subprocess.Popen`` the supervisor uses. The fork shares every
    page Django's start-up filled until one of them writes to it (``gc.freeze()``, so the
    collector does not); a role then costs its own work, not a second copy of Django."""

    def __init__(self, pid: int, argv: list[str]):
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None

    @classmethod
    def start(cls, argv: list[str], output) -> ForkedRole:
        command = argv[3:] if argv[1:3] == ["-m", "django"] else argv[2:]
        connections.close_all()  # a fork must not share this process's database socket
        sys.stdout.flush()
        sys.stderr.flush()  # or the fork would write what is still buffered here a second time
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            cls._run(command, output, parent)
        return cls(pid, argv)

    @staticmethod
    def _run(command: list[str], output, parent: int) -> None:
        code = 1
        try:
            os.setsid()  # its own session, as a subprocess of the supervisor's has
            # What the fork inherited is never collected here (the collector would write to every
            # object it visits, copying the pages it shares); the supervisor may have turned the
            # collector off, for the same reason, and the role has it on.
            gc.freeze()
            gc.enable()
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            die_with_parent(parent)
            if output is not None:
                os.dup2(output.fileno(), 1)
                os.dup2(output.fileno(), 2)
                # Whatever this process had made of sys.stdout, the role's goes to the file.
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            if _PRCTL is not None:  # what ps -o comm and top show: the role, not the supervisor's name
                _PRCTL(PR_SET_NAME, command[0].encode()[:15], 0, 0, 0)
            sys.argv = ["manage.py", *command]
            run_command(sys.argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - a fork never returns into the supervisor
            traceback.print_exc()
        finally:
            try:
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


def write_line(stream, text: str) -> None:
    """Write a line of a launcher's to its terminal, which may be gone: after a SIGHUP (the terminal
    closed) every write fails with EIO. The stop must go on regardless, so the output then goes
    to /dev/null (what is still buffered too, and the interpreter's last flush at exit)."""
    try:
        stream.write(text)
        stream.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)


def describe_exit(code: int, stop_sent: bool = False) -> str:
    """How a child ended, in words: a signal is named, and a stop we asked for is not a crash."""
    if code == 0:
        return "exited cleanly (code 0)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if stop_sent and -code in (signal.SIGTERM, signal.SIGINT):
            return f"stopped by the {name} the supervisor sent"
        return f"was killed by {name}"
    return f"exited with code {code}"


class Supervisor:
    def __init__(self, children: list[Child], say: Callable[[str], None], grace: float = 30.0,
                 policy: RestartPolicy | None = None, clock: Callable[[], float] = time.monotonic):
        self.children = children
        self.say = say
        self.grace = grace
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.stopping = False
        self.gave_up: str | None = None  # why everything was stopped, if the supervisor gave up
        self.config_error = False  # it gave up because a child cannot run as configured

    @property
    def exit_code(self) -> int:
        """What the launcher exits with after giving up (0 if it did not)."""
        if self.gave_up is None:
            return 0
        return CONFIG_ERROR if self.config_error else 1

    def catch_stop_signals(self) -> None:
        """From now on SIGTERM, SIGINT and SIGHUP stop the supervisor (and then its children).
        A launcher calls this before its own preparation, so that a stop during it starts nothing."""

        def stop(signum, frame):
            self.stopping = True

        for signum in STOP_SIGNALS:
            signal.signal(signum, stop)

    def run(self, on_started: Callable[[], None] | None = None, ready: Callable[[], bool] | None = None) -> bool:
        """Start every child and watch them until SIGTERM/SIGINT/SIGHUP; returns whether all
        stopped cleanly.

        ``on_started`` is called once, when ``ready()`` first answers true (checked between
        watches, so it must answer at once), or right after the start without ``ready``."""
        self.catch_stop_signals()
        announced = on_started is None
        try:
            for child in self.children:
                if self.stopping:
                    break
                self.start(child)
            while not self.stopping:
                if not announced and (ready is None or ready()):
                    announced = True
                    on_started()
                self.watch()
                time.sleep(0.2)
        finally:
            clean = self.shutdown(deadline=self.grace + 15)
        return clean and self.gave_up is None

    def watch(self) -> None:
        for child in self.children:
            if self.stopping:
                return
            if child.restart_at is not None:
                if self.clock() >= child.restart_at:
                    child.restart_at = None
                    self.start(child)
            elif child.proc.poll() is not None:
                self.on_exit(child)

    def on_exit(self, child: Child) -> None:
        policy, now = self.policy, self.clock()
        code = child.proc.returncode
        if now - child.started_at >= policy.healthy_seconds:
            child.restarts = 0  # it ran healthily: its budget is back
        child.exits.append(now)
        while child.exits and now - child.exits[0] > policy.crash_loop_window:
            child.exits.popleft()
        how = describe_exit(code)
        if code in child.config_error_codes:
            where = f"in {child.log_path}" if child.log_path else "above"
            self.gave_up = (f"{child.name} (pid {child.proc.pid}) cannot run as configured: it exited with code {code} "
                            f"after {now - child.started_at:.1f}s (its reason is {where}); not restarting it into "
                            f"the same error: stopping everything")
            self.config_error = True
            self.say(self.gave_up)
            self.stopping = True
            return
        if len(child.exits) >= policy.crash_loop_exits:
            self.gave_up = (f"{child.name} is crash-looping: it ended {len(child.exits)} times within "
                            f"{policy.crash_loop_window:g}s (last: {how}); stopping everything")
            self.say(self.gave_up)
            self.stopping = True
            return
        # Backing off: a role that cannot start (bad config, a missing module) must not spin the machine.
        delay = min(policy.first_delay * 2 ** child.restarts, policy.max_delay)
        child.restarts += 1
        child.restart_at = now + delay
        self.say(f"{child.name} (pid {child.proc.pid}) {how} after {now - child.started_at:.1f}s; "
                 f"restarting in {delay:g}s")

    def start(self, child: Child) -> None:
        output = open(child.log_path, "ab") if child.log_path else None  # noqa: SIM115 - kept by the child
        try:
            # Own session: a Ctrl-C in this terminal reaches only this supervisor, which then stops
            # the children in order instead of all of them at once. A fork only of a process with
            # no other thread: a thread's locks would stay taken forever in the fork.
            if child.fork and threading.active_count() == 1:
                child.proc = ForkedRole.start(child.argv, output)
            else:
                parent = os.getpid()
                child.proc = subprocess.Popen(child.argv, stdout=output, stderr=subprocess.STDOUT if output else None,
                                              start_new_session=True, preexec_fn=lambda: die_with_parent(parent))
        finally:
            if output:
                output.close()
        child.started_at = self.clock()
        child.stop_sent = False
        child.pids.append(child.proc.pid)
        self.say(f"started {child.name} pid {child.proc.pid}: {' '.join(child.argv[1:])}")

    def shutdown(self, deadline: float) -> bool:
        self.say("stopping: SIGTERM to every process")
        began = time.monotonic()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                # To the process only, as a container runtime does: each role stops its own
                # children (gunicorn its workers, a worker its running tasks) after draining.
                child.proc.send_signal(signal.SIGTERM)
                child.stop_sent = True
        clean = True
        for child in self.children:
            if child.proc is None or child.restart_at is not None or child.proc.returncode is not None:
                continue  # never started, or it already ended (and was reported)
            try:
                code = child.proc.wait(timeout=max(0.1, deadline - (time.monotonic() - began)))
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait(timeout=10)
                self.say(f"{child.name} (pid {child.proc.pid}) did not stop within {deadline:g}s: killed")
                clean = False
                continue
            self.say(f"{child.name} (pid {child.proc.pid}) {describe_exit(code, child.stop_sent)} "
                     f"after {time.monotonic() - began:.1f}s")
            # Ending on the SIGTERM we sent is doing what was asked (a server without a handler).
            clean = clean and (code == 0 or (child.stop_sent and code == -signal.SIGTERM))
        return clean
