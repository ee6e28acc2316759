"""The test command (``./dev test``): the linter, then the whole pytest suite.

Without DATABASE_URL the tests use the embedded PostgreSQL; if this command had to start it,
it stops it again at the end, so a developer's running ``./dev run`` is never disturbed.
"""

import os
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

    started_here = False
    pgdata = None
    if not os.environ.get("DATABASE_URL"):
        from orchestrator import embedded

        pgdata = embedded.default_pgdata()
        started_here = not embedded.is_running(pgdata)
        embedded.ensure_running(pgdata)
    try:
        print("== pytest", flush=True)
        return subprocess.run([python, "-m", "pytest", *argv], cwd=ROOT).returncode
    finally:
        if started_here:
            from orchestrator import embedded

            embedded.stop(pgdata)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
