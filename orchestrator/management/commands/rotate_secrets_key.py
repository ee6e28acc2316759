"""Re-encrypt every stored secret under the newest key of ORCHESTRATOR_SECRETS_KEYS (see
orchestrator/secretstore.py for the whole rotation, without downtime)."""

from django.core.management.base import BaseCommand, CommandError

from orchestrator import secretstore
from orchestrator.secrets import SecretError


class Command(BaseCommand):
    help = ("Re-encrypt every stored secret and connection under the first key of ORCHESTRATOR_SECRETS_KEYS, "
            "in short batches; the older keys still read the values meanwhile. --new-key prints a fresh key.")

    def add_arguments(self, parser):
        parser.add_argument("--new-key", action="store_true",
                            help="Print a new Fernet key (put it first in ORCHESTRATOR_SECRETS_KEYS) and stop.")
        parser.add_argument("--batch-size", type=int, default=secretstore.ROTATE_BATCH,
                            help="Rows per statement (default %(default)s).")

    def handle(self, *args, new_key, batch_size, **options):
        if new_key:
            self.stdout.write(secretstore.new_key())
            return
        if batch_size < 1:
            raise CommandError(f"--batch-size: {batch_size} must be at least 1")
        try:
            outcome = secretstore.rotate(batch_size)
            left = secretstore.under_old_keys()
        except SecretError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"re-encrypted {outcome.rotated} under the newest key; {outcome.changed_meanwhile} "
                          f"changed meanwhile (stored under the newest key by their writer); {left} left "
                          "under older keys")
        if outcome.failed:
            raise CommandError(f"{len(outcome.failed)} cannot be decrypted with any key: "
                               f"{', '.join(outcome.failed[:20])} (set them anew)")
        if left == 0:
            self.stdout.write("every value is under the newest key: the older keys can be removed")
