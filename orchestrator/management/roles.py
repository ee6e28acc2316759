"""What every long-running role (scheduler, dispatcher, worker, reaper) checks before it starts."""

from django.apps import apps
from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections


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
            f"the project), then start this again.")
