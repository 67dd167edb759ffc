"""A slave's side: the link to the master's HA port (a :class:`~txmq.ha.session.SlaveSession` per connection,
reconnecting every few seconds), and the periodic copy of the master's metadata through its admin requests, as
RocketMQ's slaves do (topics, subscription groups, consumer offsets, delay offsets)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from txmq.broker.config import BrokerConfig
from txmq.broker.offsets import ConsumerOffsetManager
from txmq.broker.subscriptions import SubscriptionGroupManager
from txmq.broker.topics import TopicConfigManager
from txmq.clock import Clock
from txmq.errors import RemotingError, StoreError
from txmq.ha.session import Apply, Effect, Fail, SendReport, SlaveSession, SlaveState, coalesce
from txmq.ha.wire import (
    Accept,
    Data,
    HaProtocolError,
    MasterFrameDecoder,
    Refuse,
    encode_hello,
    encode_report,
)
from txmq.net import Connection, connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.store.message_store import MessageStore
from txmq.util import atomic_write_json

log = logging.getLogger("txmq.broker.ha")

RECONNECT_SECONDS = 1.0


class HaSlave:
    """Keeps this slave's commit log a byte-for-byte copy of its master's."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        clock: Clock,
        store: MessageStore,
        topics: TopicConfigManager,
        subscriptions: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        delay_offsets_path: Path,
        master_addrs: Callable[[], tuple[str, str]],
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.topics = topics
        self.subscriptions = subscriptions
        self.offsets = offsets
        self.delay_offsets_path = delay_offsets_path  # the delay service does not run on a slave: its file is copied
        # (master broker address, master HA address) as configured or learnt from the name server; "" when unknown
        self._master_addrs = master_addrs
        self._tasks: list[asyncio.Task[Any]] = []
        self.session: SlaveSession | None = None
        self.last_error = ""
        self._admin: Connection | None = None
        self._admin_addr = ""
        self._sync_soon: asyncio.Event | None = None

    def _on_new_messages(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        # A replicated record of a topic this slave does not know yet: copy the master's metadata now, not at the
        # next period, so that consumers can read it from here if the master goes away.
        if topic not in self.topics.topics and self._sync_soon is not None:
            self._sync_soon.set()

    def start(self) -> None:
        self._sync_soon = asyncio.Event()
        self.store.on_new_messages(self._on_new_messages)
        self._tasks = [
            asyncio.create_task(self._replicate_loop(), name="ha-slave"),
            asyncio.create_task(self._metadata_loop(), name="ha-slave-sync"),
        ]

    async def stop_link(self) -> None:
        """Stop copying the commit log (a candidate's epoch starts at its log's end); metadata copies go on."""
        task = self._tasks[0] if self._tasks else None
        if task is not None:
            await _cancel_and_wait(task)

    async def restart_link(self) -> None:
        """Drop the link to the master (if any) and connect to whichever master ``master_addrs`` names now."""
        await self.stop_link()
        if self._tasks:
            self._tasks[0] = asyncio.create_task(self._replicate_loop(), name="ha-slave")

    async def close(self) -> None:
        for task in self._tasks:
            await _cancel_and_wait(task)
        if self._admin is not None:
            self._admin.close("slave shutting down")

    def status(self) -> dict[str, Any]:
        s = self.session
        return {
            "masterHaAddr": self._master_addrs()[1],
            "state": s.state.value if s is not None else "disconnected",
            "durableOffset": self.store.flushed_physical_offset(),
            "masterMaxOffset": s.master_max if s is not None else -1,
            "lastError": self.last_error,
        }

    # -- the commit log

    async def _replicate_loop(self) -> None:
        while True:
            ha_addr = self._master_addrs()[1]
            if ha_addr:
                try:
                    await self._replicate(ha_addr)
                except (ConnectionError, OSError, TimeoutError) as exc:
                    self._note(f"HA: link to master {ha_addr} lost: {exc}", logging.INFO)
            await self.clock.sleep(RECONNECT_SECONDS)

    def _note(self, message: str, level: int = logging.WARNING) -> None:
        if message != self.last_error:
            log.log(level, "%s", message)
        self.last_error = message

    async def _replicate(self, ha_addr: str) -> None:
        """One connection to the master: connected here, on the loop (so that a cancel stops the connect), then
        driven to its end by a :class:`_Link` thread. Cancelled, it stops the thread and waits for it: whoever
        cancels (a candidate taking over at its log's end) knows that nothing more is appended."""
        host, _, port = ha_addr.rpartition(":")
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(5.0):  # not wait_for: in 3.11 it loses a cancel that lands as the connect succeeds
            infos = await loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            family, kind, proto, _, addr = infos[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, addr)
            except BaseException:
                sock.close()
                raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(self, ha_addr, sock, loop)
        link.start()
        try:
            await asyncio.shield(link.done)
        finally:
            if not link.done.done():
                link.stop()
                link.join()  # at most the append under way: one write and its fsync

    # -- metadata

    async def _metadata_loop(self) -> None:
        while True:
            if self._master_addrs()[0]:
                try:
                    await self.sync_metadata()
                except (RemotingError, OSError, ValueError) as exc:
                    self._note(f"HA: copying metadata from the master failed: {exc}", logging.INFO)
                except Exception:
                    log.exception("HA: copying metadata from the master failed")
            if self._sync_soon is not None:
                soon = self._sync_soon
                soon.clear()
                timer = self.clock.call_later(self.config.slave_sync_interval / 1000, soon.set)
                try:
                    await soon.wait()
                finally:
                    timer.cancel()
            else:
                await self.clock.sleep(self.config.slave_sync_interval / 1000)

    async def _ask(self, code: int) -> Any:
        addr = self._master_addrs()[0]
        conn = self._admin
        if conn is None or conn.closed or self._admin_addr != addr:
            if conn is not None:
                conn.close("master changed")
            host, _, port = addr.rpartition(":")
            conn = self._admin = await connect(host, int(port), clock=self.clock)
            self._admin_addr = addr
        resp = await conn.request(RemotingCommand.request(code, {}), timeout=5.0)
        if resp.code != ResponseCode.SUCCESS:
            raise RemotingError(f"master answered {resp.code} to request {code}: {resp.remark}")
        return orjson.loads(resp.body) if resp.body else {}

    async def sync_metadata(self) -> None:
        """Copy the master's topics, subscription groups and consumer offsets (RocketMQ's slaveSynchronize)."""
        topics = await self._ask(RequestCode.GET_ALL_TOPIC_CONFIG)
        if self.topics.follow(topics):
            log.info("HA: copied the master's topics (%d)", len(self.topics.topics))
        groups = await self._ask(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        self.subscriptions.follow(groups.get("subscriptionGroupTable") or {})
        offsets = await self._ask(RequestCode.GET_ALL_CONSUMER_OFFSET)
        self.offsets.follow(offsets.get("offsetTable") or {})
        delay = await self._ask(RequestCode.GET_ALL_DELAY_OFFSET)
        if isinstance(delay, dict) and isinstance(delay.get("offsetTable"), dict):
            await asyncio.to_thread(atomic_write_json, self.delay_offsets_path, delay)


async def _cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` until it has ended. A cancellation can be lost: Python 3.11's ``asyncio.wait_for`` returns
    the result of an inner await that completes as the cancel lands (fixed in 3.12), and other code may swallow one
    too. Awaiting the task after a single cancel() would then wait for ever, and with it the caller, the
    controller's loop on its way to follow a new master or to campaign. Seen in CI (session 13): a slave whose
    replication task had just connected when the controller restarted its link never campaigned after that
    master was killed."""
    rounds = 0
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        rounds += 1
    if rounds > 1:
        log.warning("HA: task %s took %d cancellations to stop", task.get_name(), rounds)
    if not task.cancelled():
        task.exception()  # retrieved: its failure was logged where it happened


class _Link(threading.Thread):
    """One connection to the master's HA port, driven by a thread of its own over a blocking socket: it reads the
    master's frames, appends and fsyncs their bytes (holding the store's append lock, as its writer thread does) and
    reports the new durable end, without the event loop. Through the loop, each shipment cost the loop's wake-up, a
    hand-over to the store's writer thread and one back before its report could go out, and a SYNC_MASTER send
    waits for that report."""

    def __init__(self, slave: HaSlave, ha_addr: str, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name=f"ha-slave-link-{ha_addr}", daemon=True)
        self.slave = slave
        self.ha_addr = ha_addr
        self.sock = sock
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()  # settled on the loop once the thread has ended
        self.stopping = False
        self.session: SlaveSession | None = None
        self._after_apply: list[Effect] = []  # what the session asked for after the last apply, beyond its report
        self._send_error: OSError | None = None  # a report that could not be sent from _durable

    def _durable(self, end: int) -> None:
        """The store's call as soon as applied bytes are durable (before their dispatch): report them now. Must not
        raise into the store: a failed send is kept and raised once the append is complete."""
        effects = self.session.applied(end)  # type: ignore[union-attr]
        self._after_apply = []
        for effect in effects:
            if isinstance(effect, SendReport) and self._send_error is None:
                try:
                    self._report(effect.offset)
                except OSError as exc:
                    self._send_error = exc
            else:
                self._after_apply.append(effect)

    def _report(self, offset: int) -> None:
        self.sock.sendall(encode_report(offset))
        slave = self.slave
        if slave.last_error and self.session is not None and self.session.master_max >= 0:
            log.info("HA: replicating from master %s at offset %d", self.ha_addr, offset)
            slave.last_error = ""

    def stop(self) -> None:
        """From the loop: end the link; a blocked read returns at once."""
        self.stopping = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def run(self) -> None:
        error: BaseException | None = None
        try:
            self._replicate()
        except BaseException as exc:
            error = exc
        finally:
            self.sock.close()
            try:
                self.loop.call_soon_threadsafe(self._settle, error)
            except RuntimeError:  # the loop is closed: nobody waits
                pass

    def _settle(self, error: BaseException | None) -> None:
        if self.done.done():
            return
        if error is None or self.stopping:  # stopped on purpose: a failed last report is nobody's concern
            self.done.set_result(None)
        else:
            self.done.set_exception(error)

    def _replicate(self) -> None:
        slave, sock, ha_addr = self.slave, self.sock, self.ha_addr
        store, config, clock = slave.store, slave.config, slave.clock
        session = slave.session = self.session = SlaveSession(store.flushed_physical_offset())
        decoder = MasterFrameDecoder()
        segment_size = store.config.mapped_file_size_commit_log
        silence = config.ha_housekeeping_interval / 1000
        sock.settimeout(config.ha_send_heartbeat_interval / 1000)
        try:
            sock.sendall(encode_hello(config.broker_name, segment_size, replica_addr=config.broker_addr))
            last_report = clock.monotonic()
            while session.state is not SlaveState.CLOSED:
                try:
                    data: bytes | None = sock.recv(1 << 20)
                except TimeoutError:
                    data = None
                if self.stopping:
                    return
                if data is not None:
                    if not data:
                        slave._note(f"HA: master {ha_addr} closed the link", logging.INFO)
                        return
                    try:
                        frames = decoder.feed(data)
                    except HaProtocolError as exc:
                        slave._note(f"HA: master {ha_addr} sent garbage: {exc}")
                        return
                else:
                    frames = []
                    if clock.monotonic() - last_report > silence:
                        slave._note(f"HA: master {ha_addr} silent for {silence:.0f} s; reconnecting")
                        return
                read: list[Effect] = []  # the effects of everything read at once, carried out in order
                for frame in frames:
                    if isinstance(frame, Accept):
                        read += session.accept(frame)
                    elif isinstance(frame, Refuse):
                        read += session.refuse(frame)
                    elif isinstance(frame, Data):
                        read += session.data(frame)
                        last_report = clock.monotonic()
                    if session.state is SlaveState.CLOSED:
                        break
                if read:
                    effects = coalesce(read, segment_size)
                    while effects:
                        effect = effects.pop(0)
                        if isinstance(effect, Apply):
                            try:
                                store.append_replicated(effect.offset, effect.data, self._durable)
                            except StoreError as exc:
                                slave._note(f"HA: the master's bytes at {effect.offset} cannot be applied: {exc}")
                                return
                            if self._send_error is not None:
                                raise self._send_error
                            effects[:0] = self._after_apply  # before anything else read with the bytes
                        elif isinstance(effect, SendReport):
                            self._report(effect.offset)
                        elif isinstance(effect, Fail):
                            slave._note(f"HA: {effect.reason}", logging.ERROR)
                            return
                if session.state is SlaveState.REPLICATING and data is None:
                    sock.sendall(encode_report(session.durable))  # heartbeat: still here, still at this offset
        finally:
            if session.state is not SlaveState.CLOSED:
                session.close("link closed")
