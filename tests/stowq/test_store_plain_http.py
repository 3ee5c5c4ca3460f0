"""The direct transport's plain-HTTP pool (steadqd.s3.store.plain_http): kept connections, and when one is not kept.

Each case runs :class:`PlainPool` against a server on 127.0.0.1 that
speaks raw bytes, so that it can do what a well-behaved ``http.server``
never does: send an answer nobody asked for, stop mid-body, frame a body
by closing. The client-level outcome split (refused: nothing sent; reset:
outcome unknown) is tested through ``S3Store`` in test_store_s3_http.py and
test_store_s3_direct.py, which run over this pool.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from steadqd.errors import InvalidInput
from steadqd.s3.store.plain_http import NeverSent, PlainAnswer, PlainPool
from steadqd.s3.store.s3_direct import _Response

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
TAKEN = b"HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n"


def _read_request(conn: socket.socket) -> bytes:
    """One request's head (the tests send no bodies), or b"" when the client closed."""
    data = b""
    for _ in range(1000):  # bounded: a request head is a few hundred bytes
        if b"\r\n\r\n" in data:
            return data
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    raise AssertionError("no request head")


@contextlib.contextmanager
def serving(script: Callable[[int, socket.socket], None]) -> Iterator[tuple[int, list[int]]]:
    """A server running ``script(n, connection)`` for its n-th connection; yields its port and the connections."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    accepted: list[int] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(len(accepted))
            conn.settimeout(5)

            def run(n: int = len(accepted) - 1, conn: socket.socket = conn) -> None:
                with conn, contextlib.suppress(OSError):
                    script(n, conn)

            threading.Thread(target=run, daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _pool(port: int) -> PlainPool:
    return PlainPool("127.0.0.1", port, connect_timeout_s=2, read_timeout_s=2, maxsize=4, response_class=_Response)


def _whole(answer: PlainAnswer) -> tuple[int, bytes]:
    data = answer.read()
    answer.release_conn()
    return answer.status, data


def _answering(*answers: bytes) -> Callable[[int, socket.socket], None]:
    """Each connection answers its requests with ``answers`` in turn, then keeps reading until the client closes."""

    def script(_: int, conn: socket.socket) -> None:
        for answer in answers:
            if not _read_request(conn):
                return
            conn.sendall(answer)
        _read_request(conn)

    return script


def test_a_connection_whose_answer_was_read_is_kept_for_the_next_request() -> None:
    with serving(_answering(OK, OK, OK)) as (port, accepted):
        pool = _pool(port)
        assert [_whole(pool.request("GET", "/b/k", {"Host": "h"}, b"")) for _ in range(3)] == [(200, b"ok")] * 3
        assert len(accepted) == 1
        pool.close()


def test_an_answer_nobody_asked_for_is_never_read_as_the_next_one() -> None:
    """A stray 200 left on an idle connection would answer a later put-if-absent: the connection is replaced."""
    send_stray = threading.Event()

    def script(n: int, conn: socket.socket) -> None:
        if n == 0:
            _read_request(conn)
            conn.sendall(OK)
            assert send_stray.wait(5)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")  # nobody asked
            _read_request(conn)
            return
        _answering(TAKEN)(n, conn)

    with serving(script) as (port, accepted):
        pool = _pool(port)
        assert _whole(pool.request("GET", "/b/k", {"Host": "h"}, b"")) == (200, b"ok")
        send_stray.set()
        assert pool._idle[0].poller.poll(5000)  # the stray bytes reached the kept connection
        assert _whole(pool.request("PUT", "/b/k", {"Host": "h", "If-None-Match": "*"}, b"x")) == (412, b"")
        assert len(accepted) == 2
        pool.close()


def test_an_answer_left_unread_closes_its_connection() -> None:
    long = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"
    with serving(_answering(long, OK)) as (port, accepted):
        pool = _pool(port)
        answer = pool.request("GET", "/b/k", {"Host": "h"}, b"")
        assert answer.read(3) == b"012"
        assert not answer.closed
        answer.close()
        answer.release_conn()
        assert _whole(pool.request("GET", "/b/k", {"Host": "h"}, b"")) == (200, b"0123456789")
        assert len(accepted) == 2  # the half-read connection was not reused
        pool.close()


def test_a_body_framed_by_closing_is_read_to_the_end_and_its_connection_not_kept() -> None:
    def script(_: int, conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        conn.shutdown(socket.SHUT_WR)

    with serving(script) as (port, accepted):
        pool = _pool(port)
        assert _whole(pool.request("GET", "/b/k", {"Host": "h"}, b"")) == (200, b"all of it")
        assert _whole(pool.request("GET", "/b/k", {"Host": "h"}, b"")) == (200, b"all of it")
        assert len(accepted) == 2
        pool.close()


def test_a_chunked_body_is_joined_and_its_connection_kept() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n<Lis\r\n3;x=1\r\nt/>\r\n0\r\n\r\n"
    with serving(_answering(chunked, OK)) as (port, accepted):
        pool = _pool(port)
        assert _whole(pool.request("GET", "/b/?list-type=2", {"Host": "h"}, b"")) == (200, b"<List/>")
        assert _whole(pool.request("HEAD", "/b/k", {"Host": "h"}, b"")) == (200, b"")
        assert len(accepted) == 1
        pool.close()


def test_the_request_head_carries_the_headers_and_a_body_its_length() -> None:
    heads: list[bytes] = []

    def script(_: int, conn: socket.socket) -> None:
        data = _read_request(conn)
        if not data.endswith(b"body"):
            data += conn.recv(100)  # the body, if it came in a packet of its own
        heads.append(data)
        conn.sendall(OK)
        _read_request(conn)

    with serving(script) as (port, _accepted):
        pool = _pool(port)
        _whole(pool.request("PUT", "/b/a%20key", {"Host": "h:1", "Authorization": "AWS4 x"}, b"body"))
        pool.close()
    head, _, body = heads[0].partition(b"\r\n\r\n")
    assert body == b"body"
    lines = head.decode().split("\r\n")
    assert lines[0] == "PUT /b/a%20key HTTP/1.1"
    assert {"Host: h:1", "Authorization: AWS4 x", "Content-Length: 4", "Accept-Encoding: identity"} <= set(lines)


@pytest.mark.parametrize("name, value", [("X-Amz-Meta", "a\r\nInjected: 1"), ("If-Match", "x\n"), ("X\r\nY", "1")])
def test_a_header_that_would_break_its_line_is_refused_and_nothing_sent(name: str, value: str) -> None:
    with serving(_answering(OK)) as (port, accepted):
        pool = _pool(port)
        with pytest.raises(InvalidInput, match="line break"):
            pool.request("GET", "/b/k", {"Host": "h", name: value}, b"")
        assert accepted == []
        pool.close()


def test_a_connection_that_cannot_be_opened_is_never_sent() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(NeverSent) as refused:
            _pool(port).request("PUT", "/b/k", {"Host": "h"}, b"x")
    assert isinstance(refused.value.__cause__, ConnectionRefusedError)


def test_an_answer_that_never_comes_times_out_and_closes_the_connection() -> None:
    def script(_: int, conn: socket.socket) -> None:
        _read_request(conn)
        _read_request(conn)  # says nothing until the client gives up

    with serving(script) as (port, accepted):
        pool = PlainPool(
            "127.0.0.1", port, connect_timeout_s=2, read_timeout_s=0.2, maxsize=4, response_class=_Response
        )
        with pytest.raises(TimeoutError):
            pool.request("GET", "/b/k", {"Host": "h"}, b"")
        assert len(pool._idle) == 0
        pool.close()


def test_threads_opening_the_first_connection_at_once_share_one_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both first requests made their own pool; the one not kept would hold its connection past close()."""
    import urllib3

    from steadqd.s3.store import s3_direct

    both = threading.Barrier(2, timeout=5)
    parse_url = urllib3.util.parse_url

    def in_step(url: str) -> object:
        both.wait()  # each thread has found no pool yet
        return parse_url(url)

    monkeypatch.setattr(s3_direct.urllib3.util, "parse_url", in_step)
    with serving(_answering(OK, OK)) as (port, accepted):
        client = s3_direct.DirectClient(
            endpoint_url=f"http://127.0.0.1:{port}",
            region="us-east-1",
            credentials=None,
            addressing_style="path",
            connect_timeout_s=2,
            read_timeout_s=2,
        )
        answers: list[tuple[int, bytes]] = []

        def one() -> None:
            answers.append(_whole(client._plain_request("GET", f"http://127.0.0.1:{port}/b/k", b"", {"Host": "h"})))

        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert answers == [(200, b"ok")] * 2
        (pool,) = client._plain_pools.values()
        # Every connection opened is kept by the one pool close() closes. Usually two; one when a thread ended
        # its request before the other took a connection (CI once saw that): the second then reused it.
        assert len(accepted) in (1, 2) and len(pool._idle) == len(accepted)
        client.close()
        assert len(pool._idle) == 0


def test_an_answer_that_does_not_parse_closes_its_connection_at_once() -> None:
    """The socket is closed with the exception, not when the traceback holding its reader is dropped."""
    closed = threading.Event()

    def script(_: int, conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nnot a header\r\nContent-Length: 0\r\n\r\n")
        if conn.recv(1) == b"":
            closed.set()

    with serving(script) as (port, _accepted):
        pool = _pool(port)
        with pytest.raises(http.client.HTTPException) as refused:
            pool.request("PUT", "/b/k", {"Host": "h"}, b"x")
        assert closed.wait(5), refused.value  # the exception (and its traceback) still held here
        pool.close()
