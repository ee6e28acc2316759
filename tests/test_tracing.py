"""Traces: with the OTEL_* variables set, a run is one trace from its enqueue (here, in this
process) through a real dispatcher's admission and a real worker's claim to the child process,
where the task's ORM query and HTTP call are spans under its attempt; an in-test OTLP receiver
gets the spans. Off, tracing imports nothing and adds no statement."""

from __future__ import annotations

import gzip
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from orchestrator import logs, tracing
from orchestrator.models import Attempt, QueueLimit, Run, TaskRun, Workflow, WorkflowVersion
from orchestrator.runs import create_run
from tests.conftest import process_env, wait_for
from tests.support.features_support import worker_loop
from tests.test_execution_rules import execute_claimed


class OtlpReceiver:
    """An OTLP/HTTP endpoint: every span posted to /v1/traces, decoded; GET /ping answers 200."""

    def __init__(self):
        self.spans: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            receiver.spans.append(_decoded(span))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def _value(value):
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _decoded(span) -> dict:
    return {"name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
            "parent": span.parent_span_id.hex(), "links": [link.span_id.hex() for link in span.links],
            "attributes": {a.key: _value(a.value) for a in span.attributes}, "error": span.status.code == 2}


@pytest.fixture
def otlp(monkeypatch):
    receiver = OtlpReceiver()
    variables = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100",
                 "OTEL_SERVICE_NAME": "orchestrator-tests"}
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert tracing.reload()
    yield receiver, variables
    tracing.flush()
    monkeypatch.undo()
    assert not tracing.reload()
    receiver.stop()


def task(name, upstream=(), queue="traced"):
    return {"kind": "python", "ref": "tests.support.tasks_for_tests:traced_work", "upstream": list(upstream), "queue": queue,
            "max_attempts": 1}


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_three_task_run_is_one_trace_from_its_enqueue_to_the_calls_of_each_task(otlp, processes, tmp_path,
                                                                                  admin_client):
    receiver, variables = otlp
    spec = {"tasks": {"extract": task("extract"), "transform": task("transform", ["extract"]),
                      "load": task("load", ["transform"])}}
    workflow = Workflow.objects.create(name="traced")
    workflow.current_version = WorkflowVersion.objects.create(workflow=workflow, number=1, hash="h1", spec=spec)
    workflow.save()
    QueueLimit.objects.create(queue="traced", max_running=2)  # so a dispatcher admits each task run
    env = process_env(ORCHESTRATOR_POLL_SECONDS="0.2", **variables)
    processes.start("dispatcher", env=env)
    processes.start("worker", "--queues", "traced", "--concurrency", "2", env=env)
    run, _ = create_run(workflow, trigger="manual", params={"ping": f"{receiver.url}/ping"})
    tracing.flush()
    wait_for(lambda: Run.objects.get(pk=run.pk).state == "succeeded", 60, message="the run to succeed")

    def spans_by_name():
        found = defaultdict(list)
        for span in list(receiver.spans):
            found[span["name"].split(" #")[0]].append(span)
        return found

    expected = {"run traced": 1, "enqueue": 1, **{f"{kind} {t}": 1 for kind in ("task", "claim", "attempt")
                                                   for t in ("extract", "transform", "load")},
                "dispatch": 3, "GET": 3}
    wait_for(lambda: all(len(spans_by_name()[name]) >= n for name, n in expected.items()), 30,
             message=f"the spans {expected}")
    spans = spans_by_name()
    (root,) = spans["run traced"]
    trace_id = root["trace"]
    assert {span["trace"] for span in receiver.spans} == {trace_id}
    assert root["parent"] == "" and root["attributes"]["orchestrator.state"] == "succeeded"
    (enqueue,) = spans["enqueue"]
    assert enqueue["parent"] == root["id"] and enqueue["attributes"]["orchestrator.trigger"] == "manual"
    dispatches = {span["attributes"]["orchestrator.task"]: span for span in spans["dispatch"]}
    for name in ("extract", "transform", "load"):
        task_run = TaskRun.objects.get(run=run, task=name)
        (task_span,) = spans[f"task {name}"]
        assert task_span["parent"] == root["id"]
        assert {"orchestrator.state": "succeeded", "orchestrator.queue": "traced", "orchestrator.attempts": 1,
                "orchestrator.task_run_id": task_run.pk}.items() <= task_span["attributes"].items()
        (claim,) = spans[f"claim {name}"]
        (attempt,) = spans[f"attempt {name}"]
        assert dispatches[name]["parent"] == claim["parent"] == attempt["parent"] == task_span["id"]
        assert attempt["links"] == [claim["id"]]
        assert attempt["attributes"]["orchestrator.attempt"] == 1
        assert attempt["attributes"]["orchestrator.outcome"] == "succeeded"
        assert attempt["attributes"]["orchestrator.worker"] == claim["attributes"]["orchestrator.worker"]
        # The task's own calls, under its attempt: its ORM query and its HTTP call.
        children = [span for span in receiver.spans if span["parent"] == attempt["id"]]
        assert {"SELECT orchestrator_workflow", "GET"} <= {span["name"] for span in children}
        query = next(span for span in children if span["name"] == "SELECT orchestrator_workflow")
        assert query["attributes"]["db.system"] == "postgresql"
        # The trace is in the task's log records, and on its page.
        log = logs.read(Attempt.objects.get(task_run=task_run), limit=10**6)[0]
        assert f"work of {name} done [trace_id={trace_id} span_id={attempt['id']}]" in log
        page = admin_client.get(reverse("orchestrator:web:task_run", args=[task_run.pk])).content.decode()
        assert trace_id in page


def test_the_otel_variables_turn_tracing_on():
    assert not tracing.configured({})
    assert tracing.configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert tracing.configured({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing.configured({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not tracing.configured({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})


@pytest.mark.django_db(transaction=True)
def test_off_a_worker_imports_no_opentelemetry(processes, tmp_path):
    from orchestrator.jobs import enqueue

    env = process_env(ORCHESTRATOR_POLL_SECONDS="0.2", ORCHESTRATOR_DATA_DIR=str(tmp_path))
    processes.start("worker", "--concurrency", "1", env=env)
    run, _ = enqueue("tests.support.tasks_for_tests:loaded_modules", args=["opentelemetry"])
    job = wait_for(lambda: TaskRun.objects.filter(run=run, state="succeeded").first(), 30, message="the job")
    assert job.result == []
    with_os, _ = enqueue("tests.support.tasks_for_tests:loaded_modules", args=["os"])
    # The same job does find what is loaded: the check can fail.
    assert "os" in wait_for(lambda: TaskRun.objects.filter(run=with_os, state="succeeded").first(), 30,
                            message="the second job").result


@pytest.mark.django_db
def test_off_a_job_costs_no_statement_more(clock, monkeypatch):
    """The statements of one job from enqueue to its end, off and on: on adds the reads of the
    task run's and the run's spans, off adds nothing, and no statement off reads a trace."""
    from orchestrator.jobs import enqueue

    loop = worker_loop()

    def one_job():
        with CaptureQueriesContext(connection) as queries:
            run, _ = enqueue("tests.support.tasks_for_tests:add", args=[1, 2], now=clock.now())
            execute_claimed(loop, 1, clock)
        assert TaskRun.objects.get(run=run).state == "succeeded"
        return [query["sql"] for query in queries]

    one_job()  # the first reads the concurrency limits, which the worker then keeps for a poll interval
    off = one_job()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
    try:
        assert tracing.reload()
        on = one_job()
    finally:
        monkeypatch.undo()
        tracing.reload()
    assert not any("trace" in sql for sql in off)
    extra = [sql for sql in on if "'trace'" in sql]
    assert len(on) == len(off) + len(extra) and len(extra) == 2
