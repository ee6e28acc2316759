"""What the launchers decide before they start anything, and what a start with DEBUG off serves:
``./dev run`` is development whatever the database; a production start names every missing
setting at once and starts nothing; an address in use or a database not migrated is refused up
front; outdated collected static files are collected again, and a static file still missing is a
404 for that file, never a server error of the page; the 404 page under DEBUG is the site's own;
an embedded server caught starting or stopping is waited for."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.contrib.staticfiles.storage import staticfiles_storage
from django.db import connection
from django.template import loader

from orchestrator import embedded, preflight
from orchestrator.database_url import format_database_url
from tests.conftest import ROOT, process_env

MANAGE = [sys.executable, str(ROOT / "manage.py")]


def settings_of(argv: list[str], data_dir: Path, **env) -> dict:
    """The standalone project's settings as a process started as ``manage.py ARGV`` sees them."""
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ORCHESTRATOR_DATA_DIR": str(data_dir), **env}
    probe = (f"import sys, json; sys.argv = {['manage.py', *argv]!r}; import project.settings as s; "
             "print(json.dumps({'DEBUG': s.DEBUG, 'SECRET_KEY': s.SECRET_KEY, 'ALLOWED_HOSTS': s.ALLOWED_HOSTS, "
             "'WEBHOOK_SECRET': getattr(s, 'ORCHESTRATOR_WEBHOOK_SECRET', '')}))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=environment, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_dev_run_is_the_development_command_whatever_the_database(tmp_path):
    url = "postgres://someone@db.example.com:5432/theirs"
    up = settings_of(["up"], tmp_path / "data", DATABASE_URL=url)
    assert up["DEBUG"] is True
    assert up["ALLOWED_HOSTS"] == ["localhost", "127.0.0.1", "[::1]"]
    # Its two secrets are the installation's own, made in the data folder and kept there.
    for name, value in (("secret-key", up["SECRET_KEY"]), ("webhook-secret", up["WEBHOOK_SECRET"])):
        path = tmp_path / "data" / name
        assert len(value) >= 50 and path.read_text().strip() == value
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert up["SECRET_KEY"] != up["WEBHOOK_SECRET"]
    assert settings_of(["up"], tmp_path / "data", DATABASE_URL=url) == up, "the next start keeps them"

    # Every command ./dev runs is development too.
    shell = subprocess.run([str(ROOT / "dev"), "manage", "shell", "-c", "from django.conf import settings as s; "
                            "print(s.DEBUG, s.SECRET_KEY == open(s.DATA_DIR / 'secret-key').read().strip())"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
                                "ORCHESTRATOR_DATA_DIR": str(tmp_path / "data"), "DATABASE_URL": url})
    assert shell.stdout.splitlines()[-1].split() == ["True", "True"], shell.stdout + shell.stderr

    # DEBUG set wins; any other command with DATABASE_URL is a production process: nothing is made up.
    assert settings_of(["up"], tmp_path / "prod", DATABASE_URL=url, DEBUG="0")["DEBUG"] is False
    production = settings_of(["deploy_local"], tmp_path / "prod", DATABASE_URL=url)
    assert production == {"DEBUG": False, "SECRET_KEY": "", "ALLOWED_HOSTS": [], "WEBHOOK_SECRET": ""}
    assert not (tmp_path / "prod").exists()


@pytest.mark.parametrize("launcher", ["up", "deploy_local"])
def test_a_production_start_names_every_missing_setting_at_once_and_starts_nothing(launcher, tmp_path):
    # A database nothing may connect to: the refusal comes before any role, migration or query.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ORCHESTRATOR_DATA_DIR": str(tmp_path / "data"),
           "DATABASE_URL": "postgres://nobody@127.0.0.1:9/nowhere", "DEBUG": "0"}
    result = subprocess.run([*MANAGE, launcher], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 78, result.stderr
    output = result.stdout + result.stderr
    assert output.count("CommandError") == 1 and "Traceback" not in output, output
    assert f"manage.py {launcher} started nothing: 3 problem(s) of the configuration to fix first (DEBUG is off" in output
    # Each with the command that makes a value.
    for check, command in (("orchestrator.E002", "export SECRET_KEY=\"$(python3 -c 'import secrets; print(secrets"),
                           ("orchestrator.E008", "export ORCHESTRATOR_WEBHOOK_SECRET=\"$(python3 -c"),
                           ("orchestrator.E005", "export ALLOWED_HOSTS=localhost,127.0.0.1")):
        assert check in output and command in output, (check, output)
    assert "started" not in output.replace("started nothing", "")
    assert not (tmp_path / "data").exists()


def listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("launcher", ["up", "deploy_local"])
def test_a_launcher_refuses_an_address_another_server_listens_on(launcher, tmp_path):
    with listening_socket() as taken:
        port = taken.getsockname()[1]
        option = ["--port", str(port)] if launcher == "up" else ["--bind", f"127.0.0.1:{port}"]
        result = subprocess.run([*MANAGE, launcher, *option], cwd=ROOT, capture_output=True, text=True, timeout=60,
                                env=process_env(ORCHESTRATOR_DATA_DIR=str(tmp_path / "data")))
    assert result.returncode == 78, result.stdout + result.stderr
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use): another server is listening there" \
        in result.stderr
    assert "[up] started" not in result.stderr and "[deploy_local] started" not in result.stderr


@pytest.fixture
def empty_database():
    """The URL of a database on the tests' server that no migration has touched."""
    name = f"launchers_empty_{secrets.token_hex(5)}"
    server = format_database_url(connection.settings_dict, "postgres")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield format_database_url(connection.settings_dict, name)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.django_db
def test_deploy_local_refuses_a_database_the_migrations_have_not_reached(empty_database, tmp_path):
    result = subprocess.run([*MANAGE, "deploy_local", "--web-workers", "0"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env=process_env(DATABASE_URL=empty_database,
                                                        ORCHESTRATOR_DATA_DIR=str(tmp_path / "data")))
    assert result.returncode == 78, result.stderr
    assert "the database is not migrated" in result.stderr and "Or start deploy_local with --migrate." in result.stderr
    assert "[deploy_local] started" not in result.stderr


# --- static files with DEBUG off -------------------------------------------------------------------

FORGIVING = {"default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
             "staticfiles": {"BACKEND": "project.staticfiles.ForgivingManifestStorage"}}


@pytest.mark.django_db
def test_a_static_file_missing_from_the_collected_files_is_a_warning_and_a_404_never_a_page_error(
        client, settings, tmp_path, caplog):
    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path / "never-collected"
    settings.STORAGES = FORGIVING
    with caplog.at_level(logging.WARNING, logger="project.staticfiles"):
        for _ in range(2):
            page = client.get("/login/")
            assert page.status_code == 200
            assert 'href="/static/orchestrator/app.css"' in page.content.decode()  # unversioned: a 404 of its own
    warnings = [r.getMessage() for r in caplog.records if r.name == "project.staticfiles"]
    # Once per file and process, naming the file and what to run.
    assert len([w for w in warnings if w.startswith("static file orchestrator/app.css ")]) == 1, warnings
    assert "Run `manage.py collectstatic`" in warnings[0]
    # The error pages name the stylesheet too, and render.
    assert "/static/orchestrator/app.css" in loader.get_template("500.html").render()
    # A name that is no static file of the project (whitenoise asks for such) is not reported.
    caplog.clear()
    assert staticfiles_storage.url("no/such/file.css") == "/static/no/such/file.css"
    assert not caplog.records


@pytest.mark.django_db
def test_collected_static_files_are_collected_again_only_when_outdated(settings, tmp_path):
    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path / "static"
    settings.STORAGES = FORGIVING
    said = []
    assert preflight.static_files_outdated() == f"there is no manifest of collected static files in {tmp_path / 'static'}"
    preflight.collect_static_files(said.append)
    assert said == [f"collecting the static files: there is no manifest of collected static files in "
                    f"{tmp_path / 'static'}"]
    manifest = tmp_path / "static" / "staticfiles.json"
    assert "orchestrator/app.css" in json.loads(manifest.read_text())["paths"]
    assert preflight.static_files_outdated() is None
    preflight.collect_static_files(said.append)
    assert len(said) == 1, "current files are not collected again"

    # A static file changed after the collection (a manifest older than it).
    os.utime(manifest, (time.time() - 10 * 365 * 86400,) * 2)
    assert re.fullmatch(rf"\S+ changed after it was collected in {re.escape(str(tmp_path / 'static'))}",
                        preflight.static_files_outdated())
    # A static file the manifest does not know (added since).
    manifest.write_text(json.dumps({"paths": {}, "version": "1.1"}))
    assert re.fullmatch(r"\S+ is not in the manifest of .*", preflight.static_files_outdated())


# --- the 404 page ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_404_page_under_debug_is_the_sites_own_with_the_policy(client, settings):
    settings.DEBUG = True
    # An address no URL pattern matches, to anyone; a page whose object does not exist, to a user.
    for who, path in (("anonymous", "/no-such-page/"), ("admin", "/no-such-page/"), ("admin", "/runs/987654321/")):
        if who == "admin":
            client.force_login(get_user_model().objects.get_or_create(username="boss", is_superuser=True)[0])
        page = client.get(path)
        body = page.content.decode()
        assert page.status_code == 404, (who, path)
        assert "<h1>Not found</h1>" in body and "URLconf" not in body and "orchestrator:web" not in body, body
        assert "default-src 'self'" in page.headers["Content-Security-Policy"], (who, path)


# --- the embedded server -----------------------------------------------------------------------------


def fake_postmaster(pgdata: Path, pid: int, state: str) -> None:
    """A postmaster.pid as PostgreSQL writes it, for a live process of ours."""
    pgdata.mkdir(parents=True, exist_ok=True)
    lines = [str(pid), str(pgdata), str(int(time.time())), "5432", str(pgdata), "", "  1234  5678", state]
    (pgdata / "postmaster.pid").write_text("\n".join(lines) + "\n")


def test_an_embedded_server_caught_stopping_is_waited_for_and_one_that_never_settles_is_reported(tmp_path):
    # A launcher killed during `pg_ctl stop` leaves a server "stopping" for a while.
    stand_in = subprocess.Popen(["sleep", "60"])
    try:
        fake_postmaster(tmp_path / "pgdata", stand_in.pid, "stopping")
        assert embedded.postmaster_state(tmp_path / "pgdata") == "stopping"
        with pytest.raises(RuntimeError, match=r"has been 'stopping' for 0.3s; its log is .*pgdata/log\. Stop it "
                                               r"with \./dev stop"):
            embedded.settle(tmp_path / "pgdata", timeout=0.3)
        # It ends (a zombie until this test collects it: ended all the same).
        ends = threading.Timer(0.5, stand_in.kill)
        ends.start()
        began = time.monotonic()
        assert embedded.settle(tmp_path / "pgdata", timeout=30) is None  # gone: the next start starts one
        assert 0.3 < time.monotonic() - began < 10
    finally:
        stand_in.kill()
        stand_in.wait()
