"""What the console says is true and said once: `up` announces "Ready" when the web server listens,
with the time since the command started; a client error is one line without a traceback; a child
stopped by Ctrl-C is reported as stopped; a role started before the migrations names the command
to run."""

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from orchestrator.database_url import format_database_url
from tests.conftest import ROOT, process_env, wait_for
from tests.support.api_support import free_port


@pytest.fixture
def empty_database():
    """A database on the tests' server that no migration has touched."""
    name = f"unmigrated_{uuid.uuid4().hex[:10]}"
    server = format_database_url(connection.settings_dict, "postgres")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield format_database_url(connection.settings_dict, name)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.django_db
@pytest.mark.parametrize("role", [["worker"], ["dispatcher"], ["scheduler"], ["reaper", "--once"]])
def test_a_role_started_before_the_migrations_says_which_command_to_run(empty_database, role):
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *role], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=process_env(DATABASE_URL=empty_database))
    output = done.stdout + done.stderr
    assert done.returncode == 78, output  # EX_CONFIG: a supervisor does not restart it into the same error
    assert "the database is not migrated" in output and "Run `python manage.py migrate` first" in output, output
    assert "Traceback" not in output, output


def connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def status_of(opener, url: str, data: dict | None = None) -> int:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    try:
        with opener.open(url, data=body, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_up_is_ready_when_the_server_listens_logs_client_errors_once_and_stops_quietly(processes, tmp_path):
    # Signed in but in no group: every page answers 403 (a PermissionDenied raised in the view).
    get_user_model().objects.create_user("nogroup", password="no-group-password-1")
    port = free_port()
    env = process_env(ORCHESTRATOR_DATA_DIR=str(tmp_path / "data"))
    began = time.monotonic()
    up = processes.start("up", "--port", str(port), env=env)
    wait_for(lambda: "Ready in" in processes.output(up) or up.poll() is not None, timeout=180,
             message="up to say it is ready")
    seen = time.monotonic() - began
    assert connects(port), processes.output(up)  # said only once the web server listens
    output = processes.output(up)
    reported = float(re.search(r"Ready in ([\d.]+)s", output).group(1))
    # The time since the command started: not less than what the test waited, bar the time the
    # test took to see the line, and not more.
    assert seen - 3 <= reported <= seen + 0.5, (reported, seen)

    base = f"http://127.0.0.1:{port}"
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    assert status_of(opener, f"{base}/no-such-page/") == 404
    assert status_of(opener, f"{base}/login/") == 200
    token = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    status_of(opener, f"{base}/login/", {"username": "nogroup", "password": "no-group-password-1",
                                         "csrfmiddlewaretoken": token})  # then redirected to a page it may not see
    assert any(cookie.name == "sessionid" for cookie in jar)
    assert status_of(opener, f"{base}/workflows/") == 403
    wait_for(lambda: "/workflows/" in processes.output(up) and "/no-such-page/" in processes.output(up),
             timeout=30, message="the web server to log the answers")
    time.sleep(1)  # a second line, if one were logged, follows the first at once (not a clock)
    output = processes.output(up)
    assert len(re.findall(r"/no-such-page/", output)) == 1, output
    assert len(re.findall(r"Forbidden.*/workflows/|/workflows/ HTTP/1.1\" 403", output)) == 1, output
    assert "Traceback" not in output and "PermissionDenied" not in output, output

    # The roles are forks of up (they share its memory), each named for its role where ps shows it.
    roles = dict(re.findall(r"\[up\] started (\w+) pid (\d+)", output))
    # The dispatcher's work is done in the scheduler's process (scheduler --dispatch).
    commands = {"web": "runserver", "scheduler": "scheduler", "worker": "worker"}
    assert "dispatcher" not in roles
    for name, command in commands.items():
        assert (Path("/proc") / roles[name] / "comm").read_text().strip() == command
    # A role that dies is forked again.
    os.kill(int(roles["scheduler"]), signal.SIGKILL)
    wait_for(lambda: len(re.findall(r"\[up\] started scheduler pid", processes.output(up))) == 2, timeout=15,
             message="the scheduler to be started again")
    again = re.findall(r"\[up\] started scheduler pid (\d+)", processes.output(up))[-1]
    wait_for(lambda: (Path("/proc") / again / "comm").read_text().strip() == "scheduler", timeout=10,
             message="the new scheduler to run")

    stopping_from = len(processes.output(up))
    processes.send(up, signal.SIGINT)  # Ctrl-C in its terminal: the children have their own sessions
    assert up.wait(timeout=90) == 0, processes.output(up)
    output = processes.output(up)[stopping_from:]
    assert "exited with code -15" not in output and "killed" not in output, output
    for name in ("web", "scheduler", "worker"):
        assert re.search(rf"\[up\] {name} \(pid \d+\) (exited cleanly \(code 0\)|stopped by the SIGTERM the "
                         rf"supervisor sent)", output), output
