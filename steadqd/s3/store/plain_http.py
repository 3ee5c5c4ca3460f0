"""Plain-HTTP requests of the direct transport on kept sockets, without urllib3: the same-host store's request path.

Why: on a store without TLS or proxy (a same-host SeaweedFS, MinIO on a
private network) urllib3 and ``http.client``'s request side were about
three quarters of a request's client CPU (docs/performance.md, "Bucket
queues"): urllib3's header dictionaries, retry and timeout objects and
response wrappers, ``http.client``'s header-by-header request building,
for an answer the server gives in a fraction of that. This sends the
request's head as one string, built from the signed headers, and reads
the answer with :class:`~steadqd.s3.store.s3_direct`'s ``_Response``
(``http.client``'s own framing: Content-Length, chunked, close, HEAD and
bodiless statuses). TLS and proxies stay on urllib3, which brings them.

What it keeps from urllib3, because the protocol's outcome split rests on
it: a failure to open a connection is :class:`NeverSent` (nothing was
sent, the caller reports ``NotCommitted``); anything after the first
byte may have left is the caller's "lost" (outcome unknown for a write);
a kept connection is checked before reuse and replaced if the server
closed it or sent bytes nobody asked for (a write into a dead connection
would make a clean answer an unknown outcome, and a stray answer must
never be read as the answer to a later request); a connection goes back
to the pool only once its answer was read to the end.
"""

from __future__ import annotations

import re
import select
import socket
from collections import deque
from typing import Any

from steadqd.errors import InvalidInput

__all__ = ["NeverSent", "PlainAnswer", "PlainPool"]

# A header value may not end its line early: a CR, LF or NUL in one would let it write headers of its own.
_ILLEGAL_VALUE = re.compile(r"[\r\n\0]")
_HAS_BODY = frozenset({"PUT", "POST"})


class NeverSent(Exception):
    """Opening a connection failed (refused, unresolvable, timed out): nothing of the request was sent."""


class _Connection:
    """One kept TCP connection and the poll object that tells whether the server closed it while idle."""

    __slots__ = ("poller", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def idle_and_open(self) -> bool:
        """True if nothing is waiting to be read: a closed connection reads as EOF, a reset as an error."""
        return not self.poller.poll(0)

    def close(self) -> None:
        self.sock.close()


class PlainAnswer:
    """One answer: its status and header fields now, its body read on demand; what ``_Body`` reads.

    The connection is released by :meth:`release_conn`: back to the pool
    when the body was read to its end and the server keeps the connection,
    otherwise closed (unread bytes would be taken for the next answer).
    """

    __slots__ = ("_conn", "_pool", "_response", "msg", "status")

    def __init__(self, pool: PlainPool, conn: _Connection, response: Any) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._response = response
        self.status: int = response.status
        self.msg = response.msg

    def read(self, amt: int | None = None) -> bytes:
        data: bytes = self._response.read() if amt is None else self._response.read(amt)
        return data

    @property
    def closed(self) -> bool:
        """True once the body was read to its end (or the answer was closed)."""
        return bool(self._response.isclosed())

    def close(self) -> None:
        """Give up on the rest of the body: the connection cannot carry another answer."""
        self._response.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def release_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._response.isclosed() and not self._response.will_close:
            self._pool.put(conn)
        else:
            self._response.close()  # its reader, if still open, first: the socket closes only after it
            conn.close()


class PlainPool:
    """Kept connections to one ``host:port``, most recently used first; thread-safe (deque operations are atomic).

    ``response_class`` is the ``http.client.HTTPResponse`` that reads an
    answer (the direct transport's ``_Response``). At most ``maxsize``
    connections are kept idle; more may be open at once, as urllib3's
    non-blocking pools allow, and are closed when released.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        maxsize: int,
        response_class: Any,
    ) -> None:
        self._address = (host, port)
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s
        self._maxsize = maxsize
        self._response_class = response_class
        self._idle: deque[_Connection] = deque()
        self._closed = False

    def request(self, method: str, target: str, headers: dict[str, str], body: bytes) -> PlainAnswer:
        """Send one request and read its answer's status and headers.

        Raises :class:`NeverSent` if no connection could be opened,
        :class:`~steadqd.errors.InvalidInput` (nothing sent) for a header
        value that would break its line, and the socket's ``OSError`` or
        ``http.client.HTTPException`` for anything after that, the
        connection then closed.
        """
        lines = [f"{method} {target} HTTP/1.1\r\nAccept-Encoding: identity\r\n"]
        for name, value in headers.items():
            if _ILLEGAL_VALUE.search(value) or _ILLEGAL_VALUE.search(name):
                raise InvalidInput(f"the {name[:40]!r} header's value holds a line break or NUL: not sent")
            lines.append(f"{name}: {value}\r\n")
        if method in _HAS_BODY:
            lines.append(f"Content-Length: {len(body)}\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        conn = self._connection()
        response = None
        try:
            if len(body) <= 65536:
                conn.sock.sendall(head + body)
            else:
                conn.sock.sendall(head)
                conn.sock.sendall(body)
            response = self._response_class(conn.sock, method=method)
            response.begin()
        except BaseException:
            if response is not None:
                response.close()  # its reader first: a socket with a reader open is closed only with it
            conn.close()
            raise
        return PlainAnswer(self, conn, response)

    def _connection(self) -> _Connection:
        """A kept connection still open and quiet, or a new one (:class:`NeverSent` if it cannot be opened)."""
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                break
            if conn.idle_and_open():
                return conn
            conn.close()  # closed by the server while idle (or it sent bytes nobody asked for)
        try:
            sock = socket.create_connection(self._address, timeout=self._connect_timeout)
        except OSError as exc:
            raise NeverSent(str(exc)) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self._read_timeout)
        except OSError as exc:
            sock.close()
            raise NeverSent(str(exc)) from exc
        return _Connection(sock)

    def put(self, conn: _Connection) -> None:
        """A connection whose answer was read to the end: kept for the next request, or closed."""
        if self._closed or len(self._idle) >= self._maxsize:
            conn.close()
        else:
            self._idle.append(conn)

    def close(self) -> None:
        """Close every idle connection; one in use is closed when released."""
        self._closed = True
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return
