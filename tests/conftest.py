"""Shared fixtures: an injected clock, real child processes against the test database, and a
bounded wait for conditions that another process makes true."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from datetime import time as dtime
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg
import pytest

import tests.support.tasks_for_tests  # noqa: F401 - registers the test jobs in this process
from orchestrator import clock as process_clock
from orchestrator.clock import FakeClock
from orchestrator.database_url import format_database_url

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    # Hashing a password the production way costs about 0.4 s of CPU per user; tests hash with one
    # iteration, in hashes every process of a test verifies (tests/support/hashers.py).
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["tests.support.hashers.OneIterationPBKDF2", *settings.PASSWORD_HASHERS]

# Where the process clock of the time-sensitive tests stands. CI runs those tests again with
# ORCHESTRATOR_TEST_NOW set to instants that break code reading the real clock or doing local
# time arithmetic wrongly (late evening UTC, the DST changes, New Year): see .ci/run.
TEST_NOW_ENV = "ORCHESTRATOR_TEST_NOW"
DEFAULT_TEST_NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def test_instants() -> list[datetime]:
    """The instants the process clock is pinned at in tests marked ``time_sensitive``: the
    default, or each of the comma-separated ones in ORCHESTRATOR_TEST_NOW (each test then runs
    once per instant)."""
    values = [v.strip() for v in os.environ.get(TEST_NOW_ENV, "").split(",") if v.strip()]
    instants = []
    for value in values:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if when.tzinfo is None:
            raise pytest.UsageError(f"{TEST_NOW_ENV}={value!r} needs a UTC offset (e.g. 2026-12-31T23:30:00Z)")
        instants.append(when.astimezone(UTC))
    return instants or [DEFAULT_TEST_NOW]


def pytest_generate_tests(metafunc):
    instants = test_instants()
    if len(instants) > 1 and metafunc.definition.get_closest_marker("time_sensitive"):
        metafunc.parametrize("pinned_process_clock", instants, indirect=True,
                             ids=[f"at-{at:%Y%m%dT%H%MZ}" for at in instants])


def daily_fire_times(hour: int, minute: int, tz: str, after: datetime, count: int) -> list[datetime]:
    """An oracle for a daily ``minute hour * * *`` schedule: its next ``count`` fire times after
    ``after``, in UTC, worked out day by day with zoneinfo the way cron runs them. A local time
    that does not exist (spring forward) runs right after the gap, at the first valid minute of
    the next hour; a local time that happens twice (fall back) runs once, at the first."""
    zone = ZoneInfo(tz)
    found: list[datetime] = []
    day = after.astimezone(zone).date() - timedelta(days=1)
    while len(found) < count:
        local = datetime.combine(day, dtime(hour, minute), tzinfo=zone)
        if local.astimezone(UTC).astimezone(zone).time() != dtime(hour, minute):
            local = datetime.combine(day, dtime(hour + 1, 0), tzinfo=zone)  # in the gap
        at = local.astimezone(UTC)
        if at > after:
            found.append(at)
        day += timedelta(days=1)
    return found


@pytest.fixture(autouse=True)
def pinned_process_clock(request):
    """Tests marked ``time_sensitive`` (pages, API answers, metrics: code that reads
    ``clock.now()``) run with the process clock pinned, so they pass whatever the hour."""
    if request.node.get_closest_marker("time_sensitive") is None:
        yield None
        return
    at = getattr(request, "param", None) or test_instants()[0]
    audit = os.environ.get(CLOCK_AUDIT_ENV)
    with process_clock.pinned(_ReadCounting(at) if audit else FakeClock(at)) as pinned:
        yield pinned
    if audit:
        with open(audit, "a") as record:
            record.write(json.dumps({"test": request.node.nodeid, "reads": pinned.reads}) + "\n")


@pytest.fixture(autouse=True)
def no_look_at_table_growth(monkeypatch):
    """A worker or dispatcher looks, at most once a second, whether the job tables doubled since
    their statistics (orchestrator.analyze). In this process, where tests count a batch's
    statements and rows, whether a second passed between two batches is not the test's to decide:
    it never looks unless the test asks (tests/test_kept_plans.py). The roles that tests start as
    processes do look."""
    from orchestrator import analyze

    monkeypatch.setattr(analyze.Freshness, "check", lambda self, now: [])


# ORCHESTRATOR_CLOCK_AUDIT=<file>: each time-sensitive test appends to the file how often it read
# the pinned clock, to tell which tests need the mark (a test that never reads it runs the same
# at any instant, and need not run again at each instant of CI's clock pass).
CLOCK_AUDIT_ENV = "ORCHESTRATOR_CLOCK_AUDIT"


class _ReadCounting(FakeClock):
    reads = 0

    def now(self):
        self.reads += 1
        return super().now()

    def db_now(self):
        self.reads += 1
        return super().db_now()


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def test_database_url() -> str:
    """The URL of the database the tests use, for child processes."""
    from django.db import connection

    return format_database_url(connection.settings_dict)


test_database_url.__test__ = False  # not a test, despite its name


def data_dir() -> Path:
    """The data folder of this test process. Under pytest-xdist each worker has a test database
    of its own, whose ids repeat the other workers'; task logs are named by run and task run id,
    so each worker keeps them in a folder of its own."""
    base = Path(os.environ.get("ORCHESTRATOR_DATA_DIR") or ROOT / ".data")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return base / "test-workers" / worker if worker else base


@pytest.fixture(autouse=True, scope="session")
def _worker_data_dir():
    """The app's data folder (task logs) in this process; project.database keeps the embedded
    server where it is, so every worker talks to the one ./dev test started."""
    from django.conf import settings

    if os.environ.get("PYTEST_XDIST_WORKER"):
        settings.ORCHESTRATOR_DATA_DIR = data_dir()
    yield


def process_env(**extra) -> dict:
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": test_database_url(),
        "DEBUG": "1",
        "SECRET_KEY": "tests-only-secret-key",
        "ORCHESTRATOR_WEBHOOK_SECRET": "tests-only-webhook-secret",
        "PYTHONUNBUFFERED": "1",
        "ORCHESTRATOR_DATA_DIR": str(data_dir()),
        # The functions the tests' workers may run.
        "ORCHESTRATOR_JOB_MODULES": "workflows.jobs,tests.support.tasks_for_tests",
    })
    env.update({key: str(value) for key, value in extra.items()})
    return env


class Processes:
    """Starts ``manage.py`` commands as real processes and always stops them."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[subprocess.Popen] = []

    def start(self, *args: str, env: dict | None = None, name: str | None = None) -> subprocess.Popen:
        return self.start_python(str(ROOT / "manage.py"), *args, env=env, name=name or args[0])

    def start_python(self, *args: str, env: dict | None = None, name: str = "python") -> subprocess.Popen:
        """``python ARGS...`` as a real process in its own session, its output in a log file."""
        log_path = self.log_dir / f"{name}-{len(self.started)}.log"
        log_file = open(log_path, "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT, env=env or process_env(), stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.log_path = log_path
        proc.log_file = log_file
        self.started.append(proc)
        return proc

    @staticmethod
    def output(proc) -> str:
        return Path(proc.log_path).read_text(errors="replace")

    def send(self, proc, sig: int) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)

    def stop(self, proc, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        self.send(proc, sig)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.send(proc, signal.SIGKILL)
            return proc.wait(timeout=10)
        finally:
            proc.log_file.close()

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                self.send(proc, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.started:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.send(proc, signal.SIGKILL)
                proc.wait(timeout=10)
            proc.log_file.close()


@pytest.fixture
def processes(tmp_path):
    manager = Processes(tmp_path)
    yield manager
    manager.stop_all()


@pytest.fixture
def clock():
    return FakeClock(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))


@pytest.fixture(scope="session")
def embedded_database():
    """Without DATABASE_URL the tests use the standalone project's embedded PostgreSQL, started
    when the first test needs a database (never by collecting) and stopped at the end if this
    session started it (``./dev test`` starts it itself)."""
    from project import database

    started_here = database.prepare()
    yield
    if started_here:
        from django.db import connections

        from orchestrator import embedded

        connections.close_all()
        embedded.stop(database.pgdata())


@pytest.fixture(scope="session")
def django_db_setup(embedded_database, django_db_setup, django_db_blocker):
    """The test database, dropped at the end even if a process the tests stopped is still
    closing its session (PostgreSQL refuses to drop a database with sessions).

    It holds a trigger that rejects any change of state outside the table of orchestrator.states,
    made by any process (workers and schedulers the tests start included), for the whole suite."""
    from django.db import connection

    from tests.support.state_check import transition_trigger_sql

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        for statement in transition_trigger_sql():
            cursor.execute(statement)
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")


# The tests' own set-up writes rows in any state (a run that "already failed", a dead task run);
# such statements are let through the state-table trigger. A statement counts as the tests' own
# when the innermost code of the repository that issued it is in tests/ or the benchmarks, not
# the product.
_WRITE = re.compile(r"\s*(INSERT|UPDATE|WITH)\b", re.IGNORECASE)
_PRODUCT = str(ROOT / "orchestrator") + os.sep
_TOOLING = (str(ROOT / "tests") + os.sep, str(ROOT / "orchestrator" / "bench"))


def _set_up_by_tests() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_TOOLING):
            return True
        if filename.startswith(_PRODUCT):
            return False
        frame = frame.f_back
    return False


def _let_set_up_through(execute, sql, params, many, context):
    if not _WRITE.match(sql) or not _set_up_by_tests():
        return execute(sql, params, many, context)
    from tests.support.state_check import FIXTURE_SETTING

    raw = context["connection"].connection
    with raw.cursor() as cursor:
        cursor.execute("SELECT set_config(%s, 'on', false)", [FIXTURE_SETTING])
    try:
        return execute(sql, params, many, context)
    finally:
        # After an error the transaction is aborted and its rollback undoes the setting anyway.
        with contextlib.suppress(psycopg.Error), raw.cursor() as cursor:
            cursor.execute("SELECT set_config(%s, 'off', false)", [FIXTURE_SETTING])


def _wrap_connection(connection, **_):
    if _let_set_up_through not in connection.execute_wrappers:
        connection.execute_wrappers.append(_let_set_up_through)


@pytest.fixture(autouse=True, scope="session")
def _state_table_trigger_spares_test_set_up():
    """On every database connection of this process (each thread, and greenlet, has its own)."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    connection_created.connect(_wrap_connection)
    for connection in connections.all(initialized_only=True):
        _wrap_connection(connection)
    yield
    connection_created.disconnect(_wrap_connection)
