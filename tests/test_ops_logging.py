"""Structured logs: one JSON object per line, with run id, task and attempt inside bind()."""

import io
import json
import logging
import subprocess
import sys
import threading

from orchestrator import logformat
from tests.conftest import ROOT


def capture(formatter: logging.Formatter):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(logformat.ContextFilter())
    logger = logging.getLogger("tests.ops.logging")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def lines(stream) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_inside_bind_carries_run_task_and_attempt():
    logger, stream = capture(logformat.JsonFormatter())
    logger.info("before")
    with logformat.bind(run_id=42, task="extract", attempt=2):
        logger.info("loading %s rows", 500, extra={"rows": 500})
        with logformat.bind(attempt=3):
            logger.warning("retrying")
    logger.info("after")

    before, inside, nested, after = lines(stream)
    assert inside["message"] == "loading 500 rows"
    assert (inside["run_id"], inside["task"], inside["attempt"], inside["rows"]) == (42, "extract", 2, 500)
    assert inside["level"] == "INFO" and inside["logger"] == "tests.ops.logging"
    assert (nested["run_id"], nested["task"], nested["attempt"]) == (42, "extract", 3)
    for outside in (before, after):
        assert not {"run_id", "task", "attempt"} & set(outside)


def test_an_exception_is_one_json_line_with_its_traceback():
    logger, stream = capture(logformat.JsonFormatter())
    with logformat.bind(run_id=7, task="load", attempt=1):
        try:
            raise RuntimeError("disk full\nsecond line")
        except RuntimeError:
            logger.exception("task failed")
    assert len(stream.getvalue().splitlines()) == 1
    (record,) = lines(stream)
    assert record["run_id"] == 7
    assert "RuntimeError: disk full" in record["exception"]


def test_bound_fields_stay_in_their_own_thread():
    logger, stream = capture(logformat.JsonFormatter())
    inside = threading.Event()
    done = threading.Event()

    def task():
        with logformat.bind(run_id=1, task="a", attempt=1):
            inside.set()
            done.wait(5)

    thread = threading.Thread(target=task)
    thread.start()
    assert inside.wait(5)
    logger.info("from the main thread")
    done.set()
    thread.join(5)
    assert "run_id" not in lines(stream)[0]


def test_the_text_format_appends_the_bound_fields():
    logger, stream = capture(logformat.TextFormatter("%(levelname)s %(message)s"))
    with logformat.bind(run_id=5, task="t", attempt=1):
        logger.info("hello")
    logger.info("plain")
    assert stream.getvalue().splitlines() == ["INFO hello [run_id=5 task=t attempt=1]", "INFO plain"]


def test_log_format_json_makes_every_process_log_json_lines():
    code = (
        "import django, logging; django.setup();"
        "from orchestrator import logformat;"
        "log = logging.getLogger('orchestrator.worker');"
        "log.info('worker started');"
        "exec('with logformat.bind(run_id=9, task=\"x\", attempt=1):\\n    log.info(\"running\")')"
    )
    env = {"DJANGO_SETTINGS_MODULE": "project.settings", "LOG_FORMAT": "json", "PATH": "/usr/bin:/bin",
           "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none", "SECRET_KEY": "x" * 50}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert [r["message"] for r in records] == ["worker started", "running"]
    assert "run_id" not in records[0]
    assert (records[1]["run_id"], records[1]["task"], records[1]["attempt"]) == (9, "x", 1)
