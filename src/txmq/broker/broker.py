"""The broker: wires the store, the bookkeeping and the processors to the network, and runs its timers."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import zlib
from pathlib import Path
from typing import Any

import orjson

from txmq.broker.admin import AdminProcessor
from txmq.broker.clients import ClientRegistry
from txmq.broker.config import BrokerConfig
from txmq.broker.consumer_admin import ConsumerAdminProcessor, lock_lifetime_seconds
from txmq.broker.locks import QueueLockManager
from txmq.broker.longpoll import PullHoldService
from txmq.broker.offsets import ConsumerOffsetManager
from txmq.broker.pull import PullProcessor
from txmq.broker.refusal import answering_refusals
from txmq.broker.schedule import ScheduleService
from txmq.broker.send import SendProcessor
from txmq.broker.subscriptions import SubscriptionGroupManager
from txmq.broker.tools_admin import ToolsAdminProcessor
from txmq.broker.topics import TopicConfigManager
from txmq.broker.transactions import TransactionService
from txmq.broker.tx_admin import TransactionAdminProcessor
from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.errors import RemotingError
from txmq.net import Connection, Dispatcher, Server, connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import RegisterBrokerRequestHeader, UnregisterBrokerRequestHeader
from txmq.store.config import StoreConfig
from txmq.store.message_store import MessageStore, PutStatus

log = logging.getLogger("txmq.broker")

BROKER_VERSION_DESC = "V4_9_8"
BROKER_VERSION = 409
CLIENT_SCAN_SECONDS = 10.0
OFFSET_PERSIST_SECONDS = 5.0


class Broker:
    """One broker process's worth of state. ``await start()``, then ``await close()``."""

    def __init__(self, config: BrokerConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        root = Path(config.store_path_root_dir)
        self.root = root
        cfg_dir = root / "config"
        self.topics = TopicConfigManager(
            cfg_dir / "topics.json",
            cluster_name=config.broker_cluster_name,
            broker_name=config.broker_name,
            default_queue_nums=config.default_topic_queue_nums,
            auto_create=config.auto_create_topic_enable,
            cluster_topic=config.cluster_topic_enable,
            broker_topic=config.broker_topic_enable,
            clock=clock,
        )
        self.offsets = ConsumerOffsetManager(cfg_dir / "consumerOffset.json")
        self.subscriptions = SubscriptionGroupManager(
            cfg_dir / "subscriptionGroup.json", auto_create=config.auto_create_subscription_group
        )
        self.clients = ClientRegistry(expiry_seconds=config.client_channel_expired_seconds)
        self.locks = QueueLockManager(lock_lifetime_seconds(config))
        self.pull_holds = PullHoldService(clock)
        self.store_config = StoreConfig.from_properties(
            {**config.store_properties(), "messageDelayLevel": config.message_delay_level}
        )
        self.store: MessageStore | None = None  # type: ignore[assignment]
        self.transactions = TransactionService(self)
        self.schedule = ScheduleService(self)
        self.consumer_admin = ConsumerAdminProcessor(self)
        self.send_processor = SendProcessor(self)
        self.pull_processor = PullProcessor(self)
        self.admin = AdminProcessor(self)
        self.tools_admin = ToolsAdminProcessor(self)
        self.dispatcher = Dispatcher()
        self._register_codes()
        self.acl: Any = None
        if config.acl_enable:
            from txmq.acl.service import AclService

            self.acl = AclService.from_broker_config(config, clock=clock)
            self.acl.install(self.dispatcher)
        self.stats = BrokerStats()
        self.servers: list[Server] = []
        self._namesrv_conns: dict[str, Connection] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._register_soon: asyncio.TimerHandle | None = None
        self._register_lock = asyncio.Lock()
        self.store_host: tuple[str, int] = (config.advertised_ip, config.listen_port)
        self.started_at_ms = 0

    def _register_codes(self) -> None:
        def register(code: int, handler: Any) -> None:
            self.dispatcher.register(code, answering_refusals(handler))

        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
            register(code, self.send_processor.handle)
        register(RequestCode.PULL_MESSAGE, self.pull_processor.handle)
        register(RequestCode.LITE_PULL_MESSAGE, self.pull_processor.handle)
        for code, handler in self.admin.handlers().items():
            register(code, handler)
        register(RequestCode.END_TRANSACTION, self.transactions.end_transaction)
        for code, handler in TransactionAdminProcessor(self).handlers().items():
            register(code, handler)
        register(RequestCode.CONSUMER_SEND_MSG_BACK, self.schedule.send_back)
        for code, handler in self.consumer_admin.handlers().items():
            register(code, handler)
        for code, handler in self.tools_admin.handlers().items():
            register(code, handler)

    # -- lifecycle

    async def start(self, host: str = "0.0.0.0") -> None:
        self.store = MessageStore(self.store_config, clock=self.clock)
        await self.store.start()
        self.store.on_new_messages(self._on_new_messages)
        server = await Server.start(host, self.config.listen_port, self.dispatcher, clock=self.clock)
        self.servers.append(server)
        if self.config.listen_port == 0:
            self.config.listen_port = server.port
        self.store_host = (self.config.advertised_ip, self.config.listen_port)
        self.started_at_ms = self.clock.now_ms()
        self._tasks = [
            asyncio.create_task(self._register_loop(), name="broker-register"),
            asyncio.create_task(self._client_scan_loop(), name="broker-client-scan"),
            asyncio.create_task(self._offset_persist_loop(), name="broker-offsets"),
            asyncio.create_task(self._stats_sample_loop(), name="broker-stats"),
        ]
        for extra in (self.transactions, self.schedule, self.acl):
            starter = getattr(extra, "start", None)
            if starter is not None:
                await starter()
        log.info(
            "broker %s (%s) serving on %s, store %s, flush %s",
            self.config.broker_name,
            self.config.broker_cluster_name,
            self.config.broker_addr,
            self.store_config.store_path_root_dir,
            self.config.flush_disk_type,
        )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for extra in (self.transactions, self.schedule, self.acl):
            stopper = getattr(extra, "close", None)
            if stopper is not None:
                await stopper()
        await self._unregister_all()
        self.pull_holds.release_all()
        for server in self.servers:
            await server.close()
        for conn in self._namesrv_conns.values():
            conn.close("broker shutting down")
        self.offsets.persist(force=True)
        if self.store is not None:
            await self.store.close()

    # -- store events

    def _on_new_messages(self, topic: str, queue_id: int, max_offset: int) -> None:
        self.pull_holds.notify(topic, queue_id, max_offset)

    def put_status_code(self, result: Any) -> int:
        status = result.status
        if status is PutStatus.PUT_OK:
            return ResponseCode.SUCCESS
        if status is PutStatus.FLUSH_DISK_TIMEOUT:
            return ResponseCode.FLUSH_DISK_TIMEOUT
        if status in (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED):
            return ResponseCode.MESSAGE_ILLEGAL
        if status is PutStatus.SERVICE_NOT_AVAILABLE:
            return ResponseCode.SERVICE_NOT_AVAILABLE
        return ResponseCode.SYSTEM_ERROR

    # -- not yet built

    # -- clients

    def notify_consumer_ids_changed(self, group: str) -> None:
        cfg = self.subscriptions.groups.get(group)
        if cfg is not None and not cfg.notify_consumer_ids_changed_enable:
            return
        for conn in self.clients.consumer_connections(group):
            if not conn.closed:
                conn.send_oneway(
                    RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
                )

    def connection_closed(self, conn: Any) -> None:
        for group in self.clients.connection_closed(conn):
            self.notify_consumer_ids_changed(group)

    async def _client_scan_loop(self) -> None:
        while True:
            await self.clock.sleep(CLIENT_SCAN_SECONDS)
            changed, dead = self.clients.expire(self.clock.monotonic())
            for conn in dead:
                log.info(
                    "client channel %r expired (no heartbeat for %ds)", conn, self.config.client_channel_expired_seconds
                )
                conn.close("no heartbeat")
            for group in changed:
                self.notify_consumer_ids_changed(group)

    async def _stats_sample_loop(self) -> None:
        while True:
            self.tools_admin.sample()
            await self.clock.sleep(1.0)

    async def _offset_persist_loop(self) -> None:
        while True:
            await self.clock.sleep(OFFSET_PERSIST_SECONDS)
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.offsets.persist)
            except OSError as exc:
                log.error("persisting consumer offsets failed: %s", exc)

    # -- name servers

    def topic_changed(self) -> None:
        """Re-register soon (debounced), so that new topics get routes quickly."""
        if self._register_soon is None and self._tasks:
            loop = asyncio.get_running_loop()
            self._register_soon = loop.call_soon(lambda: asyncio.ensure_future(self._register_once()))

    async def register_now(self, timeout: float = 3.0) -> None:
        """Register with the name servers and wait until they answered (at most ``timeout`` s; past it the
        registration goes on in the background)."""
        if not self._tasks:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._register_once()), timeout)
        except TimeoutError:
            log.warning("registering with the name servers took over %.1fs; answering without waiting", timeout)

    async def _register_loop(self) -> None:
        while True:
            await self._register_once()
            await self.clock.sleep(self.config.register_name_server_period / 1000)

    def _register_request(self) -> RemotingCommand:
        body = orjson.dumps({"topicConfigSerializeWrapper": self.topics.wrapper(), "filterServerList": []})
        header = RegisterBrokerRequestHeader(
            brokerName=self.config.broker_name,
            brokerAddr=self.config.broker_addr,
            clusterName=self.config.broker_cluster_name,
            haServerAddr=f"{self.config.advertised_ip}:{self.config.listen_port + 1}",
            brokerId=self.config.broker_id,
            compressed=False,
            bodyCrc32=zlib.crc32(body) & 0x7FFFFFFF,
        )
        return RemotingCommand.request(RequestCode.REGISTER_BROKER, header.to_ext(), body)

    async def _namesrv(self, addr: str) -> Connection:
        conn = self._namesrv_conns.get(addr)
        if conn is None or conn.closed:
            host, _, port = addr.rpartition(":")
            conn = await connect(host, int(port), clock=self.clock)
            self._namesrv_conns[addr] = conn
        return conn

    async def _register_once(self) -> None:
        self._register_soon = None
        async with self._register_lock:
            for addr in self.config.namesrv_addrs:
                try:
                    conn = await self._namesrv(addr)
                    resp = await conn.request(self._register_request(), timeout=6.0)
                    if resp.code != ResponseCode.SUCCESS:
                        log.warning("name server %s refused the registration: %s", addr, resp.remark)
                except (RemotingError, OSError) as exc:
                    log.warning("registering with name server %s failed: %s", addr, exc)

    async def _unregister_all(self) -> None:
        header = UnregisterBrokerRequestHeader(
            brokerName=self.config.broker_name,
            brokerAddr=self.config.broker_addr,
            clusterName=self.config.broker_cluster_name,
            brokerId=self.config.broker_id,
        )
        for addr in self.config.namesrv_addrs:
            try:
                conn = await self._namesrv(addr)
                await conn.request(RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header.to_ext()), timeout=3.0)
            except (RemotingError, OSError) as exc:
                log.info("unregistering from name server %s failed: %s", addr, exc)

    # -- runtime info

    def runtime_info(self) -> dict[str, Any]:
        store = self.store
        stats = store.stats() if store is not None else {}
        info: dict[str, Any] = {
            "brokerVersionDesc": BROKER_VERSION_DESC,
            "brokerVersion": BROKER_VERSION,
            "bootTimestamp": self.started_at_ms,
            "runtime": _runtime_text(self.clock.now_ms() - self.started_at_ms),
            "startAcceptSendRequestTimeStamp": self.started_at_ms,
            "msgPutTotalTodayNow": stats.get("put_messages", 0),
            "msgGetTotalTodayNow": self.stats.get_messages,
            "commitLogMinOffset": store.min_physical_offset() if store else 0,
            "commitLogMaxOffset": store.max_physical_offset() if store else 0,
            "putMessageTimesTotal": stats.get("put_messages", 0),
            "putMessageSizeTotal": stats.get("put_bytes", 0),
            "dispatchBehindBytes": 0,
            "pullHeldRequests": self.pull_holds.held_count(),
            "flushDiskType": self.config.flush_disk_type,
            "txmqPid": os.getpid(),
        }
        info.update(self.tools_admin.runtime_info())
        for key, value in stats.items():
            info.setdefault(f"store.{key}", value)
        counters = getattr(self.transactions, "counter_values", None)
        if counters is not None:
            info.update({f"tx.{key}": value for key, value in counters().items()})
        return info


class BrokerStats:
    def __init__(self) -> None:
        self.get_messages = 0
        self.get_found = 0
        self.get_miss = 0
        self.since = time.monotonic()

    def count_get(self, count: int, *, found: bool) -> None:
        self.get_messages += count
        if found:
            self.get_found += 1
        else:
            self.get_miss += 1


def _runtime_text(ms: int) -> str:
    seconds = max(0, ms // 1000)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"[ {days} days, {hours} hours, {minutes} minutes, {secs} seconds ]"
