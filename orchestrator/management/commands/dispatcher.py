from orchestrator.dispatcher import Dispatcher
from orchestrator.management.roles import RoleCommand, require_migrated


class Command(RoleCommand):
    help = "Move due task runs to their queues under the concurrency limits."

    def handle(self, *args, **options):
        require_migrated()
        Dispatcher().serve()
