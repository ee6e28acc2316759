"""Traces (OpenTelemetry): each run is a trace, from its enqueue through dispatch and claim to the
child process that runs each attempt, where the task's own calls (Django ORM queries, HTTP with
``requests`` or ``httpx``) become child spans of the attempt.

Configured by the standard variables, and off unless they ask for it: tracing is on when
``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``) or an OTLP endpoint is set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), unless
``OTEL_SDK_DISABLED=true``. The SDK, the OTLP exporter (HTTP) and the HTTP instrumentations are
the optional extra ``[otel]``; the rest (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER``) is the SDK's own.

**Free when off.** Every hook below returns at once when tracing is off: no module of
opentelemetry is imported, and no statement is added to any path (the tests count both).

The spans of one run::

    run <workflow>                           created → finished (state, trigger)
    ├── enqueue                              where the run was created (web, API, scheduler)
    └── task <name>                          created → finished (state, queue, attempts)
        ├── dispatch                         the dispatcher admitted it under a limit
        ├── claim                            a worker claimed it (worker, attempt number)
        └── attempt <name> #n                in the child process (outcome), linked to its claim
            ├── SELECT orchestrator_…         the task's ORM queries
            └── GET                          its HTTP calls

**How the processes agree on ids.** When a run is created, it gets a trace id; each of its task
runs carries the W3C ``traceparent`` of the run's span in its row (``spec["trace"]``), which
every process that touches the task run reads with the row it reads anyway (the claim returns
the spec). The run's span id and each task run's span id are derived from the trace id (and the
task's name and map index), so the process that ends a task run, or a run, emits its span under
the id its children already name as their parent, with no row to look up.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.db import connection

log = logging.getLogger(__name__)

TRACE_KEY = "trace"  # the key of a task run's spec that carries the traceparent of its run's span


def configured(environ=os.environ) -> bool:
    """Whether the OTEL_* variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


ENABLED = configured()
_state = threading.local()  # the ids the next span takes (see _Ids)
_lock = threading.Lock()
_pipeline = None  # (tracer provider, tracer), made on first use in each process


def reload(environ=os.environ) -> bool:
    """Read the variables again (and drop this process's pipeline): for tests and embedding code
    that sets them after import. Returns whether tracing is on."""
    global ENABLED, _pipeline
    if _pipeline is not None:
        with contextlib.suppress(Exception):
            _pipeline[0].shutdown()
        _pipeline = None
    ENABLED = configured(environ)
    return ENABLED


# --- ids -----------------------------------------------------------------------------------------

def _derived(*parts) -> str:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:16]
    return digest if int(digest, 16) else "0000000000000001"


def run_span_id(trace_id: str) -> str:
    return _derived(trace_id, "run")


def task_span_id(trace_id: str, task: str, map_index) -> str:
    return _derived(trace_id, "task", task, -1 if map_index is None else map_index)


def parse(traceparent) -> tuple[str, str] | None:
    """(trace id, parent span id) of a W3C traceparent, or None."""
    parts = traceparent.split("-") if isinstance(traceparent, str) else []
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    return parts[1], parts[2]


def trace_id_of(spec: dict | None) -> str:
    """The trace id a task run's spec carries ("" when it was created with tracing off)."""
    found = parse((spec or {}).get(TRACE_KEY))
    return found[0] if found else ""


# --- the pipeline (imports opentelemetry: only ever called when ENABLED) ------------------------

def _pipe():
    """This process's tracer, made on first use: the SDK's provider with the exporter the
    variables name, ids that can be chosen (``_Ids``), and the global provider when the project
    set none (so a task's own spans and instrumentations join the same traces)."""
    global _pipeline, ENABLED
    if _pipeline is not None:
        return _pipeline[1]
    with _lock:
        if _pipeline is None:
            try:
                _pipeline = _make_pipeline()
            except Exception as exc:  # noqa: BLE001 - tracing must never stop the work it watches
                log.error("tracing is configured but cannot start, so it is off: %s: %s (install the [otel] "
                          "extra: pip install 'django-dag-orchestrator[otel]')", type(exc).__name__, exc,
                          extra={"action": "tracing_off"})
                ENABLED = False
                return None
    return _pipeline[1]


def _make_pipeline():
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _Ids(RandomIdGenerator):
        """The SDK's random ids, except for a span whose ids were chosen (``_chosen``)."""

        def generate_span_id(self) -> int:
            chosen = getattr(_state, "span_id", None)
            return int(chosen, 16) if chosen else super().generate_span_id()

        def generate_trace_id(self) -> int:
            chosen = getattr(_state, "trace_id", None)
            return int(chosen, 16) if chosen else super().generate_trace_id()

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "orchestrator"}
    provider = TracerProvider(resource=Resource.create(attributes), id_generator=_Ids())
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        trace.set_tracer_provider(provider)
    return provider, provider.get_tracer("orchestrator")


@contextlib.contextmanager
def _chosen(trace_id: str | None = None, span_id: str | None = None):
    _state.trace_id, _state.span_id = trace_id, span_id
    try:
        yield
    finally:
        _state.trace_id = _state.span_id = None


def _parent(trace_id: str, span_id: str):
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    return trace.set_span_in_context(NonRecordingSpan(SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))


def _ns(when: datetime | None) -> int | None:
    return int(when.timestamp() * 1e9) if when is not None else None


def _emit(name: str, trace_id: str, parent: str | None, *, span_id: str | None = None, start=None, end=None,
          attributes: dict | None = None, error: str = ""):
    """Record a span that is over (or starts and ends now): under ``parent`` (a span id of the
    trace) or as the trace's root, with the span id given when it is one the others derive."""
    tracer = _pipe()
    if tracer is None:
        return None
    from opentelemetry.context import Context
    from opentelemetry.trace import Status, StatusCode

    context = _parent(trace_id, parent) if parent else Context()
    with _chosen(None if parent else trace_id, span_id):
        span = tracer.start_span(name, context=context, start_time=_ns(start),
                                 attributes={k: v for k, v in (attributes or {}).items() if v is not None})
    if error:
        span.set_status(Status(StatusCode.ERROR, error[:500]))
    span.end(end_time=_ns(end) if end is not None else None)
    return span


# --- hooks: each returns at once when tracing is off ----------------------------------------------

def new_run(tasks: dict[str, dict]) -> dict[str, dict]:
    """The task specs of a new run, each carrying the traceparent of the run's span (a new trace)."""
    if not ENABLED:
        return tasks
    trace_id = os.urandom(16).hex()
    traceparent = f"00-{trace_id}-{run_span_id(trace_id)}-01"
    return {name: {**spec, TRACE_KEY: traceparent} for name, spec in tasks.items()}


def enqueued(run, tasks: dict[str, dict]) -> None:
    """The enqueue span of a run just created (in the creating process)."""
    if not ENABLED:
        return
    found = parse(next(iter(tasks.values()), {}).get(TRACE_KEY))
    if found:
        _emit("enqueue", found[0], run_span_id(found[0]), attributes={
            "orchestrator.run_id": run.pk, "orchestrator.trigger": run.trigger,
            "orchestrator.workflow": run.workflow.name if run.workflow_id else None, "orchestrator.tasks": len(tasks)})


# What the spans of task runs and runs need, read only when tracing is on.
_TASK_RUNS = """
SELECT t.id, t.run_id, t.task, t.map_index, t.spec->>'trace', t.state, t.queue, t.tenant, t.attempts,
       t.created_at, t.finished_at, t.error
FROM orchestrator_taskrun t WHERE t.id = ANY (%s) AND t.spec ? 'trace'
"""
_RUNS = """
SELECT r.id, r.state, r.trigger, r.created_at, r.finished_at, COALESCE(w.name, ''),
       (SELECT t.spec->>'trace' FROM orchestrator_taskrun t WHERE t.run_id = r.id AND t.spec ? 'trace' LIMIT 1),
       (SELECT t.task FROM orchestrator_taskrun t WHERE t.run_id = r.id LIMIT 1)
FROM orchestrator_run r LEFT JOIN orchestrator_workflow w ON w.id = r.workflow_id
WHERE r.id = ANY (%s)
"""


def _task_runs(ids: Iterable[int]) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(_TASK_RUNS, [sorted(set(ids))])
        return cursor.fetchall()


def _task_attributes(task_run_id, run_id, task, map_index, **more) -> dict:
    return {"orchestrator.task_run_id": task_run_id, "orchestrator.run_id": run_id, "orchestrator.task": task,
            "orchestrator.map_index": map_index if map_index is not None and map_index >= 0 else None, **more}


def dispatched(task_run_ids: Sequence[int], now: datetime) -> None:
    """The dispatch spans of task runs a dispatcher just admitted under a limit."""
    if not ENABLED or not task_run_ids:
        return
    for task_run_id, run_id, task, map_index, traceparent, _, queue, tenant, *_ in _task_runs(task_run_ids):
        found = parse(traceparent)
        if found:
            _emit("dispatch", found[0], task_span_id(found[0], task, map_index), start=now, end=now,
                  attributes=_task_attributes(task_run_id, run_id, task, map_index, **{
                      "orchestrator.queue": queue, "orchestrator.tenant": tenant}))


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def claimed(messages: Sequence[dict], started: datetime, worker_id: int | None) -> None:
    """The claim spans of task runs this worker just claimed; each message then carries the
    claim's context (to link the attempt to it) and the worker's name."""
    if not ENABLED:
        return
    for message in messages:
        found = parse(message["spec"].get(TRACE_KEY))
        if not found:
            continue
        message["worker"] = worker_name()
        span = _emit(f"claim {message['task']}", found[0], task_span_id(found[0], message["task"], message.get("map_index")),
                     start=started, attributes=_task_attributes(
                         message["id"], message["run_id"], message["task"], message.get("map_index"), **{
                             "orchestrator.queue": message["spec"].get("queue"), "orchestrator.worker": message["worker"],
                             "orchestrator.worker_id": worker_id, "orchestrator.attempt": message["number"]}))
        if span is not None:
            message["claim_span"] = format(span.get_span_context().span_id, "016x")


class _Untraced:
    log_fields: dict = {}

    def end(self, outcome: str, error: str = "") -> None:
        pass


UNTRACED = _Untraced()


class _Attempt:
    """An attempt's span, current until ``end``."""

    def __init__(self, span):
        from opentelemetry import context, trace

        self.span = span
        self.token = context.attach(trace.set_span_in_context(span))
        ids = span.get_span_context()
        self.log_fields = {"trace_id": format(ids.trace_id, "032x"), "span_id": format(ids.span_id, "016x")}

    def end(self, outcome: str, error: str = "") -> None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("orchestrator.outcome", outcome)
        if error:
            self.span.set_status(Status(StatusCode.ERROR, error[:500]))
        context.detach(self.token)
        self.span.end()


def attempt(message: dict):
    """Start the attempt's span (in the child process), current until its ``end(outcome, error)``
    so that the task's instrumented calls are its children; its ``log_fields`` go on the
    attempt's log records."""
    found = parse(message.get("spec", {}).get(TRACE_KEY)) if ENABLED else None
    tracer = _pipe() if found else None
    if tracer is None:
        return UNTRACED
    from opentelemetry.trace import Link

    trace_id, _ = found
    links = [Link(_parent_context(trace_id, message["claim_span"]))] if message.get("claim_span") else []
    attributes = _task_attributes(message["id"], message["run_id"], message["task"], message.get("map_index"), **{
        "orchestrator.attempt": message["number"], "orchestrator.queue": message["spec"].get("queue"),
        "orchestrator.worker": message.get("worker")})
    return _Attempt(tracer.start_span(
        f"attempt {message['task']} #{message['number']}", links=links,
        context=_parent(trace_id, task_span_id(trace_id, message["task"], message.get("map_index"))),
        attributes={key: value for key, value in attributes.items() if value is not None}))


def _parent_context(trace_id: str, span_id: str):
    from opentelemetry.trace import SpanContext, TraceFlags

    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def task_runs_ended(accepted: Sequence[tuple[int, int, str]], finished_states: Iterable[str]) -> None:
    """The spans of task runs that reached a final state ((task_run_id, run_id, state) rows)."""
    if not ENABLED:
        return
    finished_states = set(finished_states)
    ended = [task_run_id for task_run_id, _, state in accepted if state in finished_states]
    if not ended:
        return
    for (task_run_id, run_id, task, map_index, traceparent, state, queue, tenant, attempts, created, finished,
         error) in _task_runs(ended):
        found = parse(traceparent)
        if found:
            _emit(f"task {task}", found[0], found[1], span_id=task_span_id(found[0], task, map_index),
                  start=created, end=finished, error=error if state != "succeeded" else "",
                  attributes=_task_attributes(task_run_id, run_id, task, map_index, **{
                      "orchestrator.state": state, "orchestrator.queue": queue, "orchestrator.tenant": tenant,
                      "orchestrator.attempts": attempts}))


def runs_ended(run_ids: Sequence[int]) -> None:
    """The spans of runs that ended: the roots of their traces."""
    if not ENABLED or not run_ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(_RUNS, [sorted(set(run_ids))])
        rows = cursor.fetchall()
    for run_id, state, trigger, created, finished, workflow, traceparent, first_task in rows:
        found = parse(traceparent)
        if found:
            _emit(f"run {workflow or first_task}", found[0], None, span_id=found[1], start=created, end=finished,
                  error="" if state == "succeeded" else f"the run ended {state}",
                  attributes={"orchestrator.run_id": run_id, "orchestrator.workflow": workflow or None,
                              "orchestrator.trigger": trigger, "orchestrator.state": state})


# --- in the worker's child processes --------------------------------------------------------------

def child_started() -> None:
    """A worker's child: the task's database queries (every connection's execute wrapper) and
    HTTP calls (the requests and httpx instrumentations, when installed) become spans."""
    if not ENABLED or _pipe() is None:
        return
    from django.db.backends.signals import connection_created

    connection_created.connect(_trace_queries, dispatch_uid="orchestrator.tracing")
    disabled = {name.strip() for name in os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")}
    for name, path in (("requests", "opentelemetry.instrumentation.requests:RequestsInstrumentor"),
                       ("httpx", "opentelemetry.instrumentation.httpx:HTTPXClientInstrumentor")):
        if name in disabled:
            continue
        module, _, attribute = path.partition(":")
        with contextlib.suppress(ImportError):
            instrumentor = getattr(__import__(module, fromlist=[attribute]), attribute)()
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument(tracer_provider=_pipeline[0])


def _trace_queries(sender, connection, **kwargs) -> None:
    if _query_span not in connection.execute_wrappers:
        connection.execute_wrappers.append(_query_span)


def _query_span(execute, sql, params, many, context):
    """A span per database query made while an attempt's span is current (OpenTelemetry's
    database conventions: the operation and table in the name, the statement without its values)."""
    from opentelemetry import trace

    current = trace.get_current_span()
    if not current.is_recording():
        return execute(sql, params, many, context)
    words = str(sql).split()
    operation = words[0].upper() if words else "SQL"
    table = next((w.strip('"') for before, w in zip(words, words[1:], strict=False)
                  if before.upper() in ("FROM", "INTO", "UPDATE")), "")
    db = context["connection"].settings_dict
    with _pipe().start_as_current_span(f"{operation} {table}".strip(), kind=trace.SpanKind.CLIENT, attributes={
            "db.system": "postgresql", "db.namespace": db.get("NAME") or "", "db.operation.name": operation,
            "db.collection.name": table, "db.query.text": str(sql)[:2000]}):
        return execute(sql, params, many, context)


def flush() -> None:
    """Export what this process recorded (a child leaves with os._exit, which skips atexit)."""
    if _pipeline is not None:
        with contextlib.suppress(Exception):
            _pipeline[0].force_flush(5000)
