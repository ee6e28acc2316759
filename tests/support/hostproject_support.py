"""Running the test suite's host project (tests/hostproject/: a shop with its own model, workflow
and django.tasks tasks) as separate processes on its own database, from this checkout or from a
fresh virtual environment with the built wheel."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import psycopg

HOSTPROJECT = Path(__file__).resolve().parent.parent / "hostproject"
PREFIX = "/ops/orchestrator/"


class HostProject:
    """The shop project with a database of its own on the test server."""

    def __init__(self, tmp_path: Path, python: str = sys.executable, directory: Path = HOSTPROJECT):
        from django.db import connection

        self.python = python
        self.directory = directory
        self.db = dict(connection.settings_dict)
        self.db_name = f"shop_{uuid.uuid4().hex[:12]}"
        self.tmp_path = tmp_path
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", str(tmp_path)),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "hostproject.settings",
            "SHOP_DB_NAME": self.db_name,
            "SHOP_DB_USER": self.db.get("USER") or "",
            "SHOP_DB_PASSWORD": self.db.get("PASSWORD") or "",
            "SHOP_DB_HOST": self.db.get("HOST") or "",
            "SHOP_DB_PORT": str(self.db.get("PORT") or ""),
            "SHOP_DATA_DIR": str(tmp_path / "shop-data"),
            "SHOP_STATIC_ROOT": str(tmp_path / "shop-static"),
            # Quick polling, so the test does not wait on timers.
            "ORCHESTRATOR_POLL_SECONDS": "0.2",
            "ORCHESTRATOR_HEARTBEAT_SECONDS": "0.5",
        }
        if python == sys.executable:
            # The app of this checkout, whatever checkout the environment's editable install names:
            # a folder holding only the package goes first on the path (not the repository, whose
            # own top-level packages the shop must not see).
            only_app = tmp_path / "app-of-this-checkout"
            only_app.mkdir(exist_ok=True)
            (only_app / "orchestrator").symlink_to(Path(__file__).resolve().parents[2] / "orchestrator")
            self.env["PYTHONPATH"] = str(only_app)

    # --- the database ------------------------------------------------------------------------

    def _server(self):
        return psycopg.connect(dbname="postgres", user=self.db.get("USER") or None,
                               password=self.db.get("PASSWORD") or None, host=self.db.get("HOST") or None,
                               port=self.db.get("PORT") or None, autocommit=True)

    def create_database(self) -> None:
        with self._server() as conn:
            conn.execute(f'CREATE DATABASE "{self.db_name}"')

    def drop_database(self) -> None:
        with self._server() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')

    def query(self, sql: str, params=()):
        with psycopg.connect(dbname=self.db_name, user=self.db.get("USER") or None,
                             password=self.db.get("PASSWORD") or None, host=self.db.get("HOST") or None,
                             port=self.db.get("PORT") or None, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    # --- processes ---------------------------------------------------------------------------

    def manage(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([self.python, "manage.py", *args], cwd=self.directory, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def shell(self, code: str, timeout: float = 120) -> str:
        result = self.manage("shell", "-c", code, timeout=timeout)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def start(self, processes, *args: str, name: str):
        log_path = self.tmp_path / f"{name}.log"
        log_file = open(log_path, "wb")  # noqa: SIM115 - closed by Processes
        proc = subprocess.Popen([self.python, "manage.py", *args], cwd=self.directory, env=self.env,
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        proc.log_path, proc.log_file = log_path, log_file
        processes.started.append(proc)
        return proc


class Browser:
    """A cookie-keeping HTTP client for the host project's runserver."""

    def __init__(self, base: str):
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
                                                  NoRedirect)

    def request(self, method: str, path: str, data: dict | None = None, headers: dict | None = None,
                form: bool = False):
        body = None
        headers = dict(headers or {})
        if data is not None:
            if form:
                body = urllib.parse.urlencode(data).encode()
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            else:
                body = json.dumps(data).encode()
                headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base + path, data=body, method=method, headers=headers)
        try:
            with self.opener.open(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read().decode()

    def answers(self, path: str = "/") -> bool:
        """Whether the server is up (a refused connection means it is still starting)."""
        try:
            return self.request("GET", path)[0] == 200
        except urllib.error.URLError:
            return False

    def log_in(self, login_path: str, username: str, password: str) -> None:
        status, _, html = self.request("GET", login_path)
        assert status == 200, html[:500]
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
        status, headers, _ = self.request("POST", login_path, {
            "csrfmiddlewaretoken": token, "username": username, "password": password,
        }, headers={"Referer": self.base + login_path}, form=True)
        assert status == 302, f"login failed with {status}"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
