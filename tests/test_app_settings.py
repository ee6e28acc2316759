"""The app's settings: one object with defaults, overridden by the project's settings and by the
environment; documented in one table; and importing the app starts and connects to nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from orchestrator import checks, conf
from orchestrator.conf import app_settings

ROOT = Path(__file__).resolve().parent.parent


def test_a_setting_comes_from_settings_py_then_the_environment_then_the_default(settings, monkeypatch):
    monkeypatch.delenv("ORCHESTRATOR_LEASE_SECONDS", raising=False)
    assert app_settings.LEASE_SECONDS == 15.0
    monkeypatch.setenv("ORCHESTRATOR_LEASE_SECONDS", "20")
    assert app_settings.LEASE_SECONDS == 20.0
    settings.ORCHESTRATOR_LEASE_SECONDS = 7
    assert app_settings.LEASE_SECONDS == 7.0  # settings.py wins over the environment


def test_lists_limits_and_dicts_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("ORCHESTRATOR_WORKFLOW_MODULES", "shop.flows, billing.flows,")
    monkeypatch.setenv("ORCHESTRATOR_DEFAULT_QUEUE_LIMIT", "0")
    monkeypatch.setenv("ORCHESTRATOR_DEFAULT_TENANT_LIMIT", "4")
    monkeypatch.setenv("ORCHESTRATOR_LOG_STORAGE_OPTIONS", '{"bucket_name": "logs"}')
    assert app_settings.WORKFLOW_MODULES == ["shop.flows", "billing.flows"]
    assert app_settings.DEFAULT_QUEUE_LIMIT is None  # 0 means unlimited
    assert app_settings.DEFAULT_TENANT_LIMIT == 4
    assert app_settings.LOG_STORAGE_OPTIONS == {"bucket_name": "logs"}


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("ORCHESTRATOR_LEASE_SECONDS", "soon", "a positive number of seconds"),
    ("ORCHESTRATOR_LEASE_SECONDS", "-1", "a positive number of seconds"),
    ("ORCHESTRATOR_RETENTION_DAYS", "3.5", "a whole number"),
    ("ORCHESTRATOR_LOG_STORAGE_OPTIONS", "[1, 2]", "a dict"),
    ("ORCHESTRATOR_LOG_STORAGE_OPTIONS", "{not json", "a dict"),
])
def test_a_bad_value_in_the_environment_is_named_with_what_it_must_be(monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=f"environment variable {name} is .*{expected}"):
        getattr(app_settings, name.removeprefix("ORCHESTRATOR_"))
    problems = checks.check_configuration()
    assert [p.id for p in problems] == ["orchestrator.E007"] and name in problems[0].msg


def test_a_bad_value_in_settings_py_is_reported_by_the_system_check(settings):
    settings.ORCHESTRATOR_HEARTBEAT_SECONDS = "5"  # a string where a number belongs
    problems = checks.check_configuration()
    assert any(p.id == "orchestrator.E007" and "settings.ORCHESTRATOR_HEARTBEAT_SECONDS" in p.msg
               for p in problems)


def test_an_unknown_setting_name_is_an_error_not_a_silent_default():
    with pytest.raises(AttributeError, match="no orchestrator setting 'LEASE_SECOND'"):
        app_settings.LEASE_SECOND  # noqa: B018


def test_the_readme_documents_every_setting_with_its_default():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- settings: python -m orchestrator.conf -->\n", 1)[1].split("\n<!-- end", 1)[0]
    assert table == conf.markdown_table(), "regenerate the README's table with python -m orchestrator.conf"


def test_every_setting_the_app_reads_is_declared():
    used = set()
    for path in (ROOT / "orchestrator").rglob("*.py"):
        text = path.read_text()
        used |= {word.split(".", 1)[1] for word in text.replace("(", " ").replace(")", " ").split()
                 if word.startswith("app_settings.") and word.split(".", 1)[1].isidentifier()}
    assert used and used <= set(conf.OPTIONS_BY_NAME), used - set(conf.OPTIONS_BY_NAME)


def test_the_log_storage_can_be_a_storages_alias_of_the_project(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "logs": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path)}}}
    settings.ORCHESTRATOR_LOG_STORAGE = "logs"
    assert conf.log_storage().path("x.log") == str(tmp_path / "x.log")


def _quiet_env(tmp_path) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update({"ORCHESTRATOR_DATA_DIR": str(tmp_path / "data"), "DJANGO_SETTINGS_MODULE": "project.settings"})
    return env


IMPORT_EVERYTHING = """
import importlib, pkgutil, django
django.setup()
import orchestrator
names = [m.name for m in pkgutil.walk_packages(orchestrator.__path__, "orchestrator.")]
for name in names:
    importlib.import_module(name)
from django.db import connections
opened = [alias for alias in connections if connections[alias].connection is not None]
print(len(names), "modules; connections opened:", opened)
"""


def test_importing_every_module_of_the_app_starts_nothing_and_connects_nowhere(tmp_path):
    # The standalone project's settings without DATABASE_URL point at an embedded server in a
    # fresh data folder: importing must neither start it nor connect.
    result = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], cwd=ROOT, env=_quiet_env(tmp_path),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "connections opened: []" in result.stdout
    assert int(result.stdout.split()[0]) > 40
    assert not (tmp_path / "data" / "pgdata").exists(), "an import started the embedded PostgreSQL"


@pytest.mark.slow
def test_collecting_the_tests_starts_no_database(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                            cwd=ROOT, env=_quiet_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tests collected" in result.stdout
    assert not (tmp_path / "data" / "pgdata").exists(), "collecting the tests started the embedded PostgreSQL"
