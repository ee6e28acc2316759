"""Where the notification tests receive what the product sends: a real SMTP server (aiosmtpd) and
a real HTTP server standing for Slack's and Teams' incoming webhooks."""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Mailbox:
    """Every email the SMTP server took: (recipients, parsed message)."""

    port: int = 0
    received: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's naming
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self.lock:
            self.received.append((list(envelope.rcpt_tos), message))
        return "250 OK"

    def to(self, address: str) -> list:
        with self.lock:
            return [message for rcpts, message in self.received if address in rcpts]

    @staticmethod
    def body(message) -> str:
        return message.get_body(preferencelist=("plain",)).get_content()


class SmtpServer:
    def __init__(self):
        self.mailbox = Mailbox(port=free_port())
        self.controller = Controller(self.mailbox, hostname="127.0.0.1", port=self.mailbox.port)

    def __enter__(self) -> Mailbox:
        self.controller.start()
        return self.mailbox

    def __exit__(self, *exc):
        self.controller.stop()


@dataclass
class ChatReceiver:
    """An HTTP server that takes POSTs: (path, headers, raw body, parsed JSON). ``fail`` POSTs get a 500 first."""

    fail: int = 0
    posts: list = field(default_factory=list)
    url: str = ""

    def start(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                failing = receiver.fail > 0
                receiver.fail -= 1 if failing else 0
                if not failing:
                    receiver.posts.append((self.path, dict(self.headers), body, json.loads(body)))
                self.send_response(500 if failing else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def to(self, path: str) -> list:
        return [post for post in self.posts if post[0] == path]
