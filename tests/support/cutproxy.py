"""A TCP proxy on 127.0.0.1 whose link a test can cut and restore, or make slow: the
network between a client and a real server failing for a while, with the server's state
kept, or a far server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class CutProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; ``cut()`` drops every connection and
    refuses new ones until ``restore()``. With ``latency_s``, what the client sends waits
    that long on its way (each request of a kept-alive HTTP connection, each time)."""

    def __init__(self, target_host: str, target_port: int, *, latency_s: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.latency_s = latency_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._cut = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.close()
            self._open.clear()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()  # the peer sees its connection reset
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for a, b, wait in ((client, upstream, self.latency_s), (upstream, client, 0.0)):
                threading.Thread(target=self._pump, args=(a, b, wait), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, wait: float) -> None:
        try:
            while data := source.recv(65536):
                time.sleep(wait)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
