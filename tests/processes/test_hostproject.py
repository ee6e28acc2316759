"""A Django project of its own (tests/hostproject: a shop) adds the orchestrator by following the
README's "Add it to an existing Django project", and runs it as separate services with its own
INSTALLED_APPS: a workflow task and a django.tasks task both update the shop's model, work
enqueued in a rolled-back transaction never runs, and the UI, the API and its schema work under the
URL prefix the shop chose."""

import json
import re
import socket
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.support.hostproject_support import HOSTPROJECT, PREFIX, Browser, HostProject

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def readme_section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("## Add it to an existing Django project", 1)[1].split("\n## ", 1)[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_readme_steps_are_the_host_projects_settings():
    """The host project's settings are the README's snippets, so this test checks what the README
    says (every line of the marked parts appears in the README's section, in order)."""
    section = readme_section()
    for path in (HOSTPROJECT / "hostproject" / "settings.py", HOSTPROJECT / "hostproject" / "urls.py"):
        text = path.read_text()
        parts = re.findall(r"# --- README: Add it to an existing Django project \(([^)]*)\)\n(.*?)\s*# --- end", text, re.S)
        assert parts, path
        for _, body in parts:
            position = 0
            for line in body.strip().splitlines():
                found = section.find(line.strip(), position)
                assert found >= 0, f"{path.name}: {line.strip()!r} is not in the README's section (in order)"
                position = found


def run_the_shop(host: HostProject, processes) -> None:
    """Everything the README's section promises, from migrate to a page under the prefix."""
    host.create_database()
    check = host.manage("check", "--fail-level", "WARNING")
    assert check.returncode == 0, check.stdout + check.stderr
    migrate = host.manage("migrate", "--no-input")
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    sync = host.manage("sync_workflows", "--strict")
    assert sync.returncode == 0 and "created   fulfil_order" in sync.stdout, sync.stdout + sync.stderr

    token = host.manage("create_token", "clerk", "--create", "--role", "operator").stdout.strip().split()[-1]
    host.shell("from django.contrib.auth.models import User; "
               "User.objects.create_superuser('boss', 'boss@shop.example', 'a-long-shop-password')")

    # The worker is the shop's own manage.py: it runs the shop's code, with the shop's apps.
    port = free_port()
    host.start(processes, "dispatcher", name="dispatcher")
    host.start(processes, "worker", "--queues", "default,mail", "--concurrency", "2", name="worker")
    server = host.start(processes, "runserver", f"127.0.0.1:{port}", "--noreload", name="web")
    browser = Browser(f"http://127.0.0.1:{port}")
    wait_for(lambda: browser.answers("/") if server.poll() is None else
             pytest.fail(Path(server.log_path).read_text()), 60, message="the shop's web server")

    out = host.shell(
        "import json\n"
        "from django.db import transaction\n"
        "from shop.models import Order\n"
        "from shop.tasks import never_runs, send_invoice\n"
        "order = Order.objects.create(number='A-1', total_cents=1999)\n"
        "with transaction.atomic():\n"
        "    invoice = send_invoice.enqueue(order.pk)\n"
        "try:\n"
        "    with transaction.atomic():\n"
        "        never_runs.enqueue(order.pk)\n"
        "        raise RuntimeError('the order form failed')\n"
        "except RuntimeError:\n"
        "    pass\n"
        "print(json.dumps({'order': order.pk, 'invoice': invoice.id, 'status': invoice.status}))\n"
    )
    made = json.loads(out.strip().splitlines()[-1])
    assert made["status"] == "READY"

    # The workflow is triggered through the API under the shop's prefix.
    auth = {"Authorization": f"Token {token}"}
    status, headers, body = browser.request("POST", f"{PREFIX}api/workflows/fulfil_order/runs/",
                                            {"params": {"order": made["order"]}}, headers=auth)
    assert status == 201, body
    assert headers["Location"] == f"{PREFIX}api/runs/{json.loads(body)['id']}/"
    assert browser.request("GET", headers["Location"], headers=auth)[0] == 200

    wait_for(lambda: host.query("SELECT status, invoiced FROM shop_order WHERE id = %s", [made["order"]])[0]
             == ("shipped", True), 90, message="the workflow and the task to update the order")
    result = host.shell(
        "from shop.tasks import send_invoice\n"
        f"r = send_invoice.get_result({made['invoice']!r})\n"
        "print(r.status, r.return_value['invoiced'], r.task.queue_name)\n"
    )
    assert result.split()[-3:] == ["SUCCESSFUL", "A-1", "mail"]
    # The rolled-back enqueue stored nothing, so nothing can ever run it.
    assert host.query("SELECT count(*) FROM orchestrator_run WHERE trigger = 'job'")[0][0] == 1
    assert host.query("SELECT notes FROM shop_order WHERE id = %s", [made["order"]])[0][0] == ["invoice sent"]

    # The pages, their links and their static files, under the prefix.
    status, headers, _ = browser.request("GET", PREFIX)
    assert status == 302 and headers["Location"].startswith(f"{PREFIX}login/?next=")
    browser.log_in(f"{PREFIX}login/", "boss", "a-long-shop-password")
    status, _, html = browser.request("GET", f"{PREFIX}workflows/fulfil_order/")
    assert status == 200 and "fulfil_order" in html
    links = re.findall(r'(?:href|hx-get|hx-post|action|src)="(/[^"]*)"', html)
    assert links and all(link.startswith((PREFIX, "/static/", "/admin/")) for link in links), links
    css = re.search(r'href="(/static/orchestrator/[^"]+\.css)"', html).group(1)
    assert browser.request("GET", css)[0] == 200

    # The API schema, without DEFAULT_SCHEMA_CLASS in the shop's settings, describes this API only.
    status, _, body = browser.request("GET", f"{PREFIX}api/schema/?format=json", headers=auth)
    assert status == 200, body[:500]
    paths = json.loads(body)["paths"]
    assert paths and all(path.startswith(f"{PREFIX}api/") for path in paths)


def test_a_django_project_adds_the_app_as_the_readme_says_and_runs_its_own_tasks(processes, tmp_path):
    host = HostProject(tmp_path)
    try:
        run_the_shop(host, processes)
    finally:
        processes.stop_all()
        processes.started.clear()
        host.drop_database()
