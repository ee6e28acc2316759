"""What every long-running role (scheduler, dispatcher, worker, reaper) checks before it starts,
and how a role says that it cannot run as configured.

A role that cannot run as configured (a failed system check, a refused option, a database the
migrations have not reached) exits with ``CONFIG_ERROR``, 78, ``EX_CONFIG`` of sysexits.h: the
supervisor of ``up`` and ``deploy_local`` does not restart it into the same error, and systemd
can be told the same (``RestartPreventExitStatus=78``). Any other exit is a crash, restarted with
back-off.
"""

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management import ManagementUtility
from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

CONFIG_ERROR = 78


class RoleCommand(BaseCommand):
    """A long-running role's command: a CommandError, its system checks' included, exits with
    CONFIG_ERROR instead of Django's 1."""

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except CommandError as exc:
            exc.returncode = CONFIG_ERROR
            raise
        except ImproperlyConfigured as exc:
            # Found while running (a pooler that cannot keep prepared statements): one line, no
            # traceback, and no restart into the same error.
            raise CommandError(str(exc), returncode=CONFIG_ERROR) from None


def run_command(argv: list[str]) -> None:
    """``manage.py COMMAND ARGS`` (argv as sys.argv) in this process, any command (runserver
    too), with a CommandError exiting CONFIG_ERROR as a RoleCommand's does: how a supervisor's
    forked role runs its command."""
    command = ManagementUtility(argv).fetch_command(argv[1])
    execute = command.execute

    def execute_or_config_error(*args, **options):
        try:
            return execute(*args, **options)
        except CommandError as exc:
            exc.returncode = CONFIG_ERROR
            raise
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc), returncode=CONFIG_ERROR) from None

    command.execute = execute_or_config_error
    command.run_from_argv(argv)


def require_migrated(database: str = DEFAULT_DB_ALIAS) -> None:
    """Refuse to start on a database the migrations have not reached, naming the command to run,
    instead of failing later on a missing table. One query (the table names): a role starts
    as fast as before. A database that cannot be reached is left to the role, which waits for it."""
    try:
        present = set(connections[database].introspection.table_names())
    except DatabaseError:
        return
    missing = sorted(model._meta.db_table for model in apps.get_app_config("orchestrator").get_models()
                     if model._meta.managed and model._meta.db_table not in present)
    if missing:
        raise CommandError(
            f"the database is not migrated: {len(missing)} of the orchestrator's tables are missing (e.g. "
            f"{missing[0]}). Run `python manage.py migrate` first (`./dev manage migrate` in a checkout of "
            f"the project), then start this again.", returncode=CONFIG_ERROR)
