from django.core.management.base import BaseCommand

from orchestrator.dispatcher import Dispatcher


class Command(BaseCommand):
    help = "Move due task runs to their queues under the concurrency limits."

    def handle(self, *args, **options):
        Dispatcher().serve()
