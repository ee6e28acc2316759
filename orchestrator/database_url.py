"""Database URLs (``postgres://user:password@host:port/name``) to Django's DATABASES entries and back.

The standalone project reads ``DATABASE_URL`` with it; the benchmark and the tests hand a
connection to child processes as a URL.
"""

from urllib.parse import parse_qsl, quote, unquote, urlsplit


def parse_database_url(url: str) -> dict:
    """postgres://user:password@host:port/name?sslmode=require (host may also be a socket dir)."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ValueError(f"DATABASE_URL must start with postgres:// or postgresql://, got {parts.scheme!r}")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ValueError("DATABASE_URL has no database name (postgres://user@host:5432/NAME)")
    options = dict(parse_qsl(parts.query))
    host = options.pop("host", None) or unquote(parts.hostname or "")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"DATABASE_URL has an invalid port: {exc}") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(port or ""),
        "OPTIONS": options,
    }


def format_database_url(database: dict, name: str | None = None) -> str:
    """The inverse of parse_database_url, for handing a connection to a child process."""
    user = quote(database.get("USER") or "")
    password = f":{quote(database['PASSWORD'])}" if database.get("PASSWORD") else ""
    host = database.get("HOST") or ""
    name = name or database["NAME"]
    if host.startswith("/"):
        return f"postgresql://{user}{password}@/{name}?host={quote(host)}"
    port = f":{database['PORT']}" if database.get("PORT") else ""
    return f"postgresql://{user}{password}@{host}{port}/{name}"
