"""Tasks and jobs whose results are too large for a row (over ORCHESTRATOR_MAX_RESULT_BYTES): kept
in the log storage and read back by their children, the API and the pages. Run on real workers by
tests/test_stored_results.py."""

from orchestrator.dsl import Workflow
from orchestrator.jobs import job
from orchestrator.secrets import secret

big = Workflow("big-results", secrets=["stripe"])

ROWS = 1100  # of 1,000 characters: about 1.1 MB of JSON, four times the default row limit


@big.task
def produce(ctx):
    return {"key": ctx.secret("stripe"), "rows": [f"{i:06d}" + "r" * 994 for i in range(ROWS)]}


@big.task
def consume(ctx):
    value = ctx.upstream["produce"]
    return {"rows": len(value["rows"]), "last": value["rows"][-1][:6], "key": value["key"]}


@big.task
def split(ctx):
    return [0, 1, 2]


@big.task
def piece(ctx):
    # Instances 0 and 2 are too large for a row, 1 is not: the list mixes both.
    return {"index": ctx.item, "filler": "p" * (10 if ctx.item == 1 else 300 * 1024)}


piece.map(over=split)


@big.task
def gather(ctx):
    return [[part["index"], len(part["filler"])] for part in ctx.upstream["piece"]]


@big.task
def huge(ctx):
    return "h" * (3 * 1024 * 1024)  # over the hard limit the test sets (2 MiB)


produce >> consume
split >> piece >> gather


@job(executor="thread", secrets=["stripe"])
def big_thread_job():
    return {"key": secret("stripe"), "blob": "t" * (400 * 1024)}


@job(executor="async")
async def big_async_job():
    return ["a" * 1024] * 400


local = Workflow("big-results-local")


@local.task
def make(ctx):
    return ["m" * 1024] * 300  # about 300 KiB of JSON


@local.task
def count(ctx):
    return len(ctx.upstream["make"])


make >> count
