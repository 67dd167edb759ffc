"""Listening side of txmq.net: :class:`Server` accepts connections and serves them with one request handler."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.net.connection import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_WRITE_BUFFER_HIGH,
    Connection,
    RequestHandler,
)
from txmq.protocol.frame import DEFAULT_MAX_FRAME_SIZE

log = logging.getLogger("txmq.net")


class Server:
    """A listening socket plus the connections it accepted. Start it with :meth:`Server.start`."""

    def __init__(
        self,
        handler: RequestHandler,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        write_buffer_high: int = DEFAULT_WRITE_BUFFER_HIGH,
    ) -> None:
        self.handler = handler
        self.clock = clock
        self.connections: set[Connection] = set()
        self._max_frame_size = max_frame_size
        self._max_in_flight = max_in_flight
        self._write_buffer_high = write_buffer_high
        self._server: asyncio.base_events.Server | None = None

    @classmethod
    async def start(
        cls,
        host: str | None,
        port: int,
        handler: RequestHandler,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        write_buffer_high: int = DEFAULT_WRITE_BUFFER_HIGH,
        backlog: int = 1024,
        serving: bool = True,
    ) -> Server:
        """Listen on ``host:port`` (port 0 picks a free port; host None or "" listens on every interface). With
        ``serving=False`` the port is bound but no connection is accepted until :meth:`begin_serving`."""
        self = cls(
            handler,
            clock=clock,
            max_frame_size=max_frame_size,
            max_in_flight=max_in_flight,
            write_buffer_high=write_buffer_high,
        )
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._new_connection, host or None, port, backlog=backlog, reuse_address=True, start_serving=serving
        )
        log.info("listening on %s", ", ".join(f"{h}:{p}" for h, p in self.addresses))
        return self

    async def begin_serving(self) -> None:
        """Accept connections (a server started with ``serving=False``)."""
        if self._server is not None and not self._server.is_serving():
            await self._server.start_serving()

    @property
    def addresses(self) -> list[tuple[str, int]]:
        if self._server is None:
            return []
        return [(str(s.getsockname()[0]), int(s.getsockname()[1])) for s in self._server.sockets]

    @property
    def port(self) -> int:
        """The listening port (the first socket's, when several interfaces are bound)."""
        addresses = self.addresses
        if not addresses:
            raise RuntimeError("server is not listening")
        return addresses[0][1]

    def _new_connection(self) -> Connection:
        connection = Connection(
            self.handler,
            clock=self.clock,
            max_frame_size=self._max_frame_size,
            max_in_flight=self._max_in_flight,
            write_buffer_high=self._write_buffer_high,
            pause_reading_on_write_backpressure=True,
            on_open=self._opened,
        )
        return connection

    def _opened(self, connection: Connection) -> None:
        self.connections.add(connection)
        connection.add_close_callback(self.connections.discard)

    async def close(self, grace: float = 1.0) -> None:
        """Stop listening, close every connection, and wait (up to ``grace`` seconds) for queued writes to go out.

        Connections that have not finished by then (a peer that does not read) are aborted. The grace period uses
        the event loop's real time, not the injected clock, so that shutting down never depends on a fake clock.
        """
        if self._server is not None:
            self._server.close()
        connections = list(self.connections)
        for connection in connections:
            connection.close("server shutting down")
        waits = {asyncio.ensure_future(c.wait_closed()): c for c in connections}
        if waits:
            _, not_done = await asyncio.wait(waits, timeout=grace)
            for waiter in not_done:
                waits[waiter].abort("server shutting down; peer did not take its data")
            if not_done:
                await asyncio.wait(not_done, timeout=grace)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
