"""A supervisor over small children with a fast restart policy, run as its own process by the
supervisor tests: ``python -m tests.support.supervise_for_tests '<json spec>'``."""

import json
import sys

from orchestrator.supervisor import Child, RestartPolicy, Supervisor


def main() -> int:
    spec = json.loads(sys.argv[1])
    children = [Child(name, argv) for name, argv in spec["children"]]
    supervisor = Supervisor(children, lambda message: print(f"[supervisor] {message}", flush=True),
                            grace=spec.get("grace", 5.0), policy=RestartPolicy(**spec["policy"]))
    clean = supervisor.run()
    return supervisor.exit_code or (0 if clean else 1)


if __name__ == "__main__":
    sys.exit(main())
