"""Every statement a block sends on the default connection, whichever path it takes: Django's
cursor (``connection.execute_wrapper``, what ``CaptureQueriesContext`` sees) and the prepared one
(``orchestrator.db.execute``: the throughput loops' statements and a producer's insert), in the
order sent."""

from __future__ import annotations

from unittest import mock

from django.db import connection

from orchestrator import db


class Sent:
    """``sent``: (sql, whether a transaction was open around it) per statement; ``sql``: the texts."""

    def __init__(self):
        self.sent: list[tuple[str, bool]] = []

    def _django(self, execute, sql, params, many, context):
        self.sent.append((sql, connection.in_atomic_block))
        return execute(sql, params, many, context)

    def __enter__(self):
        real = db.execute

        def prepared(cursor, sql, params=None):
            self.sent.append((str(sql), connection.in_atomic_block))
            return real(cursor, sql, params)

        self._patch = mock.patch.object(db, "execute", prepared)
        self._patch.start()
        self._wrapper = connection.execute_wrapper(self._django)
        self._wrapper.__enter__()
        return self

    def __exit__(self, *exc):
        self._wrapper.__exit__(*exc)
        self._patch.stop()

    @property
    def sql(self) -> list[str]:
        return [sql for sql, _ in self.sent]
