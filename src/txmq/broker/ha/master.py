"""A master's HA port: one :class:`~txmq.ha.session.MasterSession` per slave connection, fed by a reader task and
shipped to as the log grows: by the store's writer thread right after each append is written, by the loop when the
writer thread cannot (the connection has bytes buffered), by a shipper task per connection when its buffer is full;
and the waits of SYNC_MASTER sends for their bytes to be durable on a slave (:mod:`txmq.ha.waits`)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from typing import Any

from txmq.broker.config import BrokerConfig
from txmq.clock import Clock
from txmq.errors import StoreError
from txmq.ha.session import Acked, Fail, MasterSession, SendAccept, SendRefuse
from txmq.ha.waits import ReplicaWait, ReplicaWaits, Settle
from txmq.ha.wire import (
    HaProtocolError,
    Hello,
    Report,
    SlaveFrameDecoder,
    encode_accept,
    encode_data_header,
    encode_refuse,
)
from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.ha")

__all__ = ["HaMaster", "ReplicaWait"]

_SHIP_POLL_SECONDS = 0.02  # the shipper task looks again this often even when nothing woke it
_DIRECT_BUFFER_BYTES = 4 << 20  # the loop ships directly while a slave's connection buffers less than this


class _Link:
    """One slave's connection. ``lock`` guards its session and every write to it: the loop writes through the
    transport, the store's writer thread straight to a duplicate of the socket (``fd``), and only while the
    transport has nothing buffered, so their bytes never interleave. What the writer thread could not write waits
    in ``pending`` for the loop, which writes it before anything else."""

    __slots__ = ("closed", "fd", "lock", "peer", "pending", "replica", "session", "wake", "writer")

    def __init__(self, session: MasterSession, writer: asyncio.StreamWriter, peer: str) -> None:
        self.session = session
        self.writer = writer
        self.peer = peer
        self.replica = ""  # the slave's broker address, from its greeting
        self.wake = asyncio.Event()  # ship now: the direct path could not, or the slave acknowledged more
        self.lock = threading.Lock()
        self.fd = -1  # the writer thread's duplicate of the socket, once the slave streams
        self.pending = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        """From the loop."""
        with self.lock:
            self.write_locked(data)

    def write_locked(self, data: bytes) -> None:
        if self.closed:
            return
        if self.pending:
            self.writer.write(self.pending)
            self.pending = b""
        if data:
            self.writer.write(data)

    def open_direct(self) -> None:
        """From the loop, once the slave streams: let the writer thread write to the socket too. A duplicate, so
        that the transport closing its descriptor (a reset) can never leave the writer thread writing to a reused
        number."""
        with self.lock:
            sock = self.writer.get_extra_info("socket")
            if self.fd < 0 and not self.closed and sock is not None:
                self.fd = os.dup(sock.fileno())  # shares the transport's O_NONBLOCK: a write never blocks

    def close(self) -> None:
        """From the loop."""
        with self.lock:
            self.closed = True
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
        self.writer.close()


class HaMaster:
    """Listens on ``haListenPort``, ships the commit log to slaves, tracks what they have durably."""

    def __init__(self, *, config: BrokerConfig, clock: Clock, store: MessageStore) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._link_list: tuple[_Link, ...] = ()  # the same, for the writer thread (replaced whole, never changed)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._acked = -1  # the highest offset any slave has durably
        self._waits = ReplicaWaits()  # the SYNC_MASTER sends waiting for a slave
        self._timer: Any = None  # the clock's handle for the earliest wait's deadline, while one is armed
        self._timer_at = 0.0  # that deadline
        self.refused = 0  # connections refused (bad greeting, impossible offset, garbage)
        # Controller mode: the slaves (broker addresses) of the in-sync set confirmed in etcd, plus the slaves
        # joining it (address -> the acknowledged end when they started joining). A send is acknowledged once every
        # one of them has it (RocketMQ 5's allAckInSyncStateSet); None (no controller): once any slave has it.
        self.required: frozenset[str] | None = None
        self.joining: dict[str, int] = {}
        self.fenced = ""  # why this master acknowledges nothing (controller mode, lease not renewed in time)
        # Controller mode: the monotonic time after which the lease may have expired; checked on every send, so a
        # master that wakes up late (SIGSTOP, a long pause) refuses before its controller task has even run.
        self.lease_deadline: float | None = None
        self.confirmed = -1  # the highest log end acknowledged to a producer

    async def start(self, host: str) -> None:
        config = self.config
        port = config.ha_listen_port
        explicit = port >= 0
        if not explicit:
            port = config.listen_port + 1 if config.listen_port < 65535 else 0
        try:
            self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)
        except OSError as exc:
            if explicit or exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            # listenPort + 1 is someone else's (a test cluster's neighbour): take any port; the name server tells
            # slaves which one.
            log.warning("HA port %d is in use; listening on a free port instead", port)
            self._server = await asyncio.start_server(self._serve, host, 0, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        # Ship each append as soon as it is written, not after the master's fsync: the slave writes and fsyncs
        # while the master does (RocketMQ ships from the written position too); a send is still answered only
        # once both have it durably. The writer thread ships it itself, before its fsync (no wake-up of the loop);
        # when it cannot, the loop does (_ship_now), without waking the shipper task.
        loop = asyncio.get_running_loop()

        def written(_end: int) -> None:  # on the writer thread, holding the append lock: must not raise
            links = self._link_list
            if not links:
                return
            try:
                shipped = all([self._ship_direct(link, True) for link in links])
            except Exception:
                log.exception("HA: shipping from the writer thread failed; the loop ships instead")
                shipped = False
            if not shipped:
                try:
                    loop.call_soon_threadsafe(self._ship_now)
                except RuntimeError:  # the loop is closed
                    pass

        self.store.on_written(written)

    def _ship_now(self) -> None:
        """On the loop: ship to every streaming slave what the writer thread could not. A link this cannot serve
        either (its connection's buffer is full, a read failed) wakes its shipper task, which waits for the buffer
        to drain."""
        for link in self._links:
            if not self._ship_direct(link, False):
                link.wake.set()

    def _ship_direct(self, link: _Link, from_writer: bool) -> bool:
        """Ship what ``link``'s session asks for, up to the written end: from the writer thread straight to the
        socket while the transport has nothing buffered, from the loop while its buffer has room. True when
        everything written is shipped (or the session is not streaming yet: its task starts it)."""
        session = link.session
        with link.lock:
            if link.closed or not session.in_sync:
                return True
            transport = link.writer.transport
            if from_writer:
                if link.fd < 0 or link.pending or transport.get_write_buffer_size():
                    return False
            elif transport.is_closing():
                return False
            else:
                link.write_locked(b"")  # what the writer thread left
            store = self.store
            written = store.written_physical_offset()
            while from_writer or transport.get_write_buffer_size() < _DIRECT_BUFFER_BYTES:
                chunk = session.next_chunk(written)
                if chunk is None:
                    return True
                start, end = chunk
                try:
                    data = store.read_replica_chunk(start, end)
                except StoreError:
                    return False  # the task reads it again, and drops the link with the reason
                if not data:
                    return False
                frame = encode_data_header(start, len(data)) + data  # one segment: the slave reads it at once
                if not from_writer:
                    session.shipped(start, start + len(data))
                    transport.write(frame)
                    continue
                try:
                    n = os.write(link.fd, frame)
                except BlockingIOError:
                    n = 0
                except OSError:
                    return False  # the loop's write meets the same error, and the link ends
                session.shipped(start, start + len(data))
                if n < len(frame):
                    link.pending = frame[n:]
                    return False
            return False

    @property
    def ha_addr(self) -> str:
        return f"{self.config.advertised_ip}:{self.port}"

    async def close(self) -> None:
        self.store.on_written(None)
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()
        for task in list(self._tasks):
            task.cancel()
        self._disarm()
        self._waits.settle_all(ReplicaWait.SLAVE_NOT_AVAILABLE)  # closing: nothing will confirm them now
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            except TimeoutError:
                pass

    # -- state for SYNC_MASTER and the admin view

    def slaves(self) -> list[dict[str, Any]]:
        end = self.store.max_physical_offset()
        out = []
        for link in self._links:
            s = link.session
            out.append(
                {
                    "addr": link.peer,
                    "replica": link.replica,
                    "state": s.state.value,
                    "ackedOffset": s.acked,
                    "shippedOffset": s.shipped_to,
                    "lagBytes": max(0, end - s.acked) if s.acked >= 0 else None,
                }
            )
        return out

    def _in_sync(self) -> bool:
        if self.required is not None:
            return True  # controller mode: an in-sync set of the master alone acknowledges alone
        end = self.store.max_physical_offset()
        gap = self.config.ha_max_gap_not_in_sync
        return any(link.session.in_sync and end - link.session.acked <= gap for link in self._links)

    def replicated_to(self) -> int:
        """The log end every slave that must have a send has durably (any slave's without a controller)."""
        if self.required is None:
            return max((link.session.acked for link in self._links if link.session.in_sync), default=-1)
        needed = self.required | self.joining.keys()
        if not needed:
            return self.store.max_physical_offset()
        acked = {link.replica: link.session.acked for link in self._links if link.session.in_sync}
        return min(acked.get(r, -1) for r in needed)

    def in_sync_replicas(self) -> frozenset[str]:
        """Controller mode: the slaves the in-sync set should list now. A connected slave that is not in it starts
        joining: from then on sends wait for it too, and once it has everything acknowledged before that, it is
        in sync. A member whose link is gone or too far behind drops out."""
        end = self.store.max_physical_offset()
        gap = self.config.ha_max_gap_not_in_sync
        streaming = {
            link.replica: link.session.acked
            for link in self._links
            if link.replica and link.session.in_sync and end - link.session.acked <= gap
        }
        for replica in list(self.joining):
            if replica not in streaming:
                del self.joining[replica]  # never published: nobody can elect it, so nothing waits for it
        required = self.required or frozenset()
        for replica in streaming:
            if replica not in required and replica not in self.joining:
                self.joining[replica] = self.confirmed
                log.info("HA: slave %s is joining the in-sync set (needs offset %d)", replica, self.confirmed)
        self._on_acked(-1)
        return frozenset(
            r for r, acked in streaming.items() if r in required or (r in self.joining and acked >= self.joining[r])
        )

    def set_required(self, replicas: frozenset[str] | None) -> None:
        """The in-sync set's slaves as etcd now confirms them."""
        self.required = replicas
        for replica in replicas or ():
            self.joining.pop(replica, None)
        self._on_acked(-1)

    def fence(self, reason: str) -> None:
        """Acknowledge nothing more: every waiting send and every later one gets FENCED."""
        self.fenced = reason
        self._disarm()
        self._waits.settle_all(ReplicaWait.FENCED)

    def unfence(self) -> None:
        self.fenced = ""

    def fence_reason(self) -> str:
        """Why this master must not acknowledge now ("" when it may)."""
        if self.fenced:
            return self.fenced
        if self.lease_deadline is not None and self.clock.monotonic() >= self.lease_deadline:
            return "its controller lease was not renewed in time"
        return ""

    async def wait_replicated(self, offset: int, timeout: float) -> ReplicaWait:
        """Wait until a slave has the commit log durably up to ``offset`` (a send's end)."""
        fut: asyncio.Future[ReplicaWait] = asyncio.get_running_loop().create_future()

        def settle(outcome: ReplicaWait) -> None:
            if not fut.done():
                fut.set_result(outcome)

        outcome = self.when_replicated(offset, timeout, settle)
        if outcome is not None:
            return outcome
        result = await fut
        if result is ReplicaWait.PUT_OK and self.fence_reason():
            return ReplicaWait.FENCED
        return result

    def when_replicated(self, offset: int, timeout: float, settle: Settle) -> ReplicaWait | None:
        """The outcome of waiting until a slave has the log durably up to ``offset`` when it is known now, else None
        and ``settle(outcome)`` later, once (no future, no timer per send: the SYNC_MASTER send path). A PUT_OK
        must still be checked against :meth:`fence_reason` when it is acted on."""
        if self.fence_reason():
            return ReplicaWait.FENCED
        if self.replicated_to() >= offset:
            if offset > self.confirmed:
                self.confirmed = offset
            return ReplicaWait.PUT_OK
        if not self._in_sync():
            return ReplicaWait.SLAVE_NOT_AVAILABLE
        deadline = self.clock.monotonic() + timeout
        self._waits.add(offset, deadline, settle)
        if self._timer is None or deadline < self._timer_at:  # the latter only when timeouts differ
            self._disarm()
            self._arm()
        return None  # shipped already, or about to be: every append is (on_written), and the shipper task polls

    def _arm(self) -> None:
        deadline = self._waits.next_deadline()
        if deadline is not None:
            self._timer_at = deadline
            self._timer = self.clock.call_later(max(0.0, deadline - self.clock.monotonic()), self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self._waits.expire(self.clock.monotonic())
        self._arm()

    def _on_acked(self, offset: int) -> None:
        self._acked = max(self._acked, offset)
        if self.fenced or not self._waits.pending:
            return
        # Counted before each send resumes: a slave that starts joining in between must have this offset before it
        # is called in sync.
        highest = self._waits.acked(self.replicated_to())
        if highest > self.confirmed:
            self.confirmed = highest

    # -- one slave connection

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_info = writer.get_extra_info("peername")
        peer = f"{peer_info[0]}:{peer_info[1]}" if peer_info else "?"
        config = self.config
        session = MasterSession(
            broker_name=config.broker_name,
            segment_size=self.store.config.mapped_file_size_commit_log,
            chunk_size=config.ha_transfer_batch_size,
            window=max(config.ha_transfer_batch_size * 8, 8 << 20),
        )
        link = _Link(session, writer, peer)
        self._links.add(link)
        self._link_list = tuple(self._links)
        shipper: asyncio.Task[Any] | None = None
        decoder = SlaveFrameDecoder()
        silence = config.ha_housekeeping_interval / 1000
        try:
            while True:
                try:
                    async with asyncio.timeout(silence):  # no task per read, unlike wait_for
                        data = await reader.read(65536)
                except TimeoutError:
                    self._drop(link, f"no report for {silence:.0f} s")
                    return
                if not data:
                    break
                try:
                    frames = decoder.feed(data)
                except HaProtocolError as exc:
                    self._refuse_garbage(link, str(exc))
                    return
                for frame in frames:
                    store = self.store
                    # Written, not only fsynced: a slave may have durably what this master has not fsynced yet.
                    lo, hi = store.min_physical_offset(), store.written_physical_offset()
                    with link.lock:  # the writer thread reads the session's shipping state
                        if isinstance(frame, Hello):
                            effects = session.hello(frame, min_offset=lo, max_offset=hi)
                        elif isinstance(frame, Report):
                            effects = session.report(frame, min_offset=lo, max_offset=hi)
                        else:  # pragma: no cover - the decoder yields only these
                            continue
                    for effect in effects:
                        if isinstance(effect, SendAccept):
                            link.write(encode_accept(effect.min_offset, effect.max_offset))
                            if isinstance(frame, Hello):
                                link.replica = frame.replica_addr
                            log.info("HA: slave %s of %s greeted", peer, frame.broker_name)
                        elif isinstance(effect, SendRefuse):
                            link.write(encode_refuse(effect.reason))
                        elif isinstance(effect, Acked):
                            self._on_acked(effect.offset)
                            if shipper is None:
                                log.info("HA: slave %s replicating from offset %d", peer, effect.offset)
                                link.open_direct()
                                shipper = self._spawn(self._ship(link), f"ha-ship-{peer}")
                            link.wake.set()
                        elif isinstance(effect, Fail):
                            self.refused += 1
                            log.warning("HA: refused %s: %s", peer, effect.reason)
                            await self._close_link(link)
                            return
        except (ConnectionError, OSError) as exc:
            log.info("HA: slave %s connection lost: %s", peer, exc)
        finally:
            with link.lock:
                if session.state.value != "closed":
                    session.close("connection closed")
            self._links.discard(link)
            self._link_list = tuple(self._links)
            if shipper is not None:
                shipper.cancel()
            link.close()
            log.info("HA: slave %s gone (%s)", peer, session.close_reason)

    def _refuse_garbage(self, link: _Link, why: str) -> None:
        self.refused += 1
        log.warning("HA: refused %s: %s", link.peer, why)
        with link.lock:
            link.session.close(why)
        try:
            link.write(encode_refuse(why))
        except (ConnectionError, RuntimeError):
            pass
        link.close()

    def _drop(self, link: _Link, why: str) -> None:
        log.warning("HA: dropping slave %s: %s", link.peer, why)
        with link.lock:
            link.session.close(why)
        link.close()

    @staticmethod
    async def _close_link(link: _Link) -> None:
        try:
            await asyncio.wait_for(link.writer.drain(), 1.0)
        except (TimeoutError, ConnectionError):
            pass
        link.close()

    async def _ship(self, link: _Link) -> None:
        """Ship what the session asks for, as the log grows, waiting for the connection's buffer to drain; a
        heartbeat frame when idle."""
        session, writer, store = link.session, link.writer, self.store
        heartbeat = self.config.ha_send_heartbeat_interval / 1000
        idle_since = self.clock.monotonic()
        failure = ""
        try:
            while session.in_sync:
                link.wake.clear()  # before looking: a wake-up from now on is not lost
                with link.lock:
                    link.write_locked(b"")  # what the writer thread left
                    chunk = session.next_chunk(store.written_physical_offset())
                    if chunk is not None:
                        start, end = chunk
                        try:
                            data = store.read_replica_chunk(start, end)
                        except StoreError as exc:
                            log.error("HA: cannot read the commit log at %d for %s: %s", start, link.peer, exc)
                            failure, data = str(exc), None
                        if data:
                            session.shipped(start, start + len(data))
                            link.write_locked(encode_data_header(start, len(data)) + data)
                if chunk is None:
                    try:
                        async with asyncio.timeout(_SHIP_POLL_SECONDS):
                            await link.wake.wait()
                    except TimeoutError:
                        pass
                    if self.clock.monotonic() - idle_since >= heartbeat:
                        with link.lock:
                            link.write_locked(encode_data_header(session.shipped_to, 0))
                        idle_since = self.clock.monotonic()
                    continue
                if data is None:
                    self._drop(link, failure)
                    return
                if not data:
                    await asyncio.sleep(_SHIP_POLL_SECONDS)
                    continue
                await writer.drain()
                idle_since = self.clock.monotonic()
        except (ConnectionError, OSError) as exc:
            log.info("HA: shipping to %s stopped: %s", link.peer, exc)
