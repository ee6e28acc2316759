"""The standalone project's database: any PostgreSQL through DATABASE_URL, else the embedded
server in the data folder, started here by the project's entry points (manage.py, wsgi.py,
asgi.py and the test command) before Django loads, and never by importing a module."""

import base64
import os
import secrets
from pathlib import Path

from orchestrator import embedded

BASE_DIR = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """ORCHESTRATOR_DATA_DIR, by default the repository's .data folder."""
    return Path(os.environ.get("ORCHESTRATOR_DATA_DIR") or BASE_DIR / ".data").resolve()


def pgdata() -> Path:
    return data_dir() / "pgdata"


def fernet_key() -> str:
    """A new Fernet key (32 random bytes in URL-safe base64), as cryptography's Fernet.generate_key."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def installation_secret(name: str = "secret-key", make=lambda: secrets.token_urlsafe(50)) -> str:
    """One of this installation's random secrets (the SECRET_KEY in DATA_DIR/secret-key, the webhook
    secret in DATA_DIR/webhook-secret, the secrets store's key in DATA_DIR/secrets-key, made by
    ``make``): made on first use, readable by the service user only (0600).
    Two processes starting at once agree: the secret is written to a private temporary file first
    and linked into place, so the file never exists half written."""
    path = data_dir() / name
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = ""
    if key:
        return key
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{name}-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(make() + "\n")
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process made it first: use its key
    finally:
        temporary.unlink(missing_ok=True)
    return path.read_text().strip()


def uses_embedded() -> bool:
    return not os.environ.get("DATABASE_URL", "").strip()


def prepare() -> bool:
    """Start the embedded server when DATABASE_URL is unset; returns whether this call started it."""
    if not uses_embedded():
        return False
    started = not embedded.is_running(pgdata())
    embedded.ensure_running(pgdata())
    return started
