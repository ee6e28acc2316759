"""Many worker processes from one start-up, run as its own process by the pooling test:
``python -m tests.support.fleet_for_tests WORKERS CONCURRENCY [QUEUE]`` (QUEUE: ``default``).

Django is set up once and the workers are forked from it: fifty interpreters each importing Django
would take most of a minute on a small machine. Each worker is then a process of its own with its
own connections, its own children and its own signal handling, as under ``manage.py worker``.
SIGTERM to the process group (what the tests send) drains every worker; this process waits for
them and exits non-zero if any of them failed.
"""

import os
import signal
import sys
import traceback


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.db import connections

    from orchestrator.worker import Worker

    count, concurrency = int(argv[0]), int(argv[1])
    queue = argv[2] if len(argv) > 2 else "default"
    connections.close_all()  # no connection may be shared by the forks
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                Worker([queue], concurrency=concurrency, grace=10).serve()
                code = 0
            except BaseException:  # noqa: BLE001 - reported, then the exit status says it
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    # The workers got the group's SIGTERM themselves; this process only waits for them.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    print(f"fleet: {count - failed} of {count} workers exited cleanly", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
