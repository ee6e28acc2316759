"""Database URLs (``postgres://user:password@host:port/name``) to Django's DATABASES entries and back.

The standalone project reads ``DATABASE_URL`` with it; the benchmark and the tests hand a
connection to child processes as a URL.

``?pool_mode=transaction`` says the URL names a pooler in transaction mode (PgBouncer's
``pool_mode = transaction``): each transaction may run on another server session, so nothing may
outlive a transaction on the server. The entry then has Django's ``DISABLE_SERVER_SIDE_CURSORS``
(a server-side cursor outlives the transaction that declared it) and psycopg's prepared statements
off (``prepare_threshold`` None, Django's default: a statement prepared on one server session is
unknown to the next). A database entry with ``DISABLE_SERVER_SIDE_CURSORS`` is what the app takes
to be behind such a pooler (see ``is_transaction_pooled``).
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
    pool_mode = options.pop("pool_mode", "session")
    if pool_mode not in POOL_MODES:
        raise ValueError(f"DATABASE_URL has pool_mode={pool_mode!r}: it must be one of {', '.join(POOL_MODES)}")
    host = options.pop("host", None) or unquote(parts.hostname or "")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"DATABASE_URL has an invalid port: {exc}") from None
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(port or ""),
        "OPTIONS": options,
    }
    if pool_mode == "transaction":
        database["DISABLE_SERVER_SIDE_CURSORS"] = True
        options["prepare_threshold"] = None
    return database


POOL_MODES = ("session", "transaction")


def is_transaction_pooled(database: dict) -> bool:
    """Whether a DATABASES entry goes through a pooler in transaction mode. Django's own setting
    for such poolers, ``DISABLE_SERVER_SIDE_CURSORS``, is the mark (``?pool_mode=transaction``
    sets it)."""
    return bool(database.get("DISABLE_SERVER_SIDE_CURSORS"))


def format_database_url(database: dict, name: str | None = None) -> str:
    """The inverse of parse_database_url, for handing a connection to a child process."""
    user = quote(database.get("USER") or "")
    password = f":{quote(database['PASSWORD'])}" if database.get("PASSWORD") else ""
    host = database.get("HOST") or ""
    name = name or database["NAME"]
    query = []
    if host.startswith("/"):
        query.append(f"host={quote(host)}")
        host, port = "", ""
    else:
        port = f":{database['PORT']}" if database.get("PORT") else ""
    if is_transaction_pooled(database):
        query.append("pool_mode=transaction")
    return f"postgresql://{user}{password}@{host}{port}/{name}" + (f"?{'&'.join(query)}" if query else "")


# OPTIONS that Django reads itself and libpq would refuse.
_DJANGO_ONLY_OPTIONS = ("server_side_binding", "isolation_level", "pool", "assume_role", "cursor_factory", "context")


def connect_params(database: dict) -> dict:
    """psycopg.connect() keyword arguments for a DATABASES entry (empty values left to libpq's defaults)."""
    params = {"dbname": database["NAME"], "user": database.get("USER"), "password": database.get("PASSWORD"),
              "host": database.get("HOST"), "port": database.get("PORT")}
    params = {key: value for key, value in params.items() if value}
    params.update({key: value for key, value in (database.get("OPTIONS") or {}).items()
                   if key not in _DJANGO_ONLY_OPTIONS})
    return params
