"""What every long-running role (scheduler, dispatcher, worker, reaper) checks before it starts."""

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections
from django.db.migrations.executor import MigrationExecutor


def require_migrated(database: str = DEFAULT_DB_ALIAS) -> None:
    """Refuse to start on a database the migrations have not (all) reached, naming the command to
    run, instead of failing later on a missing table with a traceback. A database that cannot be
    reached is left to the role, which waits for it."""
    try:
        executor = MigrationExecutor(connections[database])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except OperationalError:
        return
    if plan:
        first = plan[0][0]
        raise CommandError(
            f"the database is not migrated: {len(plan)} migration(s) not applied (the first: "
            f"{first.app_label}.{first.name}). Run `python manage.py migrate` first "
            f"(`./dev manage migrate` in a checkout of the project), then start this again.")
