"""Jobs arriving at a steady rate, one ``enqueue`` (one transaction, one notification) each, run as
its own process by the fleet tests: ``python -m tests.support.arrivals_for_tests JOBS PER_SECOND [QUEUE]``."""

import os
import sys
import time


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from orchestrator.jobs import enqueue

    jobs, rate = int(argv[0]), float(argv[1])
    queue = argv[2] if len(argv) > 2 else "default"
    started = time.monotonic()
    for i in range(jobs):
        # On a schedule, not a fixed pause: a slow enqueue does not lower the rate.
        time.sleep(max(0.0, started + i / rate - time.monotonic()))
        enqueue("tests.support.tasks_for_tests:no_argument", queue=queue)
    print(f"arrivals: {jobs} jobs in {time.monotonic() - started:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
