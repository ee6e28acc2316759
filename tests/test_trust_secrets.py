"""Secrets: the installation's own SECRET_KEY, the webhook secret, what a shell task's command
sees, who may read task logs and declared environment values."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import override_settings

from orchestrator import checks, logs
from orchestrator.conf import app_settings
from orchestrator.models import Attempt, Run, TaskRun, Worker, Workflow, WorkflowVersion
from orchestrator.runs import create_run
from tests.conftest import ROOT, process_env, wait_for
from tests.support.api_support import client_for, make_user

# --- the SECRET_KEY --------------------------------------------------------------------------------


def settings_secret_key(data_dir, **env) -> str:
    """The SECRET_KEY the standalone project's settings hold, in a fresh process."""
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ORCHESTRATOR_DATA_DIR": str(data_dir), **env}
    result = subprocess.run([sys.executable, "-c", "import project.settings as s; print(s.SECRET_KEY)"],
                            cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_each_installation_makes_its_own_secret_key_on_first_start_and_keeps_it(tmp_path):
    first = settings_secret_key(tmp_path / "one")
    key_file = tmp_path / "one" / "secret-key"
    assert len(first) >= 50 and key_file.read_text().strip() == first
    assert mode(key_file) == 0o600, "only the service user may read the key"
    assert settings_secret_key(tmp_path / "one") == first, "the next start reuses the key"
    # Another installation (data folder) has another key; DEBUG with an external database too.
    other = settings_secret_key(tmp_path / "two", DATABASE_URL="postgres://u@db/x", DEBUG="1")
    assert other not in ("", first)


def test_the_secret_key_variable_wins_and_production_makes_no_key(tmp_path):
    assert settings_secret_key(tmp_path / "env", SECRET_KEY="k" * 50) == "k" * 50
    assert not (tmp_path / "env" / "secret-key").exists()
    # With DATABASE_URL and DEBUG off the processes may be on several machines: the key must be
    # set (check orchestrator.E002), never made up by one of them.
    assert settings_secret_key(tmp_path / "prod", DATABASE_URL="postgres://u@db/x", DEBUG="0") == ""
    assert not (tmp_path / "prod" / "secret-key").exists()


# --- the webhook secret ----------------------------------------------------------------------------


def test_the_webhook_secret_is_its_own_and_required_in_production(settings, monkeypatch):
    monkeypatch.delenv("ORCHESTRATOR_WEBHOOK_SECRET", raising=False)
    # A project that sets none (the standalone project's settings make one in its data folder).
    del settings.ORCHESTRATOR_WEBHOOK_SECRET
    settings.SECRET_KEY = "s" * 50
    assert app_settings.WEBHOOK_SECRET == "", "never the SECRET_KEY by default"
    settings.DEBUG = True
    assert checks.check_secrets() == []
    settings.DEBUG = False
    assert [p.id for p in checks.check_secrets()] == ["orchestrator.E008"]
    settings.ORCHESTRATOR_WEBHOOK_SECRET = "s" * 50
    assert [p.id for p in checks.check_secrets()] == ["orchestrator.E009"]
    settings.ORCHESTRATOR_WEBHOOK_SECRET = "w" * 50
    assert checks.check_secrets() == []


# --- shell tasks and task logs ---------------------------------------------------------------------

COMMAND = "env | sort"


@pytest.mark.django_db(transaction=True)
def test_a_shell_task_sees_the_allow_list_and_its_declared_env_only_in_a_private_log(processes, tmp_path):
    data_dir = tmp_path / "data"
    (data_dir / "logs").mkdir(parents=True)
    os.chmod(data_dir / "logs", 0o755)  # made by an earlier version, open to all
    env = process_env(ORCHESTRATOR_DATA_DIR=str(data_dir), WORKER_ONLY_VARIABLE="worker-secret-value",
                      ORCHESTRATOR_POLL_SECONDS="0.5")
    processes.start("dispatcher", env=env)
    worker = processes.start("worker", "--queues", "default", "--concurrency", "1", env=env)
    wait_for(lambda: Worker.objects.filter(pid=worker.pid, state="running").exists(), 20, message="the worker")

    workflow = Workflow.objects.create(name="env-probe")
    tasks = {"probe": {"kind": "shell", "command": COMMAND, "env": {"API_PASSWORD": "declared-secret-value"},
                       "upstream": []}}
    version = WorkflowVersion.objects.create(workflow=workflow, number=1, hash="env-probe", spec={"tasks": tasks})
    run, _ = create_run(None, trigger="job", tasks=tasks, version=version)
    wait_for(lambda: Run.objects.get(pk=run.pk).state not in ("pending", "running"), 30, message="the run")
    task_run = TaskRun.objects.get(run=run)
    assert task_run.state == "succeeded", task_run.error
    attempt = Attempt.objects.get(task_run=task_run)

    with override_settings(ORCHESTRATOR_DATA_DIR=data_dir):
        text, _, _ = logs.read(attempt)
        path = logs.local_path(attempt.log_path)
    variables = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert variables["API_PASSWORD"] == "declared-secret-value"
    assert variables["PATH"] == env["PATH"] and variables["RUN_ID"] == str(run.pk)
    for name in ("WORKER_ONLY_VARIABLE", "DATABASE_URL", "SECRET_KEY", "ORCHESTRATOR_WEBHOOK_SECRET"):
        assert name not in variables, f"{name} of the worker reached the task"
    allowed = {*app_settings.SHELL_ENV_ALLOW, "API_PASSWORD", "RUN_ID", "TASK", "ATTEMPT", "LOGICAL_DATE",
               "PWD", "SHLVL", "_"}  # the last three are the shell's own
    assert set(variables) <= allowed, set(variables) - allowed

    # The log and every folder up to the log root: the service user's only.
    assert mode(path) == 0o600
    folder = os.path.dirname(path)
    while True:
        assert mode(folder) == 0o700, folder
        if os.path.samefile(folder, data_dir / "logs"):
            break
        folder = os.path.dirname(folder)


@pytest.mark.django_db
def test_declared_env_values_are_hidden_in_the_api():
    workflow = Workflow.objects.create(name="env-shown")
    tasks = {"probe": {"kind": "shell", "command": COMMAND, "env": {"API_PASSWORD": "declared-secret-value"},
                       "upstream": []}}
    version = WorkflowVersion.objects.create(workflow=workflow, number=1, hash="env-shown", spec={"tasks": tasks})
    run, _ = create_run(None, trigger="job", tasks=tasks, version=version)
    task_run = TaskRun.objects.get(run=run)
    for role in ("viewer", "operator"):
        user = make_user(f"env-{role}", {"viewer": "Viewers", "operator": "Operators"}[role])
        response = client_for(user).get(f"/api/task-runs/{task_run.pk}/")
        assert response.status_code == 200
        assert "declared-secret-value" not in response.content.decode()
        assert response.json()["spec"]["env"] == {"API_PASSWORD": "(hidden)"}
        assert response.json()["spec"]["command"] == COMMAND


# --- API tokens ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_api_tokens_are_stored_as_hashes_only(capsys):
    from knox.models import AuthToken

    call_command("create_token", "tess", "--create", "--role", "viewer")
    key = capsys.readouterr().out.strip()
    assert len(key) >= 32
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM knox_authtoken")
        stored = " ".join(str(value) for row in cursor.fetchall() for value in row)
    assert key not in stored, "the key itself is never stored"
    assert AuthToken.objects.get(user__username="tess").expiry is None, "an API token does not expire"
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/runs/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION=f"Token {key[:-1]}x")
    assert client.get("/api/runs/").status_code == 401


@pytest.mark.django_db
@pytest.mark.parametrize("header", [b"Token \xff\xfe", b"Token abc\x01def", "Token ünïcode".encode()])
def test_a_token_that_is_not_plain_text_is_a_401_not_a_500(header):
    response = client_for(None).get("/api/runs/", HTTP_AUTHORIZATION=header.decode("latin-1"))
    assert response.status_code == 401


@pytest.mark.django_db(transaction=True)
def test_the_plain_text_tokens_of_before_keep_working_hashed():
    """The migration turns each rest_framework.authtoken token into a hashed one with the same key."""
    from django.db.migrations.executor import MigrationExecutor

    user = make_user("legacy", "Viewers")
    key = "0123456789abcdef0123456789abcdef01234567"
    executor = MigrationExecutor(connection)
    executor.migrate([("orchestrator", "0011_dispatch_key_index")])
    try:
        with connection.cursor() as cursor:
            cursor.execute('CREATE TABLE IF NOT EXISTS authtoken_token ("key" varchar(40) PRIMARY KEY, '
                           '"created" timestamptz NOT NULL, "user_id" integer NOT NULL UNIQUE)')
            cursor.execute("INSERT INTO authtoken_token VALUES (%s, now(), %s)", [key, user.pk])
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM authtoken_token")
        assert cursor.fetchone()[0] == 0, "no plain-text token is left"
        cursor.execute("DROP TABLE authtoken_token")
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/runs/").status_code == 200


# --- login throttling ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_wrong_passwords_lock_that_user_out_from_that_address_only(settings):
    from django.test import Client
    from django.urls import reverse

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast, tests only
    make_user("lena", "Viewers", password="lena-password")
    make_user("otto", "Viewers", password="otto-password")
    login = reverse("orchestrator:web:login")

    def attempt(username, password, address="203.0.113.7"):
        return Client(REMOTE_ADDR=address).post(login, {"username": username, "password": password})

    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt("lena", "guess").status_code == 200  # the form again, with its error
    locked = attempt("lena", "guess")
    assert locked.status_code == 429
    right_password = attempt("lena", "lena-password")
    assert right_password.status_code == 429, "locked out: even the right password is refused for now"
    assert "too many" in right_password.content.decode().lower()
    # Another address for the same user, and another user from the same address, still log in.
    assert attempt("lena", "lena-password", address="198.51.100.9").status_code == 302
    assert attempt("otto", "otto-password").status_code == 302
    # The admin's login page counts too.
    admin = Client(REMOTE_ADDR="203.0.113.7").post("/admin/login/", {"username": "lena", "password": "lena-password"})
    assert admin.status_code == 429
