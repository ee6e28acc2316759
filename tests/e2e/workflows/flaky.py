"""A workflow whose first attempt always fails: it lands in the dead-letter queue, and a retry
from there (a fresh attempt) succeeds. Its log holds markup that the pages must show as text."""

from orchestrator.dsl import Param, Workflow

flaky = Workflow(
    "flaky_import",
    description="Fails on its first attempt, succeeds when retried.",
    params={"label": Param(str, default="nightly import")},
)


@flaky.task(retries=0, retry_delay=0.2)
def fetch(ctx):
    print(f"<script>alert('{ctx.params['label']}')</script> attempt {ctx.attempt}")
    if ctx.attempt == 1:
        raise ValueError(f"upstream said <b>no</b> to {ctx.params['label']}")
    return {"rows": 3}


@flaky.task
def store(ctx):
    # Waits in upstream_failed while fetch is dead; the retry from the dead-letter queue must
    # bring it back with fetch's new result.
    return {"stored": ctx.upstream["fetch"]["rows"]}


fetch >> store



slow = Workflow("slow_export", description="Takes its time; cancelled from the run page.",
                params={"go_file": Param(str, default="", description="Write the second line once this file exists.")})


@slow.task(timeout=120)
def export(ctx):
    import os
    import time

    print("exporting…", flush=True)
    for _ in range(300):  # at most 30 s
        if os.path.exists(ctx.params["go_file"]):
            break
        time.sleep(0.1)
    print("halfway there", flush=True)
    time.sleep(60)
