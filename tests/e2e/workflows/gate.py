"""A workflow whose task waits for a file before each attempt ends, so a test can watch the
task-run page while an attempt runs, fails, is retried and succeeds."""

from orchestrator.dsl import Param, Workflow

gated = Workflow(
    "gated_retry",
    description="Its first attempt fails once go1 exists; later ones succeed once go2 exists.",
    params={"folder": Param(str, default="", description="Where the go files appear.")},
)


@gated.task(retries=1, retry_delay=0.2, timeout=120)
def gate(ctx):
    import os
    import time

    wanted = os.path.join(ctx.params["folder"], "go1" if ctx.attempt == 1 else "go2")
    print(f"attempt {ctx.attempt} waits for {os.path.basename(wanted)}", flush=True)
    for _ in range(600):  # at most 60 s
        if os.path.exists(wanted):
            break
        time.sleep(0.1)
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails on purpose")
    return {"attempt": ctx.attempt}


@gated.task
def after(ctx):
    return {"after": ctx.upstream["gate"]["attempt"]}


gate >> after
