import signal
import time

from django.core.management.base import BaseCommand

from orchestrator.conf import app_settings
from orchestrator.reaper import reap_once


class Command(BaseCommand):
    help = "End the attempts of silent workers and of tasks past their timeout (also run by the scheduler leader)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="Reap once and exit.")
        parser.add_argument("--interval", type=float, default=None,
                            help="Seconds between passes (default: the heartbeat interval).")

    def handle(self, *args, once, interval, **options):
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
        interval = interval or app_settings.HEARTBEAT_SECONDS
        while not stopping:
            reaped = reap_once()
            if reaped:
                self.stdout.write(f"reaped {reaped} attempt(s)")
            if once:
                break
            deadline = time.monotonic() + interval
            while not stopping and time.monotonic() < deadline:
                time.sleep(min(0.1, interval))
