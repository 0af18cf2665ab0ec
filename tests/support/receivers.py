"""Alert receivers on 127.0.0.1 for the tests: an SMTP server (a few lines of
``socketserver`` speaking just enough SMTP: EHLO, AUTH PLAIN, MAIL, RCPT, DATA, QUIT; the
stdlib ``smtpd`` is deprecated) and an HTTP endpoint recording what is POSTed; and the
Airflow connections (``AIRFLOW_CONN_<ID>`` JSON) that point at them."""

from __future__ import annotations

import base64
import contextlib
import email
import json
import socketserver
import threading
from collections.abc import Iterator
from email import policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class SMTPHandler(socketserver.StreamRequestHandler):
    def _reply(self, text: str) -> None:
        self.wfile.write(text.encode() + b"\r\n")

    def handle(self) -> None:
        self._reply("220 test-smtp ready")
        sender, recipients = None, []
        while line := self.rfile.readline():
            command = line.decode().rstrip("\r\n")
            verb = command[:4].upper()
            if verb in ("EHLO", "HELO"):
                self._reply("250-test-smtp\r\n250 AUTH PLAIN")
            elif verb == "AUTH":
                _, login, password = base64.b64decode(command.split()[2]).split(b"\0")
                self.server.logins.append((login.decode(), password.decode()))
                self._reply("235 authenticated")
            elif verb == "MAIL":
                sender, recipients = command.split(":", 1)[1].strip(" <>"), []
                self._reply("250 OK")
            elif verb == "RCPT":
                recipients.append(command.split(":", 1)[1].strip(" <>"))
                self._reply("250 OK")
            elif verb == "DATA":
                self._reply("354 go on")
                data = []
                while (row := self.rfile.readline()) not in (b".\r\n", b""):
                    data.append(row[1:] if row.startswith(b"..") else row)
                self.server.messages.append((sender, recipients, b"".join(data)))
                self._reply("250 queued")
            elif verb == "QUIT":
                self._reply("221 bye")
                return
            else:  # RSET, NOOP
                self._reply("250 OK")


class Recorder(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append({"path": self.path, "headers": dict(self.headers),
                                     "json": json.loads(body)})
        self.send_response(self.server.status)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _serve(server):
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


@contextlib.contextmanager
def smtp_receiver() -> Iterator[Any]:
    """An SMTP server on 127.0.0.1; ``.messages``: (sender, recipients, bytes)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), SMTPHandler)
    server.daemon_threads = True
    server.messages, server.logins = [], []
    yield _serve(server)
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def webhook_receiver() -> Iterator[Any]:
    """An HTTP endpoint on 127.0.0.1; ``.requests``: path, headers, json of each POST;
    ``.status``: what it answers."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.requests, server.status = [], 200
    yield _serve(server)
    server.shutdown()
    server.server_close()


def email_connection(port: int) -> str:
    """An SMTP connection to the receiver on ``port`` (clear text, with a login)."""
    return json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": port,
                       "login": "alerts", "password": "smtp-pass",
                       "extra": {"to": "ml-team@example.org, oncall@example.org",
                                 "from_email": "airflow@example.org",
                                 "disable_ssl": True, "disable_tls": "true"}})


def webhook_connection(port: int, path: str) -> str:
    """An HTTP connection to the receiver on ``port``, POSTing to ``path``."""
    return json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": port,
                       "schema": "http", "login": "bot", "password": "hook-pass",
                       "extra": {"endpoint": path}})


def mails(server: Any) -> list:
    """What the SMTP receiver got: (sender, recipients, parsed message)."""
    return [(sender, recipients, email.message_from_bytes(data, policy=policy.default))
            for sender, recipients, data in server.messages]
