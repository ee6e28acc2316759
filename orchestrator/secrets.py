"""Secrets and connections as a task sees them: declared in code, read through the context, masked.

    etl = Workflow("billing", secrets=["stripe"])            # every task of the workflow may read it

    @etl.task(connections=["warehouse"])
    def load(ctx):
        key = ctx.secret("stripe")                           # a str
        db = ctx.connection("warehouse")                     # a Connection: .url, .host, .password, ...

    etl.shell("export", "pg_dump $CONNECTION_WAREHOUSE", connections=["warehouse"])
    etl.shell("push", "curl -u api:$KEY ...", secrets={"KEY": "stripe"})   # an environment variable named so

    @job(secrets=["stripe"])                                  # orchestrator.jobs.job
    def refund(charge_id):
        stripe_key = secret("stripe")                        # from orchestrator.secrets import secret

A task reads only what it (or its workflow, or its ``@job``) declares: any other name raises
``SecretNotDeclared`` in the task, which fails with that message. Each read is in the audit log
(one record per secret and attempt, never the value), and every value read is masked (see
``orchestrator.masking``) in the attempt's log, result, error and traceback.

Where the values come from (``orchestrator.secretstore``): the encrypted store of the admin and
the API, and, when ``ORCHESTRATOR_SECRETS_BACKENDS`` names them, environment variables and files
of a mounted folder (Docker and Kubernetes secrets).

Nothing here imports Django's models: workflow modules import this module (through the DSL)
before the app registry is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from orchestrator import limits
from orchestrator.masking import Masker

SECRET, CONNECTION = "secret", "connection"
KINDS = (SECRET, CONNECTION)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
NAME_RULE = "a name of letters, digits, '_', '.' or '-' (up to 100 characters, starting with a letter or digit)"
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")
# A shell task's variable for a secret declared by name alone: SECRET_STRIPE, CONNECTION_WAREHOUSE.
ENV_PREFIX = {SECRET: "SECRET_", CONNECTION: "CONNECTION_"}
CONNECTION_FIELDS = ("scheme", "host", "port", "login", "password", "database", "extra")


class SecretError(Exception):
    """A secret a task asked for cannot be given to it; the message says why and what to do."""


class SecretNotDeclared(SecretError):
    """The task reads a secret or connection its declarations do not name."""


class SecretNotFound(SecretError):
    """No backend holds the secret or connection."""


# --- declarations ----------------------------------------------------------------------------------


def env_name(kind: str, name: str) -> str:
    """A shell task's variable for a secret declared by name: SECRET_ + the name in capitals."""
    return ENV_PREFIX[kind] + re.sub(r"[^A-Z0-9]", "_", name.upper())


def declaration(kind: str, value) -> dict[str, str]:
    """A ``secrets=``/``connections=`` option as {environment variable: name}: a list of names
    takes each name's default variable, a dict names the variables itself. Raises ValueError
    saying what is wrong."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        pairs = [(env_name(kind, name) if isinstance(name, str) and NAME_RE.match(name) else name, name)
                 for name in value]
    else:
        raise ValueError(f"must be a list of {kind} names or a dict of environment variable: {kind} name, "
                         f"got {limits.safe_repr(value)}")
    for variable, name in pairs:
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ValueError(f"{limits.safe_repr(name)} is not a {kind} name: {NAME_RULE}")
        if not isinstance(variable, str) or not ENV_RE.match(variable):
            raise ValueError(f"{limits.safe_repr(variable)} is not an environment variable name "
                             "(letters, digits and '_', not starting with a digit)")
    return dict(sorted(pairs))


def declaration_problem(kind: str, value) -> str:
    try:
        declaration(kind, value)
    except ValueError as exc:
        return str(exc)
    return ""


# ref -> {"secrets": {...}, "connections": {...}} of the jobs that declared any (``@job(secrets=...)``).
_jobs: dict[str, dict[str, dict[str, str]]] = {}


def declare_job(ref: str, secrets=None, connections=None) -> None:
    """What the job registered under ``ref`` may read (raises ValueError for a bad declaration)."""
    declared = {"secrets": declaration(SECRET, secrets), "connections": declaration(CONNECTION, connections)}
    if declared["secrets"] or declared["connections"]:
        _jobs[ref] = declared
    else:
        _jobs.pop(ref, None)


def declared_by(obj, ref: str) -> tuple[set[str], set[str]]:
    """The secret and connection names the code registered under ``ref`` declares: a workflow
    task's own and its workflow's, or a job's. Never what a stored row says: an API client can add
    keys to a job's spec, not to the code."""
    task_declared = getattr(obj, "declared_secrets", None)
    if callable(task_declared):
        secrets, connections = task_declared()
        return set(secrets.values()), set(connections.values())
    declared = _jobs.get(ref) or {}
    return set((declared.get("secrets") or {}).values()), set((declared.get("connections") or {}).values())


# --- connections -----------------------------------------------------------------------------------


class Connection:
    """A connection as a task reads it: ``url`` and its parts (``scheme``, ``host``, ``port``,
    ``login``, ``password``, ``database``, ``extra``: the URL's query, or the extra fields)."""

    def __init__(self, name: str, *, url: str = "", scheme: str = "", host: str = "", port=None, login: str = "",
                 password: str = "", database: str = "", extra: dict | None = None):
        self.name, self.scheme, self.host, self.port = name, scheme, host, port
        self.login, self.password, self.database, self.extra = login, password, database, dict(extra or {})
        self._url = url

    @classmethod
    def from_stored(cls, name: str, data) -> Connection:
        """From what a backend holds: ``{"url": ...}``, ``{"fields": {...}}``, or a URL as text."""
        if isinstance(data, str):
            data = {"url": data}
        if data.get("url"):
            url = data["url"]
            parts = urlsplit(url)
            try:
                port = parts.port
            except ValueError:
                port = None
            return cls(name, url=url, scheme=parts.scheme, host=parts.hostname or "", port=port,
                       login=unquote(parts.username or ""), password=unquote(parts.password or ""),
                       database=parts.path.lstrip("/"), extra=dict(parse_qsl(parts.query)))
        fields = {key: value for key, value in (data.get("fields") or {}).items() if key in CONNECTION_FIELDS}
        return cls(name, **fields)

    @property
    def url(self) -> str:
        if self._url:
            return self._url
        credentials = ""
        if self.login or self.password:
            credentials = quote(str(self.login), safe="")
            if self.password:
                credentials += ":" + quote(str(self.password), safe="")
            credentials += "@"
        port = f":{self.port}" if self.port not in (None, "") else ""
        query = "&".join(f"{quote(str(k), safe='')}={quote(str(v), safe='')}" for k, v in self.extra.items())
        return (f"{self.scheme or 'unknown'}://{credentials}{self.host}{port}/{quote(str(self.database))}"
                + (f"?{query}" if query else ""))

    def sensitive_values(self) -> list[str]:
        """What masking hides of a connection: the password, the URL, ``login:password`` (so its
        base64, a Basic authorization header, is hidden too) and the extra fields' texts."""
        values = [self.url]
        if self.password:
            values += [str(self.password), f"{self.login}:{self.password}"]
        values += [value for value in self.extra.values() if isinstance(value, str)]
        return values

    def __repr__(self) -> str:
        return f"<Connection {self.name}: {self.scheme}://{self.host}>"


# --- one attempt's access ----------------------------------------------------------------------------

# Reads from a coroutine (an async job) run here: the database is not used on the event loop.
_off_loop = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orchestrator-secrets")


class Access:
    """What one attempt may read, what it read (cached: one read per secret per attempt), and the
    masker of its values. ``where`` says who reads, for messages and the audit log."""

    def __init__(self, loader, *, task_run_id: int = 0, run_id: int = 0, attempt: int = 0, workflow: str = "",
                 task: str = "", job: bool = False):
        # loader(kind, name, access) -> the stored value (secretstore.read_for_task: it needs the
        # models, which this module may not import).
        self.loader = loader
        self.task_run_id, self.run_id, self.attempt, self.workflow, self.task, self.job = \
            task_run_id, run_id, attempt, workflow, task, job
        self.names: dict[str, set[str]] = {SECRET: set(), CONNECTION: set()}
        self.values: dict[tuple[str, str], object] = {}
        self.masker = Masker()

    @classmethod
    def of_message(cls, message: dict, loader) -> Access:
        return cls(loader, task_run_id=message.get("id") or 0, run_id=message.get("run_id") or 0,
                   attempt=message.get("number") or 0, workflow=message.get("workflow") or "",
                   task=message.get("task") or "", job=(message.get("spec") or {}).get("call") == "job")

    @property
    def where(self) -> str:
        if self.job:
            return f"job {self.task!r}"
        return f"task {self.task!r}" + (f" of workflow {self.workflow!r}" if self.workflow else "")

    def allow(self, secrets: Iterable[str] = (), connections: Iterable[str] = ()) -> None:
        self.names[SECRET].update(secrets)
        self.names[CONNECTION].update(connections)

    def secret(self, name: str) -> str:
        return self._read(SECRET, name)

    def connection(self, name: str) -> Connection:
        return self._read(CONNECTION, name)

    def _read(self, kind: str, name: str):
        if not isinstance(name, str) or name not in self.names[kind]:
            option = "secrets" if kind == SECRET else "connections"
            raise SecretNotDeclared(
                f"{self.where} reads the {kind} {limits.safe_repr(name)}, which it does not declare: add "
                f"{option}=[{limits.safe_repr(name)}] to the task, its workflow or its @job (declared: "
                f"{', '.join(sorted(self.names[kind])) or 'none'})")
        key = (kind, name)
        if key not in self.values:
            stored = self._load(kind, name)
            value = Connection.from_stored(name, stored) if kind == CONNECTION else stored
            for sensitive in value.sensitive_values() if kind == CONNECTION else [value]:
                self.masker.add(sensitive)
            self.values[key] = value
        return self.values[key]

    def _load(self, kind: str, name: str):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self.loader(kind, name, self)
        # On an event loop (an async job): Django's ORM refuses to run there; a thread of its own reads.
        return _off_loop.submit(self.loader, kind, name, self).result()

    # --- masking what the attempt produced ---------------------------------------------------------

    def mask(self, text):
        return self.masker.mask(text)

    def mask_reply(self, reply: tuple) -> tuple:
        """An outcome tuple of ``executor.run`` with its result, error, traceback and metadata masked."""
        if not self.masker:
            return reply
        task_run_id, number, outcome, result, error, tb, log_name, metadata, *rest = reply
        return (task_run_id, number, outcome, self.masker.mask_json(result), self.mask(error), self.mask(tb),
                log_name, self.masker.mask_json(metadata), *rest)


_current: contextvars.ContextVar[Access | None] = contextvars.ContextVar("orchestrator_secret_access", default=None)


@contextlib.contextmanager
def attempt(access: Access):
    """Make ``access`` the current attempt's while the block runs (in this thread or asyncio task)."""
    token = _current.set(access)
    guard_logging()
    try:
        yield access
    finally:
        _current.reset(token)


def current() -> Access:
    access = _current.get()
    if access is None:
        raise SecretError("secrets are read by a task while it runs (ctx.secret(...), or secret(...) in a job), "
                          "and only there")
    return access


def allow_declared(obj, ref: str) -> None:
    """Let the current attempt (if any) read what the code registered under ``ref`` declares."""
    access = _current.get()
    if access is not None:
        access.allow(*declared_by(obj, ref))


def secret(name: str) -> str:
    """The value of the secret ``name``, for the task or job running now (which must declare it)."""
    return current().secret(name)


def connection(name: str) -> Connection:
    """The connection ``name``, for the task or job running now (which must declare it)."""
    return current().connection(name)


# --- logging records outside the attempt's log ----------------------------------------------------


class MaskingFilter(logging.Filter):
    """On every handler of the root logger: a record emitted while an attempt that read secrets is
    current has them masked (message, traceback, stack) for every handler, the console's too."""

    def filter(self, record: logging.LogRecord) -> bool:
        access = _current.get()
        if access is None or not access.masker or getattr(record, "_orchestrator_masked", False):
            return True
        record.msg, record.args = access.mask(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.exc_text = access.mask(record.exc_text)
        record.stack_info = access.mask(record.stack_info)
        record._orchestrator_masked = True
        return True


_filter = MaskingFilter()


def guard_logging() -> None:
    """Put the masking filter on each handler of the root logger that lacks it (cheap, idempotent)."""
    for handler in logging.getLogger().handlers:
        if _filter not in handler.filters:
            handler.addFilter(_filter)
