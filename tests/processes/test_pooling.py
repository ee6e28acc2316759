"""Work connections through PgBouncer in transaction mode, LISTEN on a direct connection or none.

The slow test runs the real thing: a PostgreSQL server of the test's own, Debian's pgbouncer in
front of it with a small pool, fifty worker processes and a dispatcher whose work connections go
through it, and a sampler of pg_stat_activity that counts the server's backends for the whole run.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test import override_settings

from orchestrator import db
from orchestrator.channels import LISTEN_APPLICATION_NAME, listen_params
from orchestrator.database_url import format_database_url, is_transaction_pooled, parse_database_url
from orchestrator.loop import Loop, Role
from tests.conftest import ROOT, process_env, wait_for
from tests.support.pgcluster import OwnCluster

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


# --- settings --------------------------------------------------------------------------------------


def test_pool_mode_transaction_turns_off_what_a_transaction_pooler_cannot_keep():
    database = parse_database_url("postgres://app:pw@pgbouncer.internal:6432/orch?pool_mode=transaction&sslmode=require")
    assert database["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert database["OPTIONS"] == {"sslmode": "require", "prepare_threshold": None}
    assert is_transaction_pooled(database)
    # Handed to a child process as a URL, the mark survives.
    again = parse_database_url(format_database_url(database))
    assert (again["HOST"], again["PORT"], again["NAME"]) == ("pgbouncer.internal", "6432", "orch")
    assert is_transaction_pooled(again)

    direct = parse_database_url("postgres://app@db/orch?pool_mode=session")
    assert not is_transaction_pooled(direct) and "prepare_threshold" not in direct["OPTIONS"]
    assert "pool_mode" not in format_database_url(direct)
    sockets = parse_database_url(format_database_url(parse_database_url("postgres://u@/orch?host=/run/pg&pool_mode=transaction")))
    assert sockets["HOST"] == "/run/pg" and is_transaction_pooled(sockets)


def test_an_unknown_pool_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="pool_mode='statement'.*session, transaction"):
        parse_database_url("postgres://u@h/db?pool_mode=statement")


def test_listen_goes_to_the_direct_url_or_nowhere_behind_a_transaction_pooler():
    # Not pooled, no setting: a connection like Django's own, named in pg_stat_activity.
    params = listen_params()
    assert params["dbname"] == connection.settings_dict["NAME"]
    assert params["application_name"] == LISTEN_APPLICATION_NAME
    with override_settings(ORCHESTRATOR_LISTEN_DATABASE_URL="postgres://app:pw@db.internal:5432/orch"):
        params = listen_params()
        assert {key: params[key] for key in ("host", "port", "dbname", "user", "password")} == {
            "host": "db.internal", "port": "5432", "dbname": "orch", "user": "app", "password": "pw"}
    with override_settings(ORCHESTRATOR_LISTEN_DATABASE_URL="poll"):
        assert listen_params() is None
    pooled = {**connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS": True}
    original = connection.settings_dict
    connection.settings_dict = pooled
    try:
        assert listen_params() is None
    finally:
        connection.settings_dict = original


class _Idle(Role):
    role = "idle"
    channels = ("orchestrator_test_idle",)

    def tick(self) -> bool:
        return False


@pytest.mark.django_db  # the loop looks at its connections' age (CONN_MAX_AGE) as it turns
def test_a_loop_without_listen_polls_and_says_so_once(caplog):
    loop = Loop(_Idle(), poll=0.01, max_seconds=0.2, handle_signals=False)
    with override_settings(ORCHESTRATOR_LISTEN_DATABASE_URL="poll"), caplog.at_level("INFO", "orchestrator.loop"):
        loop.run()
    assert loop.polling and loop.listener is None
    said = [record for record in caplog.records if getattr(record, "action", "") == "listen_off"]
    assert len(said) == 1 and "looking for work every 0.01s" in said[0].getMessage()


def test_a_bad_listen_url_is_a_check_error_not_a_traceback():
    with override_settings(ORCHESTRATOR_LISTEN_DATABASE_URL="mysql://db/orch"):
        errors = [m for m in run_checks() if m.id == "orchestrator.E010"]
    assert len(errors) == 1 and "must start with postgres://" in errors[0].msg
    with override_settings(ORCHESTRATOR_LISTEN_DATABASE_URL="postgres://app@pgbouncer:6432/orch?pool_mode=transaction"):
        errors = [m for m in run_checks() if m.id == "orchestrator.E010"]
    assert len(errors) == 1 and "direct connection" in errors[0].msg


# --- fifty workers through PgBouncer ----------------------------------------------------------------

POOL_SIZE = 10
WORKERS = 50  # of concurrency 2: 100 task slots
JOBS = 2000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Bouncer:
    """Debian's pgbouncer in transaction mode in front of one database of ``cluster``, at most
    ``pool_size`` server connections, on a free local port."""

    def __init__(self, cluster: OwnCluster, dbname: str, pool_size: int):
        self.dir = Path(tempfile.mkdtemp(prefix="pgb", dir="/tmp"))
        self.port = _free_port()
        self.dbname = dbname
        (self.dir / "userlist.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(f"""\
[databases]
{dbname} = host={cluster.host} dbname={dbname} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
pool_mode = transaction
default_pool_size = {pool_size}
max_db_connections = {pool_size}
reserve_pool_size = 0
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
""")
        command = [PGBOUNCER]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root: as the cluster's own user
            user = cluster.server.system_user or "nobody"
            os.chmod(self.dir, 0o755)
            command += ["-u", user]
            for path in self.dir.iterdir():
                os.chown(path, pwd.getpwnam(user).pw_uid, -1)
        self.log = open(self.dir / "pgbouncer.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([*command, str(self.dir / "pgbouncer.ini")], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

        def accepting():
            try:
                with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname,
                                     connect_timeout=2) as conn:
                    return conn.execute("SELECT 1").fetchone()
            except psycopg.OperationalError:
                assert self.proc.poll() is None, self.output()
                return None

        wait_for(accepting, timeout=30, interval=0.1, message="pgbouncer to accept connections")

    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}?pool_mode=transaction"

    def output(self) -> str:
        return (self.dir / "pgbouncer.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# Backends of the database by kind: the LISTEN connections name themselves; the others are the
# pool's server connections. The sampler's own backend is left out.
BACKENDS = """
SELECT count(*) FILTER (WHERE application_name = %(listen)s),
       count(*) FILTER (WHERE application_name IS DISTINCT FROM %(listen)s)
FROM pg_stat_activity
WHERE datname = %(db)s AND backend_type = 'client backend' AND pid <> pg_backend_pid()
"""


@pytest.mark.slow
@pytest.mark.own_server
@pytest.mark.pgbouncer
def test_fifty_workers_share_a_pool_of_ten_server_connections_and_run_every_job_once(processes, tmp_path):
    if not os.access(PGBOUNCER, os.X_OK):
        pytest.fail(f"pgbouncer is not installed at {PGBOUNCER} (apt-get install pgbouncer)")
    cluster = OwnCluster()
    bouncer = None
    dbname = "pooled"
    try:
        cluster.create_database(dbname)
        direct = cluster.url(dbname)
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input", "-v", "0"], cwd=ROOT,
                       env=process_env(DATABASE_URL=direct), check=True, timeout=180)
        bouncer = Bouncer(cluster, dbname, POOL_SIZE)
        env = process_env(DATABASE_URL=bouncer.url(), ORCHESTRATOR_LISTEN_DATABASE_URL=direct)
        record = tmp_path / "executions.jsonl"

        fleet = processes.start_python("-m", "tests.support.fleet_for_tests", str(WORKERS), "2", env=env, name="fleet")
        dispatcher = processes.start("dispatcher", env=env)
        enqueuer = processes.start("shell", "-c", (
            "from django.db import transaction\n"
            "from orchestrator.jobs import enqueue\n"
            f"for start in range(0, {JOBS}, 250):\n"
            "    with transaction.atomic():\n"
            f"        for i in range(start, min(start + 250, {JOBS})):\n"
            f"            enqueue('tests.support.tasks_for_tests:record_job', kwargs={{'path': {str(record)!r}, 'tag': f'j{{i}}'}})\n"
        ), env=env, name="enqueue")

        most_listen = most_work = 0
        with cluster.connect(dbname, autocommit=True) as sampler:
            def count(sql):
                return sampler.execute(sql).fetchone()[0]

            deadline = time.monotonic() + 150
            while time.monotonic() < deadline:  # bounded: sample until every job finished
                listen, work = sampler.execute(BACKENDS, {"listen": LISTEN_APPLICATION_NAME, "db": dbname}).fetchone()
                most_listen, most_work = max(most_listen, listen), max(most_work, work)
                for proc in (fleet, dispatcher):
                    assert proc.poll() is None, processes.output(proc) + bouncer.output()
                if enqueuer.poll() not in (None, 0):
                    raise AssertionError(processes.output(enqueuer))
                if count("SELECT count(*) FROM orchestrator_taskrun WHERE state = 'succeeded'") == JOBS:
                    break
                time.sleep(0.05)
            else:
                states = sampler.execute("SELECT state, count(*) FROM orchestrator_taskrun GROUP BY state").fetchall()
                raise AssertionError(f"not every job finished: {states}\n{processes.output(dispatcher)}")
            live = count("SELECT count(*) FROM orchestrator_worker WHERE state = 'running'")
            attempts = sampler.execute("SELECT count(*), count(DISTINCT task_run_id), count(*) FILTER "
                                       "(WHERE outcome = 'succeeded') FROM orchestrator_attempt").fetchone()

        # Its last commit can be seen (every job done) before the process has exited: wait for
        # the exit, bounded, rather than stopping it mid-way.
        assert enqueuer.wait(timeout=60) == 0, processes.output(enqueuer)
        assert live == WORKERS
        # Every job ran once: one attempt each in the tables, one start each in the tasks' own record.
        assert attempts == (JOBS, JOBS, JOBS)
        starts = Counter(json.loads(line)["task"] for line in record.read_text().splitlines()
                         if json.loads(line)["event"] == "start")
        assert len(starts) == JOBS and set(starts.values()) == {1}
        # The pool bounds the work connections of 51 processes; only the LISTEN ones are direct.
        assert 1 <= most_work <= POOL_SIZE, most_work
        assert most_listen <= WORKERS + 1, most_listen
        assert most_work + most_listen <= POOL_SIZE + WORKERS + 1
        # The workers drain and leave on SIGTERM through the pooler too.
        assert processes.stop(fleet, timeout=60) == 0, processes.output(fleet)
        assert processes.stop(dispatcher) == 0, processes.output(dispatcher)
        for proc in (fleet, dispatcher):
            assert "Traceback" not in processes.output(proc), processes.output(proc)
    finally:
        processes.stop_all()
        if bouncer is not None:
            bouncer.stop()
        cluster.destroy()


# --- prepared statements through the pooler ----------------------------------------------------------


def test_prepared_statements_behind_a_transaction_pooler_are_a_setting_off_by_default(monkeypatch):
    assert db._prepared()  # a direct connection: always
    original = connection.settings_dict
    connection.settings_dict = {**original, "DISABLE_SERVER_SIDE_CURSORS": True}
    try:
        assert not db._prepared()  # the safe default for poolers before PgBouncer 1.21
        with override_settings(ORCHESTRATOR_POOLER_PREPARED_STATEMENTS=True):
            assert db._prepared()
        monkeypatch.setenv("ORCHESTRATOR_POOLER_PREPARED_STATEMENTS", "on")
        assert db._prepared()
    finally:
        connection.settings_dict = original
    monkeypatch.setenv("ORCHESTRATOR_POOLER_PREPARED_STATEMENTS", "sometimes")
    errors = [m.msg for m in run_checks() if "POOLER_PREPARED_STATEMENTS" in m.msg]
    assert errors == ["the environment variable ORCHESTRATOR_POOLER_PREPARED_STATEMENTS is 'sometimes': it must be "
                      "on or off (true/false, yes/no, 1/0 in the environment)"]


@pytest.mark.slow
@pytest.mark.own_server
@pytest.mark.pgbouncer
def test_a_pooler_that_cannot_keep_prepared_statements_stops_the_workers_with_a_message_naming_the_setting(processes):
    """Debian's PgBouncer 1.18 passes psycopg's prepared statements through to whichever server
    connection a transaction gets: with one server connection, the second worker's claim finds the
    first one's statement name taken. With the setting on, that is a configuration error (exit 78,
    one line), not an outage retried forever; off, the same fleet works (see the fifty workers)."""
    if not os.access(PGBOUNCER, os.X_OK):
        pytest.fail(f"pgbouncer is not installed at {PGBOUNCER} (apt-get install pgbouncer)")
    version = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True).stdout.split()[1]
    if tuple(int(part) for part in version.split(".")[:2]) >= (1, 21):
        pytest.skip(f"PgBouncer {version} keeps prepared statements: this test is for older ones")
    cluster = OwnCluster()
    bouncer = None
    dbname = "prepared"
    try:
        cluster.create_database(dbname)
        direct = cluster.url(dbname)
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input", "-v", "0"], cwd=ROOT,
                       env=process_env(DATABASE_URL=direct), check=True, timeout=180)
        bouncer = Bouncer(cluster, dbname, pool_size=1)
        env = process_env(DATABASE_URL=bouncer.url(), ORCHESTRATOR_LISTEN_DATABASE_URL=direct,
                          ORCHESTRATOR_POOLER_PREPARED_STATEMENTS="on")
        workers = [processes.start("worker", "--concurrency", "1", env=env, name=f"worker{i}") for i in range(2)]
        wait_for(lambda: any(worker.poll() is not None for worker in workers), timeout=60,
                 message="a worker to stop on the pooler's lost prepared statement")
        stopped = next(worker for worker in workers if worker.poll() is not None)
        output = processes.output(stopped)
        assert stopped.returncode == 78, output
        assert "ORCHESTRATOR_POOLER_PREPARED_STATEMENTS is on, but the pooler" in output, output
        assert "PgBouncer 1.21 or later with max_prepared_statements" in output, output
        assert "Traceback" not in output, output
    finally:
        processes.stop_all()
        if bouncer is not None:
            bouncer.stop()
        cluster.destroy()
