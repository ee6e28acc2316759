"""Liveness and readiness probes.

``/healthz`` says only that this process answers (no database query: a slow database must not
get healthy web processes restarted). ``/readyz`` says whether the deployment can do work: the
database answers, some scheduler holds an unexpired lease, and at least one worker sent a
heartbeat recently. Each check reports ``ok`` and a message, so a failed probe says what failed.

Both are answered by :class:`ProbeMiddleware` before host validation and the HTTPS redirect:
load balancers and container runtimes probe by IP address over plain HTTP.
"""

from __future__ import annotations

from django.db import DatabaseError, connection
from django.http import JsonResponse

from orchestrator import clock, metrics
from orchestrator.conf import app_settings
from orchestrator.lease import SCHEDULER_LEASE
from orchestrator.states import LIVE_WORKER_STATES, sql_list


def _seconds(value: float) -> str:
    return f"{value:g} s"


# Workers whose heartbeat is recent, on the database clock (the heartbeat was written with it),
# or a test's pinned clock.
LIVE_WORKERS = f"""
SELECT count(*) FROM orchestrator_worker
 WHERE state IN ({sql_list(LIVE_WORKER_STATES)})
   AND heartbeat_at > COALESCE(%s::timestamptz, now()) - make_interval(secs => %s)
"""


def check_database() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return False, f"the database does not answer: {first_line}"
    return True, "the database answers"


def check_scheduler() -> tuple[bool, str]:
    # Compared with the database clock (the lease was written with it), or a test's pinned clock.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT holder, epoch, EXTRACT(EPOCH FROM expires_at - COALESCE(%s::timestamptz, now()))"
            " FROM orchestrator_lease WHERE name = %s",
            [clock.db_now_param(), SCHEDULER_LEASE],
        )
        row = cursor.fetchone()
    if row is None:
        return False, "no scheduler has ever held the lease: is a scheduler process running?"
    holder, epoch, remaining = row
    if remaining <= 0:
        return False, (f"the scheduler lease expired {_seconds(round(-remaining, 1))} ago "
                       f"(last holder {holder}): no scheduler is running")
    return True, f"the scheduler lease is held by {holder} (epoch {epoch})"


def check_workers() -> tuple[bool, str]:
    timeout = app_settings.HEARTBEAT_TIMEOUT_SECONDS
    with connection.cursor() as cursor:
        cursor.execute(LIVE_WORKERS, [clock.db_now_param(), timeout])
        live = cursor.fetchone()[0]
    if live == 0:
        return False, f"no worker has sent a heartbeat in the last {_seconds(timeout)}"
    return True, f"{live} worker{'s' if live != 1 else ''} sent a heartbeat in the last {_seconds(timeout)}"


def readiness() -> dict[str, dict]:
    checks = {}
    ok, message = check_database()
    checks["database"] = {"ok": ok, "message": message}
    for name, check in (("scheduler", check_scheduler), ("workers", check_workers)):
        if not ok:
            checks[name] = {"ok": False, "message": "not checked: the database does not answer"}
            continue
        try:
            passed, text = check()
        except DatabaseError as exc:
            passed, text = False, f"the check failed: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
        checks[name] = {"ok": passed, "message": text}
    return checks


def healthz(request):
    return JsonResponse({"status": "ok"})


def readyz(request):
    checks = readiness()
    ready = all(check["ok"] for check in checks.values())
    failed = [f"{name}: {check['message']}" for name, check in checks.items() if not check["ok"]]
    body = {"status": "ready" if ready else "unavailable", "checks": checks}
    if failed:
        body["failed"] = failed
    return JsonResponse(body, status=200 if ready else 503)


class ProbeMiddleware:
    """Answers the probes and /metrics ahead of the rest of the stack.

    Django's host validation would refuse a probe addressed to the container's IP, and the
    HTTPS redirect would turn a plain-HTTP probe into a 301; neither protects anything here.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        view = _probe_views().get(request.path_info)
        if view is not None and request.method in ("GET", "HEAD"):
            return view(request)
        return self.get_response(request)


def _probe_views():

    return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics.metrics_view}
