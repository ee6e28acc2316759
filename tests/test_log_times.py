"""A log line's time is shown in the reader's clock: the executor writes records' times in UTC
whatever the project's TIME_ZONE, and the log view marks each record's time as a <time> that the
pages' script shows in the chosen clock (local or UTC), like every other time."""

import logging
import os
import time

from orchestrator.executor import log_formatter
from orchestrator.templatetags.orchestrator_logs import log_lines


def test_records_are_written_with_utc_times_whatever_the_process_zone():
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "Europe/Berlin"  # as Django sets it for a project whose TIME_ZONE is Berlin
    time.tzset()
    try:
        record = logging.LogRecord("shop", logging.INFO, __file__, 1, "hello", (), None)
        record.created, record.msecs = 1774744200.25, 250.0  # 2026-03-29 00:30:00.250 UTC, 01:30 in Berlin
        assert log_formatter().format(record) == "2026-03-29 00:30:00,250 INFO shop: hello"
    finally:
        if saved is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = saved
        time.tzset()


def test_a_records_time_is_a_time_element_and_other_text_is_left_as_written():
    html = log_lines("2026-03-29 00:30:00,250 INFO shop: <b>hello</b>\n"
                     "Traceback (most recent call last):\n"
                     "  File x\n"
                     "printed 2026-03-29 00:30:00,250 INFO not a record\n")
    lines = html.split("</span>")
    assert lines[0] == ('<span class="ln" data-level="info"><time datetime="2026-03-29T00:30:00.250Z">'
                        '2026-03-29 00:30:00,250</time> INFO shop: &lt;b&gt;hello&lt;/b&gt;\n')
    assert 'data-level="info">Traceback' in lines[1] and 'data-level="info">  File x' in lines[2]
    assert lines[3] == '<span class="ln" data-level="stdout">printed 2026-03-29 00:30:00,250 INFO not a record\n'
    assert html.count("<time") == 1
