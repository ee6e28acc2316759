"""manage.py run_task WORKFLOW TASK [--param k=v ...]: run one task of a workflow in this terminal,
with its log on stdout, as a worker would run it (nothing is stored: no run, no attempt)."""

import json
import logging
import sys
from datetime import datetime

from django.core.management.base import BaseCommand, CommandError

from orchestrator import clock, executor
from orchestrator.params import ParamError, clean_params
from orchestrator.sync import discover

NOT_YET = 3  # exit code of a sensor whose check answered "not yet"


def _pairs(values: list[str], what: str, parse_json: bool) -> dict:
    pairs = {}
    for value in values or []:
        key, sep, text = value.partition("=")
        if not sep or not key:
            raise CommandError(f"--{what} {value!r}: expected NAME=VALUE")
        if parse_json:
            try:
                text = json.loads(text)
            except ValueError as exc:
                raise CommandError(f"--{what} {key}: not JSON ({exc})") from None
        pairs[key] = text
    return pairs


class Command(BaseCommand):
    help = ("Run one task of a workflow here, its log on stdout: to try a task while writing it. Nothing is stored. "
            "Exit code 0 when it succeeds, 1 when it fails, 3 when a sensor answers 'not yet'.")

    def add_arguments(self, parser):
        parser.add_argument("workflow")
        parser.add_argument("task")
        parser.add_argument("--param", action="append", metavar="NAME=VALUE",
                            help="a run param (repeat for several); declared defaults fill the rest")
        parser.add_argument("--logical-date", help="ISO date and time with a timezone (default: now)")
        parser.add_argument("--upstream", action="append", metavar="TASK=JSON",
                            help="a parent task's result, as JSON (repeat for several)")
        parser.add_argument("--item", help="for a mapped task: the item, as JSON")
        parser.add_argument("--map-index", type=int, default=0, help="for a mapped task: its position (default 0)")

    def handle(self, *args, workflow, task, param=None, logical_date=None, upstream=None, item=None,
               map_index=0, **options):
        spec = _workflow_spec(workflow)
        if task not in spec["tasks"]:
            raise CommandError(f"workflow {workflow!r} has no task {task!r} (its tasks: {', '.join(spec['tasks'])})")
        try:
            params = clean_params(spec.get("params", {}), _pairs(param, "param", parse_json=False))
        except ParamError as exc:
            raise CommandError(f"params: {exc}") from None
        task_spec = spec["tasks"][task]
        message = {"id": 0, "run_id": 0, "task": task, "number": 1, "spec": task_spec,
                   "timeout": task_spec.get("timeout"), "logical_date": _logical_date(logical_date),
                   "params": params, "workflow": workflow,
                   "upstream": _pairs(upstream, "upstream", parse_json=True)}
        if task_spec.get("map_over"):
            try:
                message.update(map_index=map_index, item=json.loads(item) if item is not None else None)
            except ValueError as exc:
                raise CommandError(f"--item: not JSON ({exc})") from None
        self.stderr.write(f"running {workflow}.{task} (params {json.dumps(params, default=str)})")
        _, _, outcome, result, error, tb, _, metadata, *_ = _run_quietly(message, task_spec)
        if outcome == "rescheduled":
            self.stderr.write(f"not yet: the sensor would check again in {task_spec['sensor']['every']}s")
            sys.exit(NOT_YET)
        if outcome != "succeeded":
            raise CommandError(f"{workflow}.{task} failed: {error}")
        self.stdout.write(f"result: {result if result is not None else 'null'}")
        if metadata:
            self.stdout.write(f"metadata: {metadata}")


def _workflow_spec(workflow: str) -> dict:
    """The spec of a workflow as its module defines it now (discovered, not read from the database)."""

    found, failed = discover()
    workflows = {wf.name: wf for wfs in found.values() for wf in wfs}
    if workflow not in workflows:
        hint = "; ".join(f"{module}: {error.splitlines()[0]}" for module, error in failed.items())
        raise CommandError(f"no workflow {workflow!r} (known: {', '.join(sorted(workflows)) or 'none'})"
                           + (f"; modules that failed to import: {hint}" if hint else ""))
    found = workflows[workflow]
    if found.spec is None:
        raise CommandError(f"workflow {workflow!r} is broken:\n" + "\n".join(found.errors))
    return found.spec


def _logical_date(text: str | None) -> datetime:
    if not text:
        return clock.now()
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"--logical-date {text!r}: not an ISO date and time") from None
    if when.tzinfo is None:
        raise CommandError(f"--logical-date {text!r}: add a timezone, e.g. +00:00")
    return when


def _run_quietly(message: dict, task_spec: dict) -> tuple:
    """Run the task as a worker's child would; its log goes to stdout once, so the process's own
    log handlers keep quiet meanwhile."""
    handlers = list(logging.getLogger().handlers)
    levels = [handler.level for handler in handlers]
    for handler in handlers:
        handler.setLevel(logging.CRITICAL + 1)
    try:
        return executor.run(message, log_stream=sys.stdout, declared=task_spec, store_result=False)
    finally:
        for handler, level in zip(handlers, levels, strict=True):
            handler.setLevel(level)
        sys.stdout.flush()
