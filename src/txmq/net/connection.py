"""One remoting connection over asyncio: framing, opaque matching, oneway, timeouts, pipelining and backpressure.

The same :class:`Connection` serves server-accepted and client-dialled sockets, because a broker also sends requests
(CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED) to a client over the client's own connection. The read loop
never waits for a handler: each request's response is written when its handler finishes, in whatever order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from txmq.clock import SYSTEM_CLOCK, Clock, TimerHandle
from txmq.errors import ConnectError, ConnectionClosedError, FrameError, RequestTimeoutError, is_disk_full
from txmq.net.pending import Pending
from txmq.protocol.frame import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, RemotingCommand, encode_frame_parts, next_opaque

log = logging.getLogger("txmq.net")

RequestHandler: TypeAlias = Callable[
    ["Connection", RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand | None] | None"
]
"""Serves one inbound request. Return the response, None (no response), a :class:`~txmq.net.pending.Pending` of
either, or an awaitable of either."""

CloseCallback: TypeAlias = Callable[["Connection"], Any]

DEFAULT_MAX_IN_FLIGHT = 4096
DEFAULT_WRITE_BUFFER_HIGH = 1 << 20

_SYSTEM_ERROR = 1
_REQUEST_CODE_NOT_SUPPORTED = 3


def _address(info: Any) -> tuple[str, int]:
    if isinstance(info, tuple) and len(info) >= 2:
        host = str(info[0])
        # A dual-stack listener reports IPv4 peers as ::ffff:a.b.c.d; clients, ACL whitelists and stored
        # born-host fields all want the plain IPv4 form.
        if host.startswith("::ffff:") and "." in host:
            host = host[7:]
        return host, int(info[1])
    return (str(info) if info else "", 0)


EARLY_FLUSH_BYTES = 8 * 1024  # see Connection._write
# A deadline this close counts as come: libuv's timers (uvloop) fire on whole milliseconds, sometimes just before it.
_DEADLINE_SLACK = 0.001


class Connection(asyncio.Protocol):
    """A remoting connection. Create it through :meth:`Server.start` or :func:`connect`, not directly.

    ``attributes`` is free per-connection state for the layers above (client id, ACL identity, ...).
    """

    def __init__(
        self,
        handler: RequestHandler | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        write_buffer_high: int = DEFAULT_WRITE_BUFFER_HIGH,
        pause_reading_on_write_backpressure: bool = True,
        on_open: Callable[[Connection], Any] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.peer: tuple[str, int] = ("", 0)
        self.local: tuple[str, int] = ("", 0)
        self.attributes: dict[str, Any] = {}
        self._handler = handler
        self._clock = clock
        self._decoder = FrameDecoder(max_frame_size=max_frame_size)
        self._max_in_flight = max_in_flight
        # Resume a little below the cap so that a saturated connection does not flip the socket's read interest
        # on every single completion.
        self._resume_in_flight = max_in_flight - max_in_flight // 4 - 1 if max_in_flight > 1 else 0
        self._write_buffer_high = write_buffer_high
        # A server stops reading requests while its responses pile up unread. A client must not do the same:
        # if both ends stopped reading because their own writes were stuck, neither would ever drain (deadlock).
        # A client gets write backpressure in request() instead.
        self._pause_on_write = pause_reading_on_write_backpressure
        self._on_open = on_open
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        # Each outbound request's deadline, swept by one timer armed for the earliest (a timer per request cost
        # more than the rest of a client's send: see _expire_due).
        self._deadlines: dict[int, tuple[float, int, float]] = {}  # opaque -> (deadline, request code, timeout)
        self._sweep: TimerHandle | None = None
        self._sweep_at = math.inf
        self._tasks: set[asyncio.Future[Any]] = set()
        self._answers_due = 0  # handlers' Pending responses not settled yet (in flight, as the tasks are)
        self._backlog: deque[RemotingCommand] = deque()
        self._wbuf: list[bytes] = []
        self._wbuf_size = 0
        self._flush_scheduled = False
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._reading_paused = False
        self._closed = False
        self._close_reason: str | None = None
        self._close_callbacks: list[CloseCallback] = []
        self._lost: asyncio.Future[None] | None = None

    # -- public API ----------------------------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this connection runs on (None before it is made)."""
        return self._loop

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_reason(self) -> str | None:
        return self._close_reason

    @property
    def in_flight(self) -> int:
        """Inbound requests whose (asynchronous) handlers have not finished yet."""
        return len(self._tasks) + self._answers_due

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    @property
    def pending_requests(self) -> int:
        """Outbound requests waiting for their response."""
        return len(self._pending)

    def write_buffer_size(self) -> int:
        """Bytes accepted for sending that the kernel has not taken yet."""
        size = self._wbuf_size
        if self._transport is not None:
            size += self._transport.get_write_buffer_size()
        return size

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``cmd`` as a two-way request and wait for its response.

        A fresh opaque is assigned to ``cmd`` (and the response/oneway bits cleared). Raises
        :class:`RequestTimeoutError` when no response arrives within ``timeout`` seconds of the connection's clock,
        and :class:`ConnectionClosedError` when the connection is or becomes closed first. The response may carry
        any response code; interpreting it is the caller's business.
        """
        if self._closed:
            raise self._closed_error()
        while self._write_paused:  # re-check after waking: an earlier waiter may have filled the buffer again
            await self._wait_writable()
        loop = self._loop
        assert loop is not None
        pending = self._pending
        opaque = next_opaque()
        while opaque in pending:  # only after 2**31 requests with one still outstanding; cheap insurance
            opaque = next_opaque()
        cmd.opaque = opaque
        cmd.flag &= ~3
        future: asyncio.Future[RemotingCommand] = loop.create_future()
        pending[opaque] = future
        deadlines = self._deadlines
        deadline = self._clock.monotonic() + timeout
        deadlines[opaque] = (deadline, cmd.code, timeout)
        if deadline < self._sweep_at:
            self._arm_sweep(deadline)
        try:
            self._send(cmd)
            return await future
        finally:
            deadlines.pop(opaque, None)
            if pending.get(opaque) is future:
                del pending[opaque]

    def send_oneway(self, cmd: RemotingCommand) -> None:
        """Send ``cmd`` as a oneway request (flag bit 2, fresh opaque). Raises ConnectionClosedError if closed.

        Raising matters to callers such as the transaction checker, which only counts a check that went out.
        """
        if self._closed:
            raise self._closed_error()
        cmd.opaque = next_opaque()
        cmd.flag = (cmd.flag | 2) & ~1
        self._send(cmd)

    def send_response(self, cmd: RemotingCommand) -> None:
        """Write a response built with :meth:`RemotingCommand.response`. Does nothing if the connection is closed."""
        if not self._closed:
            self._send(cmd)

    def close(self, reason: str | None = None) -> None:
        """Close after writing what is already queued. Pending requests fail with ConnectionClosedError."""
        if self._closed:
            return
        self._mark_closed(reason or "closed locally")
        transport = self._transport
        if transport is not None:
            self._flush()
            transport.close()

    def abort(self, reason: str | None = None) -> None:
        """Close at once, dropping anything not yet written."""
        self._mark_closed(reason or "aborted locally")
        self._wbuf = []
        self._wbuf_size = 0
        if self._transport is not None:
            self._transport.abort()

    def add_close_callback(self, callback: CloseCallback) -> None:
        """Call ``callback(connection)`` once when the connection closes (at once if it already has)."""
        if self._closed:
            self._run_close_callback(callback)
        else:
            self._close_callbacks.append(callback)

    async def wait_closed(self) -> None:
        """Wait until the socket is gone (not just until close() was called)."""
        if self._lost is not None:
            await asyncio.shield(self._lost)

    def __repr__(self) -> str:
        state = f"closed ({self._close_reason})" if self._closed else "open"
        return f"<Connection {self.local[0]}:{self.local[1]} <-> {self.peer[0]}:{self.peer[1]} {state}>"

    # -- asyncio.Protocol ----------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not inherit from asyncio.Transport, so no isinstance check here.
        self._transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        self._lost = self._loop.create_future()
        self.peer = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        transport.set_write_buffer_limits(high=self._write_buffer_high)  # type: ignore[attr-defined]
        log.debug("connection open %s:%d <-> %s:%d", *self.local, *self.peer)
        if self._on_open is not None:
            self._on_open(self)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            commands = self._decoder.feed(data)
        except FrameError as exc:
            log.warning("closing connection from %s:%d: malformed frame: %s", *self.peer, exc)
            self.close(f"malformed frame: {exc}")
            return
        pending = self._pending
        backlog = self._backlog
        for cmd in commands:
            if cmd.flag & 1:
                future = pending.pop(cmd.opaque, None)
                if future is None or future.done():
                    # Late (after a timeout) or never asked for; the C++ client also drops such responses.
                    log.debug(
                        "dropping response code %d with unknown opaque %d from %s:%d", cmd.code, cmd.opaque, *self.peer
                    )
                else:
                    future.set_result(cmd)
            elif self._closed:
                break  # a handler closed the connection; serve nothing more that arrived with it
            elif (
                backlog
                or len(self._tasks) + self._answers_due >= self._max_in_flight
                or (self._write_paused and self._pause_on_write)
            ):
                # Hold requests back: too many handlers running, or the peer is not reading its responses. At
                # most one read's worth of frames waits here, because reading is paused right after.
                backlog.append(cmd)
            else:
                self._dispatch(cmd)
        if backlog or self._reading_paused:
            self._update_reading()

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost does the bookkeeping

    def connection_lost(self, exc: Exception | None) -> None:
        if self._decoder.buffered and not self._decoder.failed:
            log.info(
                "connection from %s:%d closed in the middle of a frame (%d bytes buffered)",
                *self.peer,
                self._decoder.buffered,
            )
        if not self._closed:
            self._mark_closed("connection closed by peer" if exc is None else f"connection lost: {exc}")
        self._wbuf = []
        self._wbuf_size = 0
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        log.debug("connection closed %s:%d <-> %s:%d: %s", *self.local, *self.peer, self._close_reason)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._pause_on_write:
            self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writers(None)
        if self._pause_on_write:
            self._drain_backlog()

    # -- inbound requests ----------------------------------------------------------------------------------------

    def _dispatch(self, cmd: RemotingCommand) -> None:
        handler = self._handler
        try:
            if handler is None:
                result: Any = cmd.response(_REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
            else:
                result = handler(self, cmd)
        except Exception as exc:
            self._handler_failed(cmd, exc)
            return
        if result is None:
            return
        if isinstance(result, RemotingCommand):
            self._respond(cmd, result)
            return
        if type(result) is Pending:
            # Answered from the callback that settles it: no future, no scheduled callback, no extra loop turn.
            self._answers_due += 1
            result.then(functools.partial(self._answered, cmd))
            if len(self._tasks) + self._answers_due >= self._max_in_flight:
                self._update_reading()
            return
        if isinstance(result, asyncio.Future):
            # What ensure_future would return for it, without its three interpreted calls (a long poll's answer is a
            # future).
            task: asyncio.Future[Any] = result
        else:
            try:
                task = asyncio.ensure_future(result)
            except TypeError:
                self._handler_failed(
                    cmd,
                    TypeError(f"handler returned {type(result).__name__}, not a RemotingCommand, None or awaitable"),
                )
                return
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._handler_done, cmd))
        if len(self._tasks) + self._answers_due >= self._max_in_flight:
            self._update_reading()

    def _answered(self, cmd: RemotingCommand, response: Any, error: BaseException | None) -> None:
        """A handler's :class:`Pending` is settled: respond as for a finished future."""
        self._answers_due -= 1
        self._finish(cmd, response, error, "pending answer was")

    def _handler_done(self, cmd: RemotingCommand, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            if self._closed:
                return
            self._finish(cmd, None, RuntimeError("request processing was cancelled"), "")
        elif (exc := task.exception()) is not None:
            self._finish(cmd, None, exc, "")
        else:
            self._finish(cmd, task.result(), None, "awaitable returned")

    def _finish(self, cmd: RemotingCommand, response: Any, error: BaseException | None, what: str) -> None:
        """Answer a request whose handler finished later: its response, or SYSTEM_ERROR for a failure or a result
        that is not a response (``what`` names it); then serve what was held back."""
        if error is not None:
            self._handler_failed(cmd, error)
        elif isinstance(response, RemotingCommand):
            self._respond(cmd, response)
        elif response is not None:
            self._handler_failed(cmd, TypeError(f"handler's {what} {type(response).__name__}, not a RemotingCommand"))
        if not self._closed:
            self._drain_backlog()

    def _drain_backlog(self) -> None:
        backlog = self._backlog
        while (
            backlog
            and not self._closed
            and len(self._tasks) + self._answers_due < self._max_in_flight
            and not (self._write_paused and self._pause_on_write)
        ):
            self._dispatch(backlog.popleft())
        if self._reading_paused or backlog:
            self._update_reading()

    def _handler_failed(self, cmd: RemotingCommand, exc: BaseException) -> None:
        if is_disk_full(exc):  # expected while the disk is full: said to the client plainly, no traceback
            log.warning("request code %d from %s:%d refused, the disk is full: %s", cmd.code, *self.peer, exc)
            self._respond(cmd, cmd.response(_SYSTEM_ERROR, f"the broker's disk is full: {exc}"))
            return
        log.error(
            "handler failed on request code %d (opaque %d) from %s:%d", cmd.code, cmd.opaque, *self.peer, exc_info=exc
        )
        self._respond(cmd, cmd.response(_SYSTEM_ERROR, str(exc) or type(exc).__name__))

    def _respond(self, request: RemotingCommand, response: RemotingCommand) -> None:
        if request.flag & 2 or self._closed:
            return  # never answer a oneway request, whatever the handler returned
        # Matching is by opaque, and C++ clients read only JSON: stamp both from the request (wire §1.2, §1.5).
        response.opaque = request.opaque
        response.flag |= 1
        response.serialize_type = request.serialize_type
        try:
            head, body = encode_frame_parts(response)
        except ValueError as exc:
            log.error("cannot encode the response to request code %d from %s:%d: %s", request.code, *self.peer, exc)
            head, body = encode_frame_parts(request.response(_SYSTEM_ERROR, f"response could not be encoded: {exc}"))
        self._write(head, body)

    # -- writing -------------------------------------------------------------------------------------------------

    def _send(self, cmd: RemotingCommand) -> None:
        head, body = encode_frame_parts(cmd)
        self._write(head, body)

    def _write(self, head: bytes, body: bytes) -> None:
        # Coalesce: what is written during one event-loop turn goes out in few transport writes, at the latest on
        # the next turn, and as soon as EARLY_FLUSH_BYTES have gathered. Without that early flush a burst (128
        # responses completed by one group commit, or 128 requests sent by as many resumed tasks) left in one
        # write after the whole burst was processed, and the two ends took turns: each waited while the other
        # worked through the burst. Flushing every few KiB lets the peer start on the first frames at once.
        wbuf = self._wbuf
        wbuf.append(head)
        if body:
            wbuf.append(body)
        self._wbuf_size += len(head) + len(body)
        if self._wbuf_size >= EARLY_FLUSH_BYTES or self._wbuf_size >= self._write_buffer_high:
            # This also hands big bursts to the transport now, so that its high-water mark (and pause_writing)
            # sees them while we are still dispatching the rest of this read.
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        wbuf = self._wbuf
        if not wbuf:
            return
        self._wbuf = []
        self._wbuf_size = 0
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if len(wbuf) == 1:
            transport.write(wbuf[0])
        else:
            transport.writelines(wbuf)

    async def _wait_writable(self) -> None:
        assert self._loop is not None
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def _wake_writers(self, exc: BaseException | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    # -- state ---------------------------------------------------------------------------------------------------

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self._closed:
            return
        in_flight = len(self._tasks) + self._answers_due
        if self._reading_paused:
            pause = (
                bool(self._backlog)
                or in_flight > self._resume_in_flight
                or (self._pause_on_write and self._write_paused)
            )
        else:
            pause = (
                bool(self._backlog) or in_flight >= self._max_in_flight or (self._pause_on_write and self._write_paused)
            )
        if pause == self._reading_paused:
            return
        self._reading_paused = pause
        if pause:
            log.debug(
                "pausing reads from %s:%d (in flight %d, backlog %d, write buffer %d)",
                *self.peer,
                in_flight,
                len(self._backlog),
                transport.get_write_buffer_size(),
            )
            transport.pause_reading()
        else:
            transport.resume_reading()

    def _arm_sweep(self, at: float) -> None:
        sweep = self._sweep
        if sweep is not None:
            sweep.cancel()
        self._sweep_at = at
        self._sweep = self._clock.call_later(at - self._clock.monotonic(), self._expire_due)

    def _expire_due(self) -> None:
        """Fail the requests whose deadline has come with :class:`RequestTimeoutError`, and arm the sweep for the
        earliest deadline left. Requests usually come with the same timeout, so the sweep runs about once per
        timeout and looks at the requests in flight; a request costs two dict operations instead of a timer."""
        self._sweep = None
        self._sweep_at = math.inf
        now = self._clock.monotonic() + _DEADLINE_SLACK
        pending = self._pending
        deadlines = self._deadlines
        earliest = math.inf
        for opaque, (deadline, code, timeout) in list(deadlines.items()):
            if deadline <= now:
                del deadlines[opaque]
                future = pending.get(opaque)
                if future is not None and not future.done():
                    future.set_exception(
                        RequestTimeoutError(
                            f"no response from {self.peer[0]}:{self.peer[1]} to request code {code} "
                            f"(opaque {opaque}) within {timeout:g}s"
                        )
                    )
            elif deadline < earliest:
                earliest = deadline
        if earliest < math.inf and not self._closed:
            self._arm_sweep(earliest)

    def _closed_error(self) -> ConnectionClosedError:
        return ConnectionClosedError(f"connection to {self.peer[0]}:{self.peer[1]} is closed: {self._close_reason}")

    def _mark_closed(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        self._backlog.clear()
        pending, self._pending = self._pending, {}
        self._deadlines = {}
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
            self._sweep_at = math.inf
        for opaque, future in pending.items():
            if not future.done():
                future.set_exception(
                    ConnectionClosedError(
                        f"connection to {self.peer[0]}:{self.peer[1]} closed before the response to opaque "
                        f"{opaque} arrived: {reason}"
                    )
                )
        self._wake_writers(self._closed_error())
        # Handlers still running are left to finish (they may be half-way through a store append); their
        # responses are dropped.
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            self._run_close_callback(callback)

    def _run_close_callback(self, callback: CloseCallback) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("close callback %r of connection %r failed", callback, self)


async def connect(
    host: str,
    port: int,
    handler: RequestHandler | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    timeout: float | None = 3.0,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    write_buffer_high: int = DEFAULT_WRITE_BUFFER_HIGH,
) -> Connection:
    """Dial ``host:port``. ``handler`` serves requests the server sends on this connection (e.g. transaction checks).

    Raises :class:`ConnectError` when the connection is refused, unreachable, or not made within ``timeout``
    seconds of ``clock``.
    """
    loop = asyncio.get_running_loop()

    def factory() -> Connection:
        return Connection(
            handler,
            clock=clock,
            max_frame_size=max_frame_size,
            max_in_flight=max_in_flight,
            write_buffer_high=write_buffer_high,
            pause_reading_on_write_backpressure=False,
        )

    task = asyncio.ensure_future(loop.create_connection(factory, host, port))
    timed_out = False

    def expire() -> None:
        nonlocal timed_out
        timed_out = True
        task.cancel()

    timer = clock.call_later(timeout, expire) if timeout is not None else None
    try:
        _, connection = await task
    except asyncio.CancelledError:
        if timed_out:
            raise ConnectError(f"connecting to {host}:{port} timed out after {timeout:g}s") from None
        raise
    except OSError as exc:
        raise ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
    finally:
        if timer is not None:
            timer.cancel()
    return connection
