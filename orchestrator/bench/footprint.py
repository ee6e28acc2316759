"""The idle footprint for ``manage.py bench --only footprint``: the memory the whole default stack
holds once started and idle, measured the way the README states it.

The standalone project's ``manage.py up`` (what ``./dev run`` starts) runs with a data folder of
its own: a new embedded PostgreSQL, the web server, a scheduler, a dispatcher and a worker. Once it
says it is ready and has idled a few seconds, the figure is the sum of the proportional set size
(``Pss`` in ``/proc/PID/smaps_rollup``: shared pages divided among the processes sharing them) of
every process of that stack: ``up`` and its forks, the worker's children, and the embedded
server's processes. A host project that has no ``up`` command is told so.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.bench.core import ROOT

IDLE_SECONDS = 5.0
START_TIMEOUT = 180.0


def pss_kib(pid: int) -> int:
    """A process's proportional set size in KiB (0 once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def _processes() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, command line)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(entry)] = (int(stat[stat.rindex(")") + 2:].split()[1]), command)
    return found


def stack_pids(root: int, pgdata: Path) -> dict[str, list[int]]:
    """The processes of the stack under ``root``, and the embedded server's (a postmaster started
    with ``-D pgdata`` and its children, which ``up`` does not parent), by kind."""
    processes = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)

    def tree(pid: int) -> list[int]:
        found, todo = [], [pid]
        while todo:
            current = todo.pop()
            found.append(current)
            todo.extend(children.get(current, []))
        return found

    postmasters = [pid for pid, (_, command) in processes.items() if "postgres" in command and str(pgdata) in command]
    server = [pid for postmaster in postmasters for pid in tree(postmaster)]
    python = [pid for pid in tree(root) if pid not in server]
    return {"python": python, "postgres": server}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(out) -> dict:
    from django.core.management import get_commands

    if "up" not in get_commands():
        out("  not available: this project has no 'up' command (the standalone project's manage.py up)")
        return {}
    with tempfile.TemporaryDirectory(prefix="orchestrator-footprint-") as folder:
        data = Path(folder) / "data"
        env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
        env.update({"ORCHESTRATOR_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"})
        port = _free_port()
        log = Path(folder) / "up.log"
        with log.open("w") as output:
            proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "up", "--port", str(port)], cwd=ROOT,
                                    env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            began = time.monotonic()
            while "Ready in" not in log.read_text():
                if proc.poll() is not None or time.monotonic() - began > START_TIMEOUT:
                    out(f"  the stack did not start: {log.read_text()[-500:]}")
                    return {}
                time.sleep(0.2)
            time.sleep(IDLE_SECONDS)
            pids = stack_pids(proc.pid, data / "pgdata")
            figures = {kind: sum(pss_kib(pid) for pid in found) / 1024 for kind, found in pids.items()}
            total = sum(figures.values())
            out(f"  ./dev run's stack idle {IDLE_SECONDS:g} s after it started: {total:.0f} MiB PSS in all "
                f"({len(pids['python'])} Python processes {figures['python']:.0f} MiB, "
                f"{len(pids['postgres'])} embedded PostgreSQL processes {figures['postgres']:.0f} MiB)")
            return {"total_mib": total, **{f"{kind}_mib": value for kind, value in figures.items()}}
        finally:
            # Ctrl-C: up stops every role and the embedded server it started.
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
