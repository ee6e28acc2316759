"""The deployment files and the production settings: compose.yaml, the Dockerfile, the container
health checks and ``check --deploy`` with the environment the README documents."""

import re
import secrets
import shutil
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
import yaml
from django.utils import timezone

from orchestrator.models import Worker
from tests.conftest import ROOT, process_env

DOCKER = ROOT / "docker"
ROLE_SERVICES = ("web", "scheduler", "dispatcher", "worker", "worker-batch")


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def replicas(service: dict) -> int:
    return int(service.get("deploy", {}).get("replicas", 1))


def test_compose_runs_every_role_from_one_image_configured_by_the_environment():
    services = compose()["services"]
    assert set(services) == {"postgres", "migrate", *ROLE_SERVICES}

    commands = {name: " ".join(map(str, services[name]["command"])) for name in ("migrate", *ROLE_SERVICES)}
    assert commands["migrate"] == "sh -c python manage.py migrate --noinput && python manage.py sync_workflows"
    assert commands["web"].startswith("gunicorn project.wsgi --bind 0.0.0.0:8000 --workers ")
    assert commands["scheduler"] == "python manage.py scheduler"
    assert commands["dispatcher"] == "python manage.py dispatcher"
    assert commands["worker"].startswith("python manage.py worker --queues default --concurrency ")
    assert commands["worker-batch"].startswith("python manage.py worker --queues batch --concurrency ")
    # Two schedulers (one stands by), one dispatcher, two general workers and one batch worker.
    assert {name: replicas(services[name]) for name in ROLE_SERVICES} == {
        "web": 1, "scheduler": 2, "dispatcher": 1, "worker": 2, "worker-batch": 1,
    }

    for name in ("migrate", *ROLE_SERVICES):
        service = services[name]
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
        env = service["environment"]
        assert env["DATABASE_URL"].startswith("postgres://orchestrator:${POSTGRES_PASSWORD:?")
        assert env["DATABASE_URL"].endswith("@postgres:5432/orchestrator")
        assert env["SECRET_KEY"].startswith("${SECRET_KEY:?"), "the secret comes from the environment, never the file"
        assert env["ORCHESTRATOR_WEBHOOK_SECRET"].startswith("${ORCHESTRATOR_WEBHOOK_SECRET:?")
        assert env["LOG_FORMAT"] == "json"
        assert service["init"] is True, f"{name}: SIGTERM must reach the role through a real init"
    # Only the web server needs host names and the TLS settings.
    assert services["web"]["environment"]["ALLOWED_HOSTS"].startswith("${ALLOWED_HOSTS:?")
    assert "ALLOWED_HOSTS" not in services["worker"]["environment"]

    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ROLE_SERVICES:
        assert services[name]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}


def test_every_long_running_service_has_a_health_check():
    services = compose()["services"]
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"][1]
    expected = {"web": "web", "scheduler": "scheduler", "dispatcher": "dispatcher",
                "worker": "worker", "worker-batch": "worker"}
    for name, role in expected.items():
        check = services[name]["healthcheck"]
        assert check["test"] == ["CMD", "python", "/app/docker/healthcheck.py", role], name
        assert {"interval", "timeout", "retries"} <= set(check)
    assert services["migrate"]["healthcheck"] == {"disable": True}


def test_the_compose_file_passes_docker_compose_config_where_docker_runs():
    # Docker cannot run everywhere the tests do; the YAML checks above always run, and this
    # adds Docker's own validation where an engine answers.
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True, timeout=20).returncode != 0:
        assert compose()["name"] == "orchestrator"
        return
    env = {"POSTGRES_PASSWORD": "x", "SECRET_KEY": "y" * 50, "ORCHESTRATOR_WEBHOOK_SECRET": "z" * 50,
           "ALLOWED_HOSTS": "example.com", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([docker, "compose", "-f", str(DOCKER / "compose.yaml"), "config", "--quiet"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_image_runs_as_a_non_root_user_with_static_files_and_a_health_check():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.1[23]-slim", dockerfile, re.M)
    assert re.search(r"^USER orchestrator$", dockerfile, re.M)
    user_line = dockerfile.index("USER orchestrator")
    assert dockerfile.index("collectstatic --noinput") < user_line
    assert "pip install" in dockerfile
    assert re.search(r"^HEALTHCHECK .*docker/healthcheck\.py", dockerfile, re.M | re.S)
    assert re.search(r'^CMD \["gunicorn", "project\.wsgi"', dockerfile, re.M)
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".data", ".git", "docker/.env"} <= set(ignored)


def documented_production_env() -> dict:
    """The environment block of the README's "Running in production" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running in production", 1)[1]
    block = re.search(r"```sh\n(# production environment.*?)```", section, re.S).group(1)
    env = {}
    for line in block.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def test_check_deploy_passes_with_the_documented_production_environment():
    documented = documented_production_env()
    assert {"DATABASE_URL", "SECRET_KEY", "ORCHESTRATOR_WEBHOOK_SECRET", "ALLOWED_HOSTS", "DEBUG"} <= set(documented)
    env = {**documented, "SECRET_KEY": secrets.token_urlsafe(50),
           "ORCHESTRATOR_WEBHOOK_SECRET": secrets.token_urlsafe(50), "PATH": "/usr/bin:/bin",
           "ORCHESTRATOR_DATA_DIR": str(ROOT / ".data")}
    manage = [sys.executable, str(ROOT / "manage.py")]
    result = subprocess.run([*manage, "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout

    probe = ("import django; django.setup(); from django.conf import settings as s; print(s.DEBUG, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE,"
             " s.STORAGES['staticfiles']['BACKEND'], 'whitenoise.middleware.WhiteNoiseMiddleware' in s.MIDDLEWARE)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**env, "DJANGO_SETTINGS_MODULE": "project.settings"})
    assert result.stdout.split() == [
        "False", "True", "True", "project.staticfiles.ForgivingManifestStorage", "True"
    ], result.stderr


def test_check_deploy_passes_with_exactly_the_values_the_readme_shows():
    # The example as a reader copies it, placeholders and all: not one warning.
    env = {**documented_production_env(), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced).", result.stdout
    assert result.stderr == "", result.stderr


def test_check_deploy_names_what_is_missing_without_the_production_environment():
    env = {"DATABASE_URL": "postgres://u@db/x", "SECRET_KEY": secrets.token_urlsafe(50),
           "ALLOWED_HOSTS": "example.com", "PATH": "/usr/bin:/bin", "ORCHESTRATOR_DATA_DIR": str(ROOT / ".data")}
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "security.W004" in result.stderr and "security.W008" in result.stderr


def healthcheck(role: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DOCKER / "healthcheck.py"), role], env=process_env(**env),
                          capture_output=True, text=True, timeout=30)


@pytest.mark.django_db(transaction=True)
def test_the_worker_container_check_follows_this_hosts_heartbeat():
    result = healthcheck("worker")
    assert result.returncode == 1
    assert f"no worker on {socket.gethostname()} sent a heartbeat in the last 30 s" in result.stdout

    now = timezone.now()
    Worker.objects.create(name="elsewhere", host="other-host", pid=1, queues=["default"], started_at=now,
                          heartbeat_at=now)
    assert healthcheck("worker").returncode == 1, "another machine's worker says nothing about this one"
    Worker.objects.create(name="here", host=socket.gethostname(), pid=1, queues=["default"], started_at=now,
                          heartbeat_at=now - timedelta(seconds=2))
    result = healthcheck("worker")
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("healthy: 1 worker(s) on ")


def test_the_container_checks_report_an_unknown_role_and_a_missing_process():
    assert healthcheck("janitor").returncode == 2
    result = healthcheck("web", PORT="1")
    assert result.returncode == 1 and result.stdout.startswith("unhealthy: ")


@pytest.mark.slow
def test_roles_other_than_web_start_with_the_database_url_and_the_two_secrets_alone():
    env = {"DATABASE_URL": "postgres://u@db/x", "SECRET_KEY": secrets.token_urlsafe(50), "PATH": "/usr/bin:/bin",
           "ORCHESTRATOR_DATA_DIR": str(ROOT / ".data")}
    manage = [sys.executable, str(ROOT / "manage.py"), "check"]
    # Without the webhook secret, production refuses to start: webhook calls would be unsigned.
    result = subprocess.run(manage, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "(orchestrator.E008) ORCHESTRATOR_WEBHOOK_SECRET is not set and DEBUG is off" in result.stderr
    # Nor with the SECRET_KEY as the webhook secret.
    result = subprocess.run(manage, cwd=ROOT, env={**env, "ORCHESTRATOR_WEBHOOK_SECRET": env["SECRET_KEY"]},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "(orchestrator.E009) ORCHESTRATOR_WEBHOOK_SECRET is the SECRET_KEY" in result.stderr

    env["ORCHESTRATOR_WEBHOOK_SECRET"] = secrets.token_urlsafe(50)
    result = subprocess.run(manage, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # The web server, though, refuses to start without the host names it answers to.
    result = subprocess.run([sys.executable, "-c", "import project.wsgi"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "orchestrator.E005: ALLOWED_HOSTS is empty" in result.stderr
