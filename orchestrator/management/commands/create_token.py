"""Make an API token for a user and print it, once: only its hash is stored (django-rest-knox), so
it cannot be shown again. Lost? Make a new one with --reset.

    ./dev manage create_token alice                      # alice must exist; another token of hers
    ./dev manage create_token ci-bot --create --role operator
    ./dev manage create_token alice --reset               # revoke her tokens, print a new one
    ./dev manage create_token team-a --create --role operator --tenant a   # operator of tenant a only

Only the key is printed, so ``TOKEN=$(./dev manage create_token alice)`` works in scripts.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from orchestrator import access
from orchestrator.api.permissions import create_token, revoke_tokens
from orchestrator.models import TenantGrant

ROLES = {"viewer": access.VIEWERS, "operator": access.OPERATORS}


class Command(BaseCommand):
    help = "Make a new API token for a user and print it once (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--create", action="store_true",
                            help="create the user (without a password: it can only use the API) if missing")
        parser.add_argument("--role", choices=sorted(ROLES),
                            help="add the user to the Viewers or Operators group (with --tenant: that role on "
                                 "those tenants only)")
        parser.add_argument("--tenant", action="append", default=[], metavar="TENANT",
                            help="give --role on this tenant's workflows only (repeat for more tenants)")
        parser.add_argument("--reset", action="store_true",
                            help="revoke the user's earlier tokens before making the new one")

    @transaction.atomic
    def handle(self, *args, username, create, role, reset, tenant, **options):
        if tenant and not role:
            raise CommandError("--tenant needs --role viewer or --role operator")
        if any(not name.strip() or len(name) > 200 for name in tenant):
            raise CommandError("--tenant takes a tenant's name: 1 to 200 characters")
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            if not create:
                raise CommandError(f"no user {username!r}; create it in the admin, or pass --create")
            user = User(username=username)
            user.set_unusable_password()
            user.save()
        if role and tenant:
            for name in tenant:
                TenantGrant.objects.get_or_create(user=user, role=role, tenant=name, workflow="")
            access.forget(user)
        elif role:
            access.add_to_group(user, ROLES[role])
        if reset:
            revoked = revoke_tokens(user)
            self.stderr.write(f"revoked {revoked} earlier token(s) of {username!r}")
        key = create_token(user)
        if not access.reads_anything(user):
            self.stderr.write(f"note: {username!r} is in neither Viewers nor Operators and has no tenant rights, "
                              "so the API will answer 403; add --role viewer or --role operator")
        self.stderr.write("the token is shown only now: store it (only its hash is kept)")
        self.stdout.write(key)
