"""Each launcher (``./dev run``, i.e. ``manage.py up``, and ``deploy_local``), on each database (the
embedded one, and ``DATABASE_URL`` on a real server), with ``DEBUG`` on and off: started in a
terminal with the README's own commands (its "Your own PostgreSQL" section, read from the README),
it logs in and serves the dashboard with its CSS and JavaScript under the Content-Security-Policy.
Then it ends as launchers do end: its terminal closed (SIGHUP) or killed outright (SIGKILL). Either
way no process of its tree and no listening port remain within seconds, and the next start works.

The cells of one database share its data folder and its database, in this order: a fresh folder
and database first (the README's setup commands run once), and each SIGKILL followed by another
start, which must use what the killed one left (the embedded PostgreSQL keeps running).
"""

from __future__ import annotations

import fcntl
import http.client
import os
import pty
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import termios
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path

import psutil
import psycopg
import pytest

from orchestrator import embedded
from tests.conftest import ROOT, wait_for
from tests.support.pgcluster import OwnCluster

pytestmark = pytest.mark.slow

README = (ROOT / "README.md").read_text()
# What the project reads from the environment: the launchers get none of the test run's own.
PROJECT_VARIABLES = re.compile(r"^(DATABASE_URL|DEBUG|SECRET_KEY|ALLOWED_HOSTS|CSRF_TRUSTED_ORIGINS|STATIC_ROOT|"
                               r"SECURE_.*|BEHIND_HTTPS_PROXY|LOG_FORMAT|LOG_LEVEL|PORT|HOST|BIND|TEST_DATABASE_NAME|"
                               r"DJANGO_.*|ORCHESTRATOR_.*|METRICS_TOKEN|CONN_MAX_AGE)$")
GONE_WITHIN = 15.0  # seconds for every process of a tree to end and its port to close
SESSIONS: set[int] = set()  # of every launcher's tree: whatever a failed test leaves is killed at the end


def readme_block(title: str) -> list[str]:
    """The command lines of the README's ```sh block that starts with ``# title``."""
    found = re.search(rf"```sh\n# {re.escape(title)}\n(.*?)```", README, re.S)
    assert found, f"the README has no ```sh block titled {title!r}"
    return [line.strip() for line in found.group(1).splitlines() if line.strip()]


def first_commands() -> list[str]:
    """The two commands of the README's first lines, without their comments."""
    block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


@dataclass
class Cell:
    launcher: str  # "up" or "deploy_local"
    database: str  # "embedded" or "url"
    debug: bool
    ending: str  # "SIGHUP" (its terminal closed) or "SIGKILL"

    @property
    def id(self) -> str:
        return f"{self.launcher}-{self.database}-debug_{'on' if self.debug else 'off'}-{self.ending}"


# Per database: the production set first (its README block creates the admin), a SIGKILL before
# each next start, and last ./dev run closed by its terminal, which stops the embedded database.
CELLS = [Cell(launcher, database, debug, ending) for database in ("embedded", "url") for launcher, debug, ending in (
    ("deploy_local", True, "SIGHUP"), ("deploy_local", False, "SIGKILL"), ("up", False, "SIGKILL"), ("up", True, "SIGHUP"))]


@dataclass
class Database:
    """One database's data folder and server, shared by its cells."""
    kind: str
    data_dir: Path
    url: str = ""
    set_up: bool = False
    postmaster: int | None = None  # the embedded server a killed launcher left running

    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"


def shared_server_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def databases():
    """The embedded database's data folder, and a database of its own on a real server: the
    PostgreSQL on 127.0.0.1:5432 when one answers (as the README's example), else a server of
    the test's own."""
    root = Path(tempfile.mkdtemp(prefix="launch", dir="/tmp"))  # short: the embedded server's socket is in it
    cluster = None
    name = f"launchers_{secrets.token_hex(4)}"
    if shared_server_answers():
        admin_url = "postgres://postgres@127.0.0.1:5432/postgres"
        url = f"postgres://postgres@127.0.0.1:5432/{name}"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    else:
        cluster = OwnCluster()
        cluster.create_database(name)
        url = cluster.url(name)
    found = {"embedded": Database("embedded", root / "embedded"), "url": Database("url", root / "url", url=url)}
    yield found
    for line in survivors(SESSIONS):
        os.kill(int(line.split()[0]), signal.SIGKILL)
    try:
        if embedded.postmaster_state(found["embedded"].pgdata()) is not None:
            embedded.stop(found["embedded"].pgdata())
    finally:
        if cluster is not None:
            cluster.destroy()
        else:
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(root, ignore_errors=True)


class Terminal:
    """A pseudo-terminal a launcher runs in, as in a terminal window: its output is read as it
    comes, and closing it hangs the launcher up (SIGHUP), as closing the window does."""

    def __init__(self):
        self.master, self.slave = pty.openpty()
        self.buffer = bytearray()
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while not self.closing.is_set():
            readable, _, _ = select.select([self.master], [], [], 0.1)
            if not readable:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: nothing holds the terminal any more
                return
            if not data:
                return
            with self.lock:
                self.buffer += data

    @property
    def output(self) -> str:
        with self.lock:
            return self.buffer.decode(errors="replace").replace("\r\n", "\n")

    def run(self, script: str, env: dict) -> subprocess.Popen:
        """``sh -c script`` as the leader of a new session whose controlling terminal this is."""

        def take_terminal():
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        proc = subprocess.Popen(["sh", "-c", script], cwd=ROOT, env=env, stdin=self.slave, stdout=self.slave,
                                stderr=self.slave, start_new_session=True, preexec_fn=take_terminal)
        os.close(self.slave)
        return proc

    def close(self) -> None:
        self.closing.set()
        self.reader.join(timeout=5)
        os.close(self.master)


def launcher_env(database: Database, port: int) -> dict:
    env = {key: value for key, value in os.environ.items() if not PROJECT_VARIABLES.match(key)}
    env.update({"ORCHESTRATOR_DATA_DIR": str(database.data_dir), "PORT": str(port), "BIND": f"127.0.0.1:{port}",
                "PYTHONUNBUFFERED": "1"})
    return env


def script_for(cell: Cell, database: Database) -> tuple[str, str]:
    """The shell script of a cell, from the README's blocks, and the admin's password."""
    development = readme_block("development on your own PostgreSQL")
    production = readme_block("production mode")
    production_set = readme_block("the production set of processes")
    lines = []
    if cell.database == "url":
        (url_line,) = [line for line in development if line.startswith("export DATABASE_URL=")]
        lines.append(re.sub(r"=.*", f"='{database.url}'", url_line))
    if not cell.debug:
        lines += [line for line in production if line.startswith("export ")]
    if cell.launcher == "up":
        command = development[-1]
        assert command == production[-1] == first_commands()[0] == "./dev run"
    else:
        *setup, command = production_set
        if not database.set_up:
            lines += setup  # once per database: migrate, create the admin
    (password,) = re.findall(r"DJANGO_SUPERUSER_PASSWORD=(\S+)", " ".join(production_set))
    return "\n".join(["set -e", *lines, f"exec {command}"]), password


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Client:
    """HTTP with a cookie jar that keeps every cookie (Secure ones too, as a browser does for
    localhost), so a DEBUG-off start can be logged in to over plain HTTP."""

    def __init__(self, port: int):
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, form: dict | None = None) -> tuple[int, dict, str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Host": f"localhost:{self.port}"}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            for header in response.headers.get_all("Set-Cookie") or []:
                for name, morsel in SimpleCookie(header).items():
                    self.cookies[name] = morsel.value
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
        finally:
            connection.close()


def check_pages(port: int, password: str, debug: bool) -> None:
    """Log in as the admin, load the dashboard, its stylesheets and scripts, and an unknown page."""
    client = Client(port)
    status, headers, page = client.request("GET", "/login/")
    assert status == 200 and headers["content-type"].startswith("text/html"), (status, page[:500])
    assert "default-src 'self'" in headers["content-security-policy"]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    status, headers, _ = client.request("POST", "/login/", {"username": "admin", "password": password,
                                                            "csrfmiddlewaretoken": token})
    assert status == 302 and headers["location"] == "/", (status, headers)

    status, headers, page = client.request("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html"), (status, page[:500])
    assert "default-src 'self'" in headers["content-security-policy"]
    assert "<h1>Dashboard</h1>" in page and "admin" in page
    styles = re.findall(r'<link rel="stylesheet" href="([^"]+)"', page)
    scripts = re.findall(r'<script src="([^"]+)"', page)
    assert any("orchestrator/app" in url for url in styles) and any("orchestrator/app" in url for url in scripts)
    if not debug:  # fingerprinted names: the manifest of the collected files is in use
        assert any(re.search(r"/static/orchestrator/app\.[0-9a-f]{12}\.css$", url) for url in styles), styles
    for urls, kind in ((styles, "text/css"), (scripts, "text/javascript")):
        for url in urls:
            status, headers, body = client.request("GET", url)
            assert status == 200 and headers["content-type"].startswith(kind) and body, (url, status, headers)

    # The site's own 404 page, with the policy, and no list of the URL patterns, in either mode.
    status, headers, page = client.request("GET", "/no-such-page/")
    assert status == 404 and "default-src 'self'" in headers["content-security-policy"], (status, headers)
    assert "Not found" in page and "URLconf" not in page and "orchestrator:web" not in page


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def survivors(sessions: set[int]) -> list[str]:
    """Processes still running in any of these sessions (a zombie runs nothing and holds no port)."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(proc.pid) in sessions:
                found.append(f"{proc.pid} {proc.info['name']}")
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


def role_count(cell: Cell) -> int:
    """The launcher's own children: runserver, a scheduler (with the dispatcher's work) and a worker;
    or gunicorn, two schedulers, a dispatcher and three workers."""
    return 3 if cell.launcher == "up" else 7


def started(output: str, cell: Cell) -> bool:
    """Every role is in its loop (a stop then finds each draining, not half started)."""
    workers = 1 if cell.launcher == "up" else 3
    schedulers = 1 if cell.launcher == "up" else 2
    return (len(re.findall(r"orchestrator\.worker worker \S+ started:", output)) >= workers
            and len(re.findall(r"orchestrator\.scheduler scheduler \S+ started", output)) >= schedulers
            and (cell.launcher == "up" or "dispatcher started" in output))


@pytest.mark.parametrize("cell", CELLS, ids=[cell.id for cell in CELLS])
def test_a_launcher_started_as_the_readme_says_serves_the_dashboard_and_leaves_nothing_when_it_ends(cell, databases):
    database = databases[cell.database]
    port = free_port()
    script, password = script_for(cell, database)
    terminal = Terminal()
    began = time.monotonic()
    launcher = terminal.run(script, launcher_env(database, port))
    SESSIONS.add(launcher.pid)
    try:
        def ready():
            assert launcher.poll() is None, f"the launcher ended ({launcher.returncode}):\n{terminal.output}"
            return started(terminal.output, cell) and listening(port)

        wait_for(ready, timeout=240, interval=0.2, message=f"{cell.id} to start")
        database.set_up = True
        startup = time.monotonic() - began
        if database.kind == "embedded" and database.postmaster is not None:
            # The server a killed launcher left running is the one this start uses.
            assert embedded.postmaster_state(database.pgdata()) == "ready"
            assert postmaster_pid(database.pgdata()) == database.postmaster
        tree = process_tree(launcher.pid)
        assert len(psutil.Process(launcher.pid).children()) == role_count(cell), [proc.name() for proc in tree]
        sessions = {os.getsid(proc.pid) for proc in tree}
        SESSIONS.update(sessions)
        check_pages(port, password, cell.debug)
        ending = time.monotonic()
        if cell.ending == "SIGHUP":
            terminal.close()  # the window closes: the kernel hangs the launcher up
            assert launcher.wait(timeout=60) == 0, terminal.output
        else:
            launcher.kill()
            assert launcher.wait(timeout=10) == -signal.SIGKILL
        wait_for(lambda: not survivors(sessions) and not listening(port), timeout=GONE_WITHIN, interval=0.1,
                 message=f"every process of {cell.id} to end: {survivors(sessions)}, port open: {listening(port)}")
        print(f"\n  {cell.id}: up in {startup:.1f}s, gone {time.monotonic() - ending:.1f}s after the {cell.ending}")

        if cell.ending == "SIGKILL":
            # Each role drained as on a stop (the parent-death signal is a SIGTERM), said so in the
            # terminal, which is still open, and marked itself stopped.
            workers = 1 if cell.launcher == "up" else 3
            assert len(re.findall(r"orchestrator\.worker worker \S+ stopped after", terminal.output)) == workers, \
                terminal.output
        # (After a SIGHUP, the launcher's exit code 0 says that every process stopped cleanly: what
        # they wrote went to the closed terminal.)
        if database_answers(database):
            assert set(worker_states(database, {proc.pid for proc in tree}).values()) == {"stopped"}
        if database.kind == "embedded":
            if cell.ending == "SIGKILL" or cell.launcher == "deploy_local":
                # Nobody stopped the embedded server: the next start uses it.
                assert embedded.postmaster_state(database.pgdata()) == "ready"
                database.postmaster = postmaster_pid(database.pgdata())
            else:
                assert embedded.postmaster_state(database.pgdata()) is None, "./dev run stops the embedded server"
                database.postmaster = None
    finally:
        if not terminal.closing.is_set():
            terminal.close()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)


def connect(database: Database) -> psycopg.Connection:
    if database.kind == "embedded":
        host = embedded.database_settings(database.pgdata())["HOST"]
        return psycopg.connect(host=host, user="postgres", dbname=embedded.DATABASE_NAME, connect_timeout=5)
    return psycopg.connect(database.url, connect_timeout=5)


def database_answers(database: Database) -> bool:
    return database.kind != "embedded" or embedded.postmaster_state(database.pgdata()) == "ready"


def worker_states(database: Database, pids: set[int]) -> dict[int, str]:
    """The state each worker process of these pids left in the database."""
    with connect(database) as conn:
        rows = conn.execute("SELECT pid, state FROM orchestrator_worker WHERE pid = ANY(%s)", (list(pids),)).fetchall()
    assert rows, "the workers registered themselves"
    return dict(rows)


def postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().splitlines()[0])
