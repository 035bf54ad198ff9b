"""Misbehaving clients cannot lock others out: connection slots, header and write deadlines, closes that answer.

uvicorn reads a request's headers for as long as the client takes, accepts connections without limit (its
`limit_concurrency` answers 503 only once the headers are in), writes a response for as long as the client takes to
read it, and its `transport.close()` drops what the client sent after it, so a client still sending gets a TCP reset
instead of the answer. `bounded_protocol(...)` is uvicorn's own HTTP protocol (httptools where installed, else h11)
with, as nginx and TEI do:
  - slots: at most `max_connections` open connections, at most `per_client` of them from one IP address. A
    connection waiting for a request's headers (a new one, or a kept-alive one between requests) holds its slot
    only until a newcomer needs it: when the cap is reached, the oldest waiting connection is closed to make room
    (503), those that never sent the API key before those that did (the key is checked as soon as the headers
    are in). Connections inside a request are never closed so; when every slot is inside a request the newcomer
    gets 503. So idle or header-trickling connections, however many, cannot keep a client with complete
    requests out;
  - a header deadline: a request whose headers are not complete `header_timeout_s` after the connection opened (or
    after the previous response, on a kept-alive connection) gets 408 and the connection is closed;
  - a write deadline: a connection whose client takes none of the response for `write_timeout_s` (it sent a
    request and does not read) is closed, so it holds neither a slot nor a graceful shutdown;
  - lingering closes: the server's side is shut down first and what the client still sends is read and dropped
    for up to `LINGER_S`, so a 503, 408, 413 or 401 reaches a client that is still sending as an HTTP response.
The body's deadline is the app's (`server.app.Around`). Idle kept-alive connections close after uvicorn's
`timeout_keep_alive`.
"""
from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

LINGER_S = 2.0  # how long a closing connection reads (and drops) what its client still sends


def _raw_response(status: int, reason: str, message: str, kind: str) -> bytes:
    body = json.dumps({"error": message, "type": kind, "field": None}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


class _Transport:
    """The transport uvicorn's protocol writes to, whose `close()` is the protocol's lingering close (a proxy: a
    uvloop transport takes no new attributes)."""

    def __init__(self, transport: asyncio.Transport, close: Any) -> None:
        self._transport, self.close = transport, close

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Slots:
    """The open connections of one server: those waiting for headers (oldest first, keyless before keyed), and
    how many each address holds."""

    def __init__(self, max_connections: int, per_client: int) -> None:
        self.max, self.per_client = max_connections, min(per_client, max_connections)
        self.holders: set[Any] = set()
        self.waiting: tuple[dict, dict] = ({}, {})  # (keyless, keyed): insertion-ordered, oldest first
        self.by_address: dict[Any, int] = {}

    def admit(self, conn: Any) -> bool:
        """Give `conn` a slot, closing the oldest waiting connection if the server or its address is full."""
        address = conn.client[0] if conn.client else None
        if self.by_address.get(address, 0) >= self.per_client and not self._evict(address):
            return False
        if len(self.holders) >= self.max and not self._evict(None):
            return False
        self.holders.add(conn)
        self.by_address[address] = self.by_address.get(address, 0) + 1
        conn.address = address
        return True

    def _evict(self, address: Any) -> bool:
        """Close the oldest connection waiting for headers (from `address`, unless None); False if there is none."""
        victim = next((c for group in self.waiting for c in group if address is None or c.address == address), None)
        if victim is not None:
            victim.evict()
        return victim is not None

    def wait(self, conn: Any) -> None:
        if conn in self.holders:
            self.waiting[conn.keyed][conn] = None

    def busy(self, conn: Any) -> None:
        for group in self.waiting:
            group.pop(conn, None)

    def release(self, conn: Any) -> None:
        if conn in self.holders:
            self.busy(conn)
            self.holders.discard(conn)
            left = self.by_address[conn.address] - 1
            if left:
                self.by_address[conn.address] = left
            else:
                del self.by_address[conn.address]


def bounded_protocol(header_timeout_s: float, max_connections: int, per_client: int | None = None,
                     write_timeout_s: float = 30.0, api_key: str | None = None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with slots, deadlines and lingering closes (see the module docstring)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    slots = _Slots(max_connections, per_client or max_connections)
    key = f"Bearer {api_key}".encode() if api_key else None
    too_many = _raw_response(503, "Service Unavailable", f"over {max_connections} open connections (or "
                             f"{slots.per_client} from one address): retry later", "overloaded")
    too_slow = _raw_response(408, "Request Timeout", f"the request's headers took over {header_timeout_s:g} s",
                             "timeout")

    class BoundedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _timer: asyncio.TimerHandle | None = None
        _waiting_since: Any = None  # the request cycle before the one whose headers we wait for
        _write_timer: asyncio.TimerHandle | None = None
        _unsent = 0  # bytes the transport held when the write deadline was set
        _closing = False
        _eof = False
        _quick = False
        _started = False  # bytes of the request whose headers we wait for have come
        keyed = False  # a request on this connection carried the API key (or none is needed)
        address: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._raw = transport
            super().connection_made(_Transport(transport, self._linger))  # type: ignore[arg-type]
            self.keyed = key is None
            if not slots.admit(self):
                transport.write(too_many)
                self._linger()
                return
            self._wait_for_headers()

        def data_received(self, data: bytes) -> None:
            if self._closing:  # lingering: the client's rest is dropped
                return
            self._started = True
            super().data_received(data)
            self._headers_arrived()

        def eof_received(self) -> Any:
            self._eof = True
            return super().eof_received()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self._raw.is_closing() and not self._closing:
                self._wait_for_headers()
                self._headers_arrived()  # a pipelined request may be parsed already

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            self._cancel_write()
            slots.release(self)
            super().connection_lost(exc)

        def shutdown(self) -> None:
            self._quick = True  # the server stops: an idle connection is closed at once, not lingered over
            if self._closing:
                self._raw.close()
                return
            super().shutdown()

        # ---- the header deadline --------------------------------------------------------------------------------
        def _wait_for_headers(self) -> None:
            self._cancel()
            self._waiting_since = self.cycle
            self._started = False
            slots.wait(self)
            self._timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _headers_arrived(self) -> None:
            if self._timer is not None and self.cycle is not self._waiting_since:  # a new request's cycle began
                self._cancel()
                if key is not None and not self.keyed:
                    given = dict(self.headers or ()).get(b"authorization", b"")
                    self.keyed = hmac.compare_digest(given, key)
                slots.busy(self)

        def _cancel(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _headers_too_slow(self) -> None:
            self._timer = None
            if self.cycle is self._waiting_since and not self._closing:
                self._raw.write(too_slow)
                self._linger()

        def evict(self) -> None:
            """Make room for a newcomer: this connection waits for headers. An idle kept-alive one is closed
            plainly, as its keep-alive timeout would (a 503 might be read as the answer to its next request); one
            that is new or in the middle of its headers gets 503."""
            self._cancel()
            if self.cycle is None or self._started:
                self._raw.write(too_many)
            self._linger()

        # ---- the write deadline ---------------------------------------------------------------------------------
        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_timer is None:
                self._unsent = self._raw.get_write_buffer_size()
                self._write_timer = self.loop.call_later(write_timeout_s, self._write_check)

        def resume_writing(self) -> None:
            self._cancel_write()
            super().resume_writing()

        def _write_check(self) -> None:
            self._write_timer = None
            unsent = self._raw.get_write_buffer_size()
            if unsent and unsent >= self._unsent:  # the client took nothing for write_timeout_s: give up on it
                self._raw.abort()
            elif unsent:  # it reads, slowly: measure the next stretch
                self._unsent = unsent
                self._write_timer = self.loop.call_later(write_timeout_s, self._write_check)

        def _cancel_write(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        # ---- lingering close ------------------------------------------------------------------------------------
        def _linger(self) -> None:
            """Close as `transport.close()` would, but let the answer reach a client that is still sending: send
            what is buffered, shut our side, read and drop the client's rest until it closes or LINGER_S passes."""
            slots.release(self)
            if self._closing or self._raw.is_closing():
                return
            self._closing = True
            self._cancel()
            if self._eof or self._quick or not self._raw.can_write_eof():
                self._raw.close()
                return
            self._raw.resume_reading()
            self._raw.write_eof()
            self.loop.call_later(LINGER_S, self._linger_end)

        def _linger_end(self) -> None:
            if not self._raw.is_closing() or self._raw.get_write_buffer_size():
                self._raw.abort()  # the client neither closed nor took the answer within LINGER_S

    return BoundedProtocol
