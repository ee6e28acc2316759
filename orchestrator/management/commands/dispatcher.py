from django.core.management.base import BaseCommand

from orchestrator.dispatcher import Dispatcher
from orchestrator.management.roles import require_migrated


class Command(BaseCommand):
    help = "Move due task runs to their queues under the concurrency limits."

    def handle(self, *args, **options):
        require_migrated()
        Dispatcher().serve()
