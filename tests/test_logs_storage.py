"""Task logs on a storage without local paths (S3 and the like): kept in memory while the task
runs and saved whole when the attempt ends."""

from datetime import UTC, datetime

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import Storage

from orchestrator import logs
from orchestrator.conf import log_storage
from orchestrator.models import Attempt
from orchestrator.runs import create_run

pytestmark = pytest.mark.django_db


class RemoteStorage(Storage):
    """Like S3: files have names and contents but no local path (Storage.path raises)."""

    files: dict[str, bytes] = {}

    def _save(self, name, content):
        self.files[name] = content.read()
        return name

    def _open(self, name, mode="rb"):
        return ContentFile(self.files[name], name=name)

    def exists(self, name):
        return name in self.files

    def delete(self, name):
        self.files.pop(name, None)

    def size(self, name):
        return len(self.files[name])


@pytest.fixture
def remote_storage(settings):
    # Changing the setting makes the app drop its storage instance (the setting_changed signal).
    RemoteStorage.files = {}
    settings.ORCHESTRATOR_LOG_STORAGE = f"{__name__}.RemoteStorage"
    assert isinstance(log_storage(), RemoteStorage)
    return log_storage()


def make_attempt():
    run, _ = create_run(None, trigger="job", tasks={"t": {"kind": "python", "ref": "workflows.jobs:noop"}})
    task_run = run.task_runs.get()
    return Attempt.objects.create(task_run=task_run, number=1, started_at=datetime.now(UTC))


def test_a_log_on_a_storage_without_local_paths_is_saved_when_the_attempt_ends(remote_storage):
    attempt = make_attempt()
    assert logs.local_path("anything.log") is None
    log = logs.AttemptLog(logs.attempt_log_name(attempt))
    log.write("first line\n")
    log.write("zweite Zeile ✓\n")
    assert log.fileno_for_subprocess() is None  # a shell task's output is piped instead
    name = log.finish()
    Attempt.objects.filter(pk=attempt.pk).update(log_path=name, outcome="succeeded")
    attempt.refresh_from_db()
    assert remote_storage.exists(name)
    assert logs.read(attempt) == ("first line\nzweite Zeile ✓\n", len("first line\nzweite Zeile ✓\n".encode()), True)
    assert logs.open_for_download(attempt).read().decode() == "first line\nzweite Zeile ✓\n"


def test_an_attempt_that_printed_nothing_stores_no_log(remote_storage):
    attempt = make_attempt()
    log = logs.AttemptLog(logs.attempt_log_name(attempt))
    assert log.finish() == ""
    assert not remote_storage.exists(logs.attempt_log_name(attempt))
    assert logs.read(attempt) == ("", 0, False)
