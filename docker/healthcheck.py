"""Container health checks (no Django start-up, so they stay cheap every 30 s).

    python docker/healthcheck.py web          the web server answers /healthz
    python docker/healthcheck.py worker       this container's worker sent a heartbeat recently
    python docker/healthcheck.py scheduler    the role's process is alive and the database answers
    python docker/healthcheck.py dispatcher   (same)

Exit status 0 is healthy, 1 unhealthy (with the reason on stdout, shown by ``docker inspect``).
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _connect():
    import psycopg  # noqa: PLC0415 - only the checks that reach the database load the driver

    from orchestrator.database_url import parse_database_url  # noqa: PLC0415 - importable once sys.path holds the project (above)

    db = parse_database_url(os.environ["DATABASE_URL"])
    return psycopg.connect(
        dbname=db["NAME"], user=db["USER"] or None, password=db["PASSWORD"] or None,
        host=db["HOST"] or None, port=db["PORT"] or None, connect_timeout=3, **db["OPTIONS"],
    )


def check_web() -> str:
    port = os.environ.get("PORT", "8000")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as response:
        if response.status != 200:
            raise RuntimeError(f"/healthz answered {response.status}")
    return "web answers /healthz"


def check_worker() -> str:
    timeout = float(os.environ.get("ORCHESTRATOR_HEARTBEAT_TIMEOUT_SECONDS", "30"))
    host = socket.gethostname()
    with _connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM orchestrator_worker WHERE host = %s AND state IN ('running', 'draining')"
            " AND heartbeat_at > now() - make_interval(secs => %s)", [host, timeout],
        ).fetchone()
    if not row[0]:
        raise RuntimeError(f"no worker on {host} sent a heartbeat in the last {timeout:g} s")
    return f"{row[0]} worker(s) on {host} heartbeating"


def check_process(role: str) -> str:
    # The role runs as a child of the container's init (compose sets init: true), so look for
    # it among the container's processes rather than at PID 1.
    found = False
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(arg.endswith(b"manage.py") for arg in argv) and role.encode() in argv:
                found = True
                break
    if not found:
        raise RuntimeError(f"no 'manage.py {role}' process is running")
    with _connect() as conn:
        conn.execute("SELECT 1")
    return f"{role} running, database answers"


def main(argv: list[str]) -> int:
    role = argv[1] if len(argv) > 1 else "web"
    try:
        if role == "web":
            message = check_web()
        elif role == "worker":
            message = check_worker()
        elif role in {"scheduler", "dispatcher"}:
            message = check_process(role)
        else:
            print(f"unknown role {role!r}: use web, worker, scheduler or dispatcher")
            return 2
    except Exception as exc:  # noqa: BLE001 - any failure is "unhealthy", with its reason
        print(f"unhealthy: {exc}")
        return 1
    print(f"healthy: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
