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

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    python = sys.executable
    print("== ruff check", flush=True)
    lint = subprocess.run([python, "-m", "ruff", "check", "."], cwd=ROOT)
    if lint.returncode != 0:
        return lint.returncode

    if not ensure_chromium():
        # Saying so loudly beats failing every browser test for a reason unrelated to the code.
        print("!! Debian's chromium is not installed and cannot be installed here (needs root and apt-get):\n"
              "!! the browser tests (-m e2e) are NOT run. Install it with: apt-get install chromium",
              file=sys.stderr, flush=True)
        argv = [*argv, "-m", "not e2e"] if "-m" not in argv else argv

    ensure_axe()

    from project import database

    started_here = database.prepare()
    try:
        print("== pytest", flush=True)
        return subprocess.run([python, "-m", "pytest", *argv], cwd=ROOT).returncode
    finally:
        if started_here:
            from orchestrator import embedded

            embedded.stop(database.pgdata())


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


def ensure_chromium() -> bool:
    """The browser tests drive Debian's chromium (Playwright's own browser download does not work
    everywhere); install it when it is missing and this user can."""
    if shutil.which("chromium"):
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("== installing chromium for the browser tests (apt-get)", flush=True)
        subprocess.run("apt-get update -qq && apt-get install -y -qq chromium >/dev/null", shell=True)
    return shutil.which("chromium") is not None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
