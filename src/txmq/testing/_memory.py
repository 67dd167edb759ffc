"""Two :class:`txmq.net.Connection` ends joined in memory: no sockets, the same framing, flow control and close."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.net.connection import Connection, RequestHandler

_ports = itertools.count(1)


class MemoryTransport(asyncio.Transport):
    """One end of an in-memory byte pipe. Bytes written here reach the peer's protocol on a later loop turn.

    Bytes the peer has not taken (its reading is paused) count as this end's write buffer, so a reader that stops
    reading makes the writer's protocol see ``pause_writing`` at the high-water mark, as over a socket.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, name: tuple[str, int]) -> None:
        super().__init__()
        self._loop = loop
        self._name = name
        self._protocol: asyncio.Protocol | None = None
        self._peer: MemoryTransport | None = None
        self._inbox: list[bytes] = []  # arrived from the peer, not yet handed to our protocol
        self._inbox_size = 0
        self._paused = False
        self._closing = False
        self._lost = False
        self._eof_pending = False
        self._delivery_scheduled = False
        self._high = 64 * 1024
        self._low = 16 * 1024
        self._writing_paused = False

    def _attach(self, protocol: asyncio.Protocol, peer: MemoryTransport) -> None:
        self._protocol = protocol
        self._peer = peer

    # -- asyncio.BaseTransport --------------------------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sockname":
            return self._name
        if name == "peername":
            return self._peer._name if self._peer is not None else default
        return default

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        peer = self._peer
        if peer is not None:
            peer._eof_pending = True
            peer._schedule_delivery()
        self._loop.call_soon(self._connection_lost, None)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    # -- asyncio.ReadTransport --------------------------------------------------------------------------------------

    def is_reading(self) -> bool:
        return not self._paused and not self._closing

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            self._schedule_delivery()

    # -- asyncio.WriteTransport -------------------------------------------------------------------------------------

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = 64 * 1024 if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        peer = self._peer
        return peer._inbox_size if peer is not None and not peer._lost else 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        peer = self._peer
        if peer is None or peer._lost:
            return
        peer._inbox.append(bytes(data))
        peer._inbox_size += len(data)
        peer._schedule_delivery()
        if not self._writing_paused and self.get_write_buffer_size() > self._high:
            self._writing_paused = True
            assert self._protocol is not None
            self._protocol.pause_writing()

    def write_eof(self) -> None:
        self.close()

    def can_write_eof(self) -> bool:
        return False

    def abort(self) -> None:
        peer = self._peer
        if peer is not None:
            peer._inbox.clear()
            peer._inbox_size = 0
        self.close()

    # -- delivery ---------------------------------------------------------------------------------------------------

    def _schedule_delivery(self) -> None:
        if not self._delivery_scheduled and not self._lost:
            self._delivery_scheduled = True
            self._loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        self._delivery_scheduled = False
        if self._lost or self._protocol is None:
            return
        while self._inbox and not self._paused and not self._closing:
            data = self._inbox.pop(0)
            self._inbox_size -= len(data)
            self._protocol.data_received(data)
        if self._peer is not None:
            self._peer._maybe_resume_writing()
        if self._eof_pending and not self._inbox:
            self._eof_pending = False
            self._protocol.eof_received()
            self.close()

    def _maybe_resume_writing(self) -> None:
        if self._writing_paused and self.get_write_buffer_size() <= self._low and self._protocol is not None:
            self._writing_paused = False
            self._protocol.resume_writing()

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._inbox.clear()
        self._inbox_size = 0
        if self._protocol is not None:
            self._protocol.connection_lost(exc)


def memory_connection_pair(
    client_handler: RequestHandler | None = None,
    server_handler: RequestHandler | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    **options: Any,
) -> tuple[Connection, Connection]:
    """A connected ``(client, server)`` pair of :class:`Connection` over memory; call it in the event loop.

    ``client_handler`` serves requests the server end sends (as :func:`txmq.net.connect`'s handler does),
    ``server_handler`` the client's requests. ``options`` go to both Connections (``max_frame_size``,
    ``max_in_flight``, ``write_buffer_high``). The server end pauses reading while its responses pile up unread,
    like a :class:`txmq.net.Server` connection; the client end does not.
    """
    loop = asyncio.get_running_loop()
    port = next(_ports)
    client = Connection(client_handler, clock=clock, pause_reading_on_write_backpressure=False, **options)
    server = Connection(server_handler, clock=clock, **options)
    client_end = MemoryTransport(loop, ("memory", 2 * port))
    server_end = MemoryTransport(loop, ("memory", 2 * port + 1))
    client_end._attach(client, server_end)
    server_end._attach(server, client_end)
    server.connection_made(server_end)
    client.connection_made(client_end)
    return client, server
