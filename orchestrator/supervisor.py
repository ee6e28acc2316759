"""Supervising a set of role processes on one machine: start each, restart one that dies (with
back-off), and on SIGTERM or Ctrl-C pass SIGTERM on to each so it drains, then report how each
ended. Used by ``manage.py up`` (development) and ``manage.py deploy_local`` (servers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MAX_RESTARTS = 5


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path | None = None
    proc: subprocess.Popen | None = None
    restarts: int = 0
    restart_at: float | None = None
    pids: list[int] = field(default_factory=list)


def role_argv(role: str, *extra: str) -> list[str]:
    """The command line of a role: the project's manage.py that started this process, else
    ``python -m django`` (the same DJANGO_SETTINGS_MODULE, inherited)."""
    script = Path(sys.argv[0])
    if script.name == "manage.py" and script.is_file():
        return [sys.executable, str(script.resolve()), role, *extra]
    return [sys.executable, "-m", "django", role, *extra]


class Supervisor:
    def __init__(self, children: list[Child], say: Callable[[str], None], grace: float = 30.0):
        self.children = children
        self.say = say
        self.grace = grace
        self.stopping = False

    def run(self, on_started: Callable[[], None] | None = None) -> bool:
        """Start every child and watch them until SIGTERM/SIGINT; returns whether all stopped cleanly."""

        def stop(signum, frame):
            self.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            for child in self.children:
                self.start(child)
            if on_started:
                on_started()
            while not self.stopping:
                self.watch()
                time.sleep(0.2)
        finally:
            clean = self.shutdown(deadline=self.grace + 15)
        return clean

    def watch(self) -> None:
        for child in self.children:
            if self.stopping or child.proc.poll() is None:
                continue
            if child.restart_at is None:
                if child.restarts >= MAX_RESTARTS:
                    self.say(f"{child.name} keeps exiting (code {child.proc.returncode}); stopping everything")
                    self.stopping = True
                    return
                # Backing off: a role that cannot start (database down, bad config) must not
                # spin the machine.
                delay = min(2.0 ** child.restarts, 30.0)
                child.restart_at = time.monotonic() + delay
                self.say(f"{child.name} (pid {child.proc.pid}) exited with {child.proc.returncode}; "
                         f"restarting in {delay:g}s")
            elif time.monotonic() >= child.restart_at:
                child.restarts += 1
                child.restart_at = None
                self.start(child)

    def start(self, child: Child) -> None:
        output = open(child.log_path, "ab") if child.log_path else None  # noqa: SIM115 - kept by the child
        try:
            # Own session: a Ctrl-C in this terminal reaches only this supervisor, which then stops
            # the children in order instead of all of them at once.
            child.proc = subprocess.Popen(child.argv, stdout=output, stderr=subprocess.STDOUT if output else None,
                                          start_new_session=True)
        finally:
            if output:
                output.close()
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
        clean = True
        for child in self.children:
            if child.proc is None:
                continue
            try:
                code = child.proc.wait(timeout=max(0.1, deadline - (time.monotonic() - began)))
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                code = child.proc.wait(timeout=10)
                self.say(f"{child.name} (pid {child.proc.pid}) did not stop within {deadline:g}s: killed")
                clean = False
                continue
            self.say(f"{child.name} (pid {child.proc.pid}) exited with code {code} "
                     f"after {time.monotonic() - began:.1f}s")
            clean = clean and code == 0
        return clean
