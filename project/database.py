"""The standalone project's database: any PostgreSQL through DATABASE_URL, else the embedded
server in the data folder, started here by the project's entry points (manage.py, wsgi.py,
asgi.py and the test command) before Django loads, and never by importing a module."""

import os
from pathlib import Path

from orchestrator import embedded

BASE_DIR = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """ORCHESTRATOR_DATA_DIR, by default the repository's .data folder."""
    return Path(os.environ.get("ORCHESTRATOR_DATA_DIR") or BASE_DIR / ".data").resolve()


def pgdata() -> Path:
    return data_dir() / "pgdata"


def uses_embedded() -> bool:
    return not os.environ.get("DATABASE_URL", "").strip()


def prepare() -> bool:
    """Start the embedded server when DATABASE_URL is unset; returns whether this call started it."""
    if not uses_embedded():
        return False
    started = not embedded.is_running(pgdata())
    embedded.ensure_running(pgdata())
    return started
