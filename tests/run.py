"""The test command (``./dev test``, i.e. ``python -m tests.run``): the linter, then the whole
pytest suite.

Without DATABASE_URL the tests use the standalone project's embedded PostgreSQL; if this command
had to start it, it stops it again at the end, so a developer's running ``./dev run`` is never
disturbed.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    python = sys.executable
    print("== ruff check", flush=True)
    lint = subprocess.run([python, "-m", "ruff", "check", "."], cwd=ROOT)
    if lint.returncode != 0:
        return lint.returncode

    missing = ensure_debian_tools()
    if missing:
        # Saying so loudly beats failing every such test for a reason unrelated to the code.
        for tool in missing:
            print(f"!! Debian's {tool.package} is not installed and cannot be installed here (needs root and apt-get):\n"
                  f"!! the tests marked {tool.marker} are NOT run. Install it with: apt-get install {tool.package}",
                  file=sys.stderr, flush=True)
        if "-m" not in argv:
            argv = [*argv, "-m", " and ".join(f"not {tool.marker}" for tool in missing)]

    ensure_axe()

    from project import database

    started_here = database.prepare()
    try:
        print("== pytest", flush=True)
        return subprocess.run([python, "-m", "pytest", *in_parallel(argv)], cwd=ROOT).returncode
    finally:
        if started_here:
            from orchestrator import embedded

            embedded.stop(database.pgdata())


# pytest options that take the next argument as their value (anything else not starting with "-"
# names tests).
_VALUED = {"-m", "-k", "-p", "-o", "-c", "-W", "--rootdir", "--basetemp", "--deselect", "--ignore", "--durations"}


def in_parallel(argv: list[str]) -> list[str]:
    """The whole suite, or a selection by marker, runs on pytest-xdist: one process per core
    (ORCHESTRATOR_TEST_PROCESSES to choose), each with its own test database and data folder
    (tests/conftest.py). Most of a test's time is spent waiting on the processes it starts, so
    the cores stay busy. A run that names tests, or says -n itself, runs as asked."""
    if "no:xdist" in argv or any(arg.startswith(("-n", "--numprocesses")) for arg in argv):
        return argv
    values = {i + 1 for i, arg in enumerate(argv) if arg in _VALUED}
    if any(not arg.startswith("-") and i not in values for i, arg in enumerate(argv)):
        return argv
    processes = os.environ.get("ORCHESTRATOR_TEST_PROCESSES", "auto")
    return ["-n", processes, "--dist", "worksteal", *argv]


def ensure_axe() -> None:
    """The browser tests check every page with axe-core, the npm package pinned in
    tests/e2e/package-lock.json; install it there when node is on this machine and it is missing."""
    e2e = ROOT / "tests" / "e2e"
    if (e2e / "node_modules" / "axe-core" / "axe.min.js").exists():
        return
    if not shutil.which("npm"):
        print("!! npm is not installed: the accessibility checks of the browser tests fail until axe-core is\n"
              "!! installed (apt-get install npm, then: npm ci --prefix tests/e2e)", file=sys.stderr, flush=True)
        return
    print("== installing axe-core for the browser tests (npm ci in tests/e2e)", flush=True)
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=e2e)


class Tool(NamedTuple):
    package: str  # Debian's package
    binary: str
    marker: str  # the tests that need it


# What the tests drive that pip cannot install: Debian's chromium for the browser tests
# (Playwright's own browser download does not work everywhere), Debian's pgbouncer for the
# connection-pooling test.
TOOLS = [Tool("chromium", "chromium", "e2e"), Tool("pgbouncer", "pgbouncer", "pgbouncer")]


def found(binary: str) -> bool:
    # /usr/sbin is not on every user's PATH.
    return shutil.which(binary) is not None or os.access(f"/usr/sbin/{binary}", os.X_OK)


def ensure_debian_tools() -> list[Tool]:
    """Install the missing tools in one apt-get call when this user can; returns those still missing."""
    missing = [tool for tool in TOOLS if not found(tool.binary)]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        packages = " ".join(tool.package for tool in missing)
        print(f"== installing {packages} for the tests (apt-get)", flush=True)
        subprocess.run(f"apt-get update -qq && apt-get install -y -qq {packages} >/dev/null", shell=True)
    return [tool for tool in missing if not found(tool.binary)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
