"""Print a user's API token, creating it on first use:

    ./dev manage create_token alice                      # alice must exist
    ./dev manage create_token ci-bot --create --role operator
    ./dev manage create_token alice --reset               # revoke the old token, print a new one

Only the key is printed, so ``TOKEN=$(./dev manage create_token alice)`` works in scripts.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from rest_framework.authtoken.models import Token

from orchestrator import access

ROLES = {"viewer": access.VIEWERS, "operator": access.OPERATORS}


class Command(BaseCommand):
    help = "Create (or show) the API token of a user."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--create", action="store_true",
                            help="create the user (without a password: it can only use the API) if missing")
        parser.add_argument("--role", choices=sorted(ROLES),
                            help="add the user to the Viewers or Operators group")
        parser.add_argument("--reset", action="store_true", help="replace the user's token with a new one")

    @transaction.atomic
    def handle(self, *args, username, create, role, reset, **options):
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            if not create:
                raise CommandError(f"no user {username!r}; create it in the admin, or pass --create")
            user = User(username=username)
            user.set_unusable_password()
            user.save()
        if role:
            access.add_to_group(user, ROLES[role])
        if reset:
            Token.objects.filter(user=user).delete()
        token, _ = Token.objects.get_or_create(user=user)
        if not access.is_viewer(user):
            self.stderr.write(f"note: {username!r} is in neither Viewers nor Operators, so the API will "
                              "answer 403; add --role viewer or --role operator")
        self.stdout.write(token.key)
