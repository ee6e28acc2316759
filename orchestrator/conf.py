"""The app's settings: every one optional, each with a default, documented here and nowhere else.

A value comes from the project's Django settings (``ORCHESTRATOR_LEASE_SECONDS = 20`` in
settings.py) or, when the settings do not name it, from the environment variable of the same
name (``ORCHESTRATOR_LEASE_SECONDS=20``), else from the default below. Settings win over the
environment, as everywhere in Django: what settings.py says is what runs.

    from orchestrator.conf import app_settings
    app_settings.LEASE_SECONDS

Values are read on each access (overrides in tests apply at once); a bad value raises
ImproperlyConfigured naming the setting, and the system checks report every bad value at start.
The README's settings table is generated from ``OPTIONS`` (``python -m orchestrator.conf``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

PREFIX = "ORCHESTRATOR_"


def _data_dir_default() -> Path:
    base = getattr(django_settings, "BASE_DIR", None)
    return Path(base or os.getcwd()) / ".data"


def _log_storage_options_default() -> dict:
    if app_settings.LOG_STORAGE == FILE_STORAGE:
        # Task logs are readable by the service user only.
        return {"location": str(app_settings.DATA_DIR / "logs"), "file_permissions_mode": 0o600,
                "directory_permissions_mode": 0o700}
    return {}


FILE_STORAGE = "django.core.files.storage.FileSystemStorage"


@dataclass(frozen=True)
class Option:
    name: str  # without the ORCHESTRATOR_ prefix
    kind: str  # how a value is read: seconds, count, limit, text, list, path, json
    default: object  # a value, or a function of no argument for defaults derived from others
    shown_default: str  # the default as the README shows it
    help: str

    @property
    def setting(self) -> str:
        return PREFIX + self.name


OPTIONS = [
    Option("WORKFLOWS_PACKAGE", "text", "", "unset",
           "A package of workflow modules: each of its modules not starting with `_` is imported at sync "
           "(the standalone project sets `workflows`). Workflows are also found in every installed app's "
           "`workflows` module or package, as the admin finds `admin.py`."),
    Option("WORKFLOW_MODULES", "list", [], "none",
           "More workflow modules to import at sync, by dotted name (a list in settings, comma-separated in "
           "the environment)."),
    Option("SYNC_IMPORT_TIMEOUT", "seconds", 30.0, "30",
           "How long sync waits for one workflow module to import (each module in a child process of its "
           "own, from its own start): a slower import is stopped and reported as an error of that module, "
           "and the other modules sync."),
    Option("JOB_MODULES", "list", [], "none",
           "Modules of `@job` functions, imported by every process at start-up besides each installed "
           "app's `jobs` and `tasks` modules: only registered functions can be enqueued or run."),
    Option("DATA_DIR", "path", _data_dir_default, "`BASE_DIR/.data`",
           "The folder for task logs (with the default log storage); the standalone project also keeps "
           "its embedded PostgreSQL there."),
    Option("LOG_STORAGE", "text", FILE_STORAGE, "files in `DATA_DIR/logs`",
           "Where task logs go: an alias of `STORAGES` (e.g. one your project already uses for S3) or a "
           "storage class by dotted path, e.g. `storages.backends.s3.S3Storage` (install the `[s3]` extra)."),
    Option("LOG_STORAGE_OPTIONS", "json", _log_storage_options_default, "`{\"location\": DATA_DIR/logs}` (files 0600, folders 0700)",
           "Options of the `LOG_STORAGE` class (a dict in settings, JSON in the environment), e.g. "
           "`{\"bucket_name\": \"logs\"}`."),
    Option("WORKER_MAX_TASKS_PER_CHILD", "count", 0, "0 (never)",
           "A worker replaces a child process after it ran this many tasks (a fresh fork: it runs the code "
           "now on disk and gives back what task code leaked); `--max-tasks-per-child` overrides it. 0: never."),
    Option("WORKER_MIN_CHILDREN", "count", 0, "0 (all)",
           "Child processes a worker keeps forked and waiting (at most its `--concurrency`; 0: all of them, a "
           "fixed pool). Fewer hold less memory while idle; the worker forks more, up to `--concurrency`, when "
           "work is queued and none is free, and the first tasks of a burst then wait for them. "
           "`--min-children` overrides it."),
    Option("WORKER_CHILD_IDLE_SECONDS", "seconds", 60.0, "60",
           "A child above the minimum that had no task for this long exits (an idle worker gives its memory back)."),
    Option("LEASE_SECONDS", "seconds", 15.0, "15",
           "The scheduler lease: a standby takes over at most this long after the leader died."),
    Option("HEARTBEAT_SECONDS", "seconds", 5.0, "5", "How often each worker writes its heartbeat."),
    Option("HEARTBEAT_TIMEOUT_SECONDS", "seconds", 30.0, "30",
           "A worker silent this long is presumed dead: its attempts are reaped and retried."),
    Option("POLL_SECONDS", "seconds", 1.0, "1",
           "How often dispatchers and workers look for work when no notification woke them."),
    Option("LISTEN_DATABASE_URL", "text", "", "unset",
           "Where dispatchers, workers and schedulers `LISTEN` for the notifications that wake them: a direct "
           "`postgres://` URL of the database when the work connections go through a pooler in transaction mode "
           "(which cannot carry `LISTEN`), or `poll` for no `LISTEN` at all (they then look for work every "
           "`ORCHESTRATOR_POLL_SECONDS`). Unset: a connection like the `default` database's own, or polling when "
           "that database is marked as transaction-pooled (`DISABLE_SERVER_SIDE_CURSORS`, which "
           "`?pool_mode=transaction` sets). See Running in production."),
    Option("POOLER_PREPARED_STATEMENTS", "switch", False, "off",
           "Behind a pooler in transaction mode (`?pool_mode=transaction`), keep the prepared statements of the "
           "hot path (a worker's claims and outcomes, a dispatcher's tick, the insert of new runs that every "
           "enqueue makes): `on` needs PgBouncer 1.21 or later with `max_prepared_statements` above 0 (e.g. 200), which carries protocol-level prepared statements from one "
           "server connection to the next; `off`, the safe choice for older poolers (Debian 12's PgBouncer is 1.18), "
           "plans them at every execution. A pooler that loses a prepared statement stops the role with a message "
           "naming this setting. Without a transaction pooler they are always prepared."),
    Option("RECONNECT_MAX_SECONDS", "seconds", 5.0, "5",
           "The longest wait between two reconnection attempts of a process whose database went away (the "
           "first after 0.2 s, then twice as long each time, with jitter)."),
    Option("MAX_CATCHUP_RUNS", "count", 100, "100",
           "At most this many missed fire times are run by a `catchup=\"all\"` schedule (its `max_catchup` "
           "overrides it)."),
    Option("MAX_BACKFILL_RUNS", "count", 10000, "10000", "A backfill of more fire times is refused."),
    Option("MAX_RESULT_BYTES", "count", 256 * 1024, "262144 (256 KiB)",
           "The largest return value kept in the task run's row, as JSON; a larger one goes to the log storage "
           "(up to `MAX_STORED_RESULT_BYTES`), except a list a task is mapped over or a branch's choice, which "
           "fail the attempt."),
    Option("MAX_STORED_RESULT_BYTES", "count", 64 * 1024 * 1024, "67108864 (64 MiB)",
           "The largest return value a task may store at all, as JSON, kept in the log storage when over "
           "`MAX_RESULT_BYTES`; more fails the attempt."),
    Option("MAX_MAP_ITEMS", "count", 10000, "10000",
           "A mapped task fans out over at most this many items; a longer list fails the task returning it."),
    Option("DEFAULT_QUEUE_LIMIT", "limit", None, "unlimited",
           "Queued plus running task runs per queue, where the admin sets no `QueueLimit` (0: unlimited)."),
    Option("DEFAULT_TENANT_LIMIT", "limit", None, "unlimited",
           "Queued plus running task runs per tenant, where the admin sets no `TenantLimit` (0: unlimited)."),
    Option("RETENTION_DAYS", "count", 30, "30",
           "Finished runs older than this are deleted with their task runs, attempts and logs."),
    Option("WEBHOOK_SECRET", "text", "", "unset",
           "The HMAC-SHA256 key of the `X-Orchestrator-Signature` header of webhook calls, its own secret "
           "(never `SECRET_KEY`). Required when `DEBUG` is off (check `orchestrator.E008`); unset in "
           "development, webhook calls carry no signature."),
    Option("SECRETS_KEYS", "list", [], "unset",
           "The keys of the secrets store, newest first (a list in settings, comma-separated in the "
           "environment): each a Fernet key, made by `manage.py rotate_secrets_key --new-key`. Values are "
           "encrypted with the first and read with any; kept outside the database. Without one, secrets "
           "cannot be stored or read (check `orchestrator.E014`)."),
    Option("SECRETS_BACKENDS", "list", ["database"], "`database`",
           "Where a task's secrets are looked up, in order: `database` (the encrypted store of the admin and "
           "API), `env` (`ORCHESTRATOR_SECRET_<NAME>`, `ORCHESTRATOR_CONNECTION_<NAME>`), `files` (a file per "
           "secret in `SECRETS_DIR`), or the dotted path of a class of your own (see the README)."),
    Option("SECRETS_DIR", "path", Path("/run/secrets"), "`/run/secrets`",
           "The folder of the `files` secrets backend: Docker's and Kubernetes' mounted secrets, a file "
           "`<name>` per secret and `connection-<name>` per connection (a URL, or a JSON object of fields)."),
    Option("WEBHOOK_RETRY_SECONDS", "seconds", 5.0, "5",
           "The first retry delay of a failed webhook delivery (doubling, at most 10 minutes)."),
    Option("NOTIFY_DIGEST_SECONDS", "seconds", 60.0, "60",
           "A recipient of notifications gets at most one message per this many seconds: the first event for "
           "a quiet recipient waits this long for others, and all of them go in one message (a digest when "
           "there are several)."),
    Option("BASE_URL", "text", "", "unset",
           "The address of the pages as people reach them, e.g. `https://orchestrator.example.com`: the links "
           "in notifications (and the answer links of approvals) point there. Unset: messages carry no links."),
    Option("TRACE_URL", "text", "", "unset",
           "With tracing on (the `OTEL_*` variables), a link from a task run's page to its trace: a URL "
           "with `{trace_id}` in it, e.g. `https://jaeger.example.com/trace/{trace_id}`. Unset: the page "
           "shows the trace id only."),
    Option("SHELL_ENV_ALLOW", "list", ["PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
                                       "USER", "LOGNAME", "SHELL"],
           "`PATH`, `HOME`, `LANG`, `LANGUAGE`, `LC_ALL`, `LC_CTYPE`, `TZ`, `TMPDIR`, `USER`, `LOGNAME`, `SHELL`",
           "The only variables of the worker's environment a shell task sees (besides what the task declares "
           "with `env=`, its `PARAM_*` and `RUN_ID`, `TASK`, `ATTEMPT`, `LOGICAL_DATE`): the worker's other "
           "variables, such as `DATABASE_URL` or `SECRET_KEY`, never reach a task's command or its log."),
    Option("METRICS_TOKEN", "text", "", "unset",
           "When set, the `metrics` endpoint answers only requests with `Authorization: Bearer <token>`."),
    Option("LOGIN_URL", "text", "orchestrator:web:login", "the app's own login page",
           "Where the app's pages send anonymous users: a URL or a URL name, e.g. your project's "
           "`LOGIN_URL`."),
]
OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}

_KIND_RULES = {
    "seconds": "a positive number of seconds",
    "count": "a whole number, 0 or more",
    "limit": "a whole number, 0 or more (0 or empty: unlimited)",
    "text": "a string",
    "list": "a list of strings (comma-separated in the environment)",
    "path": "a folder path",
    "json": "a dict (a JSON object in the environment)",
    "switch": "on or off (true/false, yes/no, 1/0 in the environment)",
}


def _seconds(value, from_env: bool, kind: str) -> float:
    number = float(value) if from_env or isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is None or not number > 0 or number != number or number == float("inf"):
        raise ValueError
    return number


def _count(value, from_env: bool, kind: str) -> int | None:
    """A whole number, 0 or more; a "limit" is None when unset, empty or 0 (no limit)."""
    limit = kind == "limit"
    if from_env:
        value = value.strip()
        if limit and value == "":
            return None
        value = int(value)
    if limit and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError
    return None if limit and value == 0 else value


def _text(value, from_env: bool, kind: str) -> str:
    if not isinstance(value, str):
        raise ValueError
    return value


def _list(value, from_env: bool, kind: str) -> list[str]:
    if from_env:
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, str) or not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError
    return list(value)


def _path(value, from_env: bool, kind: str) -> Path:
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ValueError
    return Path(value).resolve()


def _json(value, from_env: bool, kind: str) -> dict:
    if from_env:
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError
    return value


_SWITCH_WORDS = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


def _switch(value, from_env: bool, kind: str) -> bool:
    if from_env:
        value = _SWITCH_WORDS.get(value.strip().lower())
    if not isinstance(value, bool):
        raise ValueError
    return value


# One converter per kind of option: the value in the type the app uses, or ValueError (the
# caller then says what the kind expects, from _KIND_RULES).
_CONVERTERS = {"seconds": _seconds, "count": _count, "limit": _count, "text": _text, "list": _list,
               "path": _path, "json": _json, "switch": _switch}


def _convert(option: Option, value, from_env: bool):
    """The value in the type the app uses, or ValueError saying what is expected."""
    try:
        convert = _CONVERTERS[option.kind]
    except KeyError:
        raise AssertionError(f"unknown kind {option.kind!r}") from None
    return convert(value, from_env, option.kind)


def value_of(option: Option):
    """The option's value: the project's setting, else the environment, else the default."""
    if hasattr(django_settings, option.setting):
        raw, from_env, source = getattr(django_settings, option.setting), False, f"settings.{option.setting}"
    else:
        raw = os.environ.get(option.setting)
        if raw is None or (raw.strip() == "" and option.kind != "limit"):
            default = option.default
            return default() if callable(default) else default
        from_env, source = True, f"the environment variable {option.setting}"
    try:
        return _convert(option, raw, from_env)
    except (TypeError, ValueError):
        raise ImproperlyConfigured(
            f"{source} is {raw!r}: it must be {_KIND_RULES[option.kind]}") from None


class AppSettings:
    """Attribute access to the options: ``app_settings.LEASE_SECONDS``."""

    def __getattr__(self, name: str):
        option = OPTIONS_BY_NAME.get(name)
        if option is None:
            raise AttributeError(f"no orchestrator setting {name!r} (known: {', '.join(OPTIONS_BY_NAME)})")
        return value_of(option)

    def __dir__(self):
        return list(OPTIONS_BY_NAME)


app_settings = AppSettings()


def problems() -> list[str]:
    """Every bad value, for the system checks."""
    found = []
    for option in OPTIONS:
        try:
            value_of(option)
        except ImproperlyConfigured as exc:
            found.append(str(exc))
    return found


_log_storage = None


def log_storage():
    """The storage of task logs, built once per configuration."""
    global _log_storage
    if _log_storage is None:
        name = app_settings.LOG_STORAGE
        configured = getattr(django_settings, "STORAGES", {}) or {}
        if name in configured:
            from django.core.files.storage import storages  # noqa: PLC0415 - the storages are Django's once settings are read

            _log_storage = storages[name]
        else:
            from django.core.files.storage.handler import StorageHandler  # noqa: PLC0415 - the storages are Django's once settings are read

            # One backend built the way Django builds the STORAGES entries (import, then options).
            handler = StorageHandler({"orchestrator_logs": {"BACKEND": name, "OPTIONS": app_settings.LOG_STORAGE_OPTIONS}})
            try:
                _log_storage = handler["orchestrator_logs"]
            except Exception as exc:  # noqa: BLE001 - a bad class path or option is a configuration error
                raise ImproperlyConfigured(
                    f"{PREFIX}LOG_STORAGE {name!r} cannot be built: {type(exc).__name__}: {exc}") from None
    return _log_storage


def _reset(*, setting, **kwargs):
    global _log_storage
    if setting.startswith(PREFIX) or setting in ("STORAGES", "BASE_DIR"):
        _log_storage = None


def connect_signals() -> None:
    from django.core.signals import setting_changed  # noqa: PLC0415 - settings import this module

    setting_changed.connect(_reset, dispatch_uid="orchestrator.conf.reset")


def markdown_table() -> str:
    """The README's settings table, from OPTIONS."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    rows += [f"| `{option.setting}` | {option.shown_default} | {option.help} |" for option in OPTIONS]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
