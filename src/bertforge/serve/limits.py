"""Slow and idle clients cannot exhaust the server: a cap on open connections and a deadline for a request's headers.

uvicorn reads a request's headers for as long as the client takes, and accepts connections without limit (its
`limit_concurrency` answers 503 only once the headers are in). `bounded_protocol(read_timeout_s, max_connections)`
is uvicorn's own HTTP protocol (httptools where installed, else h11) with two additions, as nginx
(client_header_timeout, worker_connections) and TEI do:
  - a connection over `max_connections` gets 503 and is closed at once;
  - a request whose headers are not complete `read_timeout_s` after the connection opened (or after the previous
    response, on a kept-alive connection) gets 408 and the connection is closed.
The body's deadline is the app's (`serve.app.Around`): from the end of the headers, the body must be complete within
`read_timeout_s`, else 408. Idle kept-alive connections close after uvicorn's `timeout_keep_alive`.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any


def _raw_response(status: int, reason: str, message: str, kind: str) -> bytes:
    body = json.dumps({"error": message, "type": kind, "field": None}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def bounded_protocol(read_timeout_s: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with the connection cap and the header deadline (see the module docstring)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    too_many = _raw_response(503, "Service Unavailable", f"over {max_connections} open connections: retry later",
                             "overloaded")
    too_slow = _raw_response(408, "Request Timeout", f"the request's headers took over {read_timeout_s:g} s",
                             "timeout")

    class BoundedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _timer: asyncio.TimerHandle | None = None
        _waiting_since: Any = None  # the request cycle before the one whose headers we wait for

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(too_many)
                transport.close()
                return
            self._wait_for_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._headers_arrived()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._wait_for_headers()
                self._headers_arrived()  # a pipelined request may be parsed already

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            super().connection_lost(exc)

        def _wait_for_headers(self) -> None:
            self._cancel()
            self._waiting_since = self.cycle
            self._timer = self.loop.call_later(read_timeout_s, self._headers_too_slow)

        def _headers_arrived(self) -> None:
            if self._timer is not None and self.cycle is not self._waiting_since:  # a new request's cycle began
                self._cancel()

        def _cancel(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _headers_too_slow(self) -> None:
            self._timer = None
            if self.cycle is self._waiting_since and not self.transport.is_closing():
                self.transport.write(too_slow)
                self.transport.close()

    return BoundedProtocol
