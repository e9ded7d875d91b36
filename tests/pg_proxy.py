"""A TCP relay in front of PostgreSQL that cuts a connection at a chosen protocol moment: a
real network fault (the client's socket really closes) at a point that timing cannot hit
reliably, such as just after the server committed but before the client heard it.

Use it with ``sslmode=disable`` in the client's URL, so the relay sees the messages.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from types import TracebackType

#: ``on_send(chunk)`` runs before a chunk from a client reaches the server; returning True
#: drops that connection as soon as the server answers the chunk (the answer is lost).
OnSend = Callable[[bytes], bool]
#: ``on_cut()`` runs after the server answered and before the client's socket is closed.
OnCut = Callable[[], None]


class CuttingProxy:
    """Relays 127.0.0.1:``port`` to ``target``, one pair of threads per connection."""

    def __init__(self, target: tuple[str, int], on_send: OnSend,
                 on_cut: OnCut = lambda: None) -> None:
        self.target, self.on_send, self.on_cut = target, on_send, on_cut
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:
            _close(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            armed = threading.Event()
            threading.Thread(target=self._to_server, args=(client, server, armed),
                             daemon=True).start()
            threading.Thread(target=self._to_client, args=(server, client, armed),
                             daemon=True).start()

    def _to_server(self, client: socket.socket, server: socket.socket,
                   armed: threading.Event) -> None:
        """Client -> server; arms the cut before the chunk leaves, so its answer is caught."""
        while chunk := _recv(client):
            if self.on_send(chunk):
                armed.set()
            try:
                server.sendall(chunk)
            except OSError:
                break
        _close(server)

    def _to_client(self, server: socket.socket, client: socket.socket,
                   armed: threading.Event) -> None:
        """Server -> client; once armed, the next answer is swallowed and both sides closed."""
        while chunk := _recv(server):
            if armed.is_set():
                self.cuts += 1
                self.on_cut()
                break
            try:
                client.sendall(chunk)
            except OSError:
                break
        _close(client)
        _close(server)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
