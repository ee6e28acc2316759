"""A task run's result tab: what the task returned (its ``result``), as Airflow's XCom view shows
it. The JSON is pretty-printed and cut into pages by PostgreSQL, so a result of megabytes costs
one page of text on the wire and on the page, never the whole value. A mapped task's result is
its instances' results: they are listed 50 at a time by map index, each with the start of its
value and a link to its own result tab. A result kept in the log storage (``orchestrator.results``)
is read back and pretty-printed by this process for each page, its size says so on the list."""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import connection
from django.shortcuts import get_object_or_404

from orchestrator import access, results
from orchestrator.models import TaskRun
from orchestrator.web.errors import InvalidInput, query_int
from orchestrator.web.kit import page, viewer_required

PAGE_CHARS = 20_000  # characters of pretty-printed JSON on one page
INSTANCES = 50  # instances of a mapped task per page
PREVIEW = 160  # characters of each instance's result in the list
MAX_OFFSET = 2**40

# The value's size and one page of it, pretty-printed in the database: only the page travels.
RESULT_PAGE = """
SELECT t.result IS NULL, char_length(p.text), substr(p.text, %(start)s, %(size)s), t.result -> %(stored)s
FROM orchestrator_taskrun t CROSS JOIN LATERAL (SELECT jsonb_pretty(t.result) AS text) p
WHERE t.id = %(id)s
"""

# A page of a mapped task's instances by map index (on taskrun_unique_task), each with the
# start of its result.
INSTANCE_PAGE = """
SELECT id, map_index, state, result IS NULL, char_length(result::text), left(result::text, %(preview)s),
       result -> %(stored)s ->> 'bytes'
FROM orchestrator_taskrun
WHERE run_id = %(run)s AND task = %(task)s AND map_index > %(after)s
ORDER BY map_index LIMIT %(limit)s
"""


@dataclass
class Text:
    """One page of a result's pretty-printed JSON."""

    empty: bool  # the task returned nothing (None), or has not ended
    length: int  # characters in all
    offset: int  # where this page starts (0-based)
    text: str
    stored: bool = False  # kept in the log storage, too large for a row

    @property
    def end(self) -> int:
        return self.offset + len(self.text)

    @property
    def next_offset(self) -> int | None:
        return self.end if self.end < self.length else None

    @property
    def previous_offset(self) -> int | None:
        return max(0, self.offset - PAGE_CHARS) if self.offset else None


def result_page(task_run_id: int, offset: int = 0, size: int = PAGE_CHARS) -> Text:
    with connection.cursor() as cursor:
        cursor.execute(RESULT_PAGE, {"id": task_run_id, "start": offset + 1, "size": size, "stored": results.KEY})
        empty, length, text, stored = cursor.fetchone()
    if stored is not None:
        # Kept in the log storage (too large for a row): read back and pretty-printed here.
        whole = json.dumps(results.shown({results.KEY: json.loads(stored) if isinstance(stored, str) else stored}),
                           indent=4, ensure_ascii=False)
        length, text = len(whole), whole[offset:offset + size]
    if not empty and offset and offset >= length:
        raise InvalidInput("offset", f"offset must be below the result's {length:,} characters, got {offset:,}")
    return Text(bool(empty), length or 0, offset, text or "", stored is not None)


def instance_page(tr: TaskRun, after: int = -1, limit: int = INSTANCES) -> tuple[list[dict], int | None]:
    """Up to ``limit`` instances of mapped task ``tr`` after map index ``after``; the index the
    next page starts after, or None."""
    with connection.cursor() as cursor:
        cursor.execute(INSTANCE_PAGE, {"run": tr.run_id, "task": tr.task, "after": after, "limit": limit + 1,
                                       "preview": PREVIEW, "stored": results.KEY})
        rows = cursor.fetchall()
    found = [{"id": row[0], "map_index": row[1], "state": row[2], "empty": row[3], "length": row[4] or 0,
              "preview": row[5] or "", "stored_bytes": row[6]} for row in rows[:limit]]
    return found, (found[-1]["map_index"] if len(rows) > limit else None)


def result_context(tr: TaskRun, offset: int = 0, after: int = -1) -> dict:
    """The result tab of ``tr``: a mapped task's instances from map index ``after``, any other
    task's value from character ``offset``."""
    context = {"tr": tr, "run": tr.run, "mapped": tr.map_index == -1 and "map_over" in tr.spec}
    if context["mapped"]:
        context["instances"], context["next_after"] = instance_page(tr, after)
        context["after"] = after
    else:
        context["value"] = result_page(tr.pk, offset)
    return context


@viewer_required
def task_run_result(request, task_run_id):
    tr = get_object_or_404(access.visible(request.user, TaskRun.objects.select_related("run__workflow")
                                          .defer("result", "item")), pk=task_run_id)
    offset = query_int(request, "offset", 0, 0, MAX_OFFSET)
    after = query_int(request, "after", -1, 0, 2**31 - 1)
    return page(request, "orchestrator/web/task_run_result.html", result_context(tr, offset, after))
