"""The composition root: opens the store, builds every part of the broker with only the collaborators it uses,
registers the request handlers, and starts and stops the parts in order."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson

from txmq.acl.service import AclService
from txmq.broker.admin import AdminProcessor
from txmq.broker.clients import ClientRegistry
from txmq.broker.config import BrokerConfig
from txmq.broker.consumer_admin import ConsumerAdminProcessor, lock_lifetime_seconds
from txmq.broker.end_transaction import EndTransactionProcessor
from txmq.broker.filters import ConsumerFilters
from txmq.broker.ha import HaMaster, HaSlave
from txmq.broker.ha.gate import ReplicaGate
from txmq.broker.ha.roles import (
    refusing_when_fenced,
    slave_end_transaction_handler,
    slave_send_handler,
    waiting_for_slave,
)
from txmq.broker.locks import QueueLockManager
from txmq.broker.longpoll import PullHoldService
from txmq.broker.notify import ConsumerIdsNotifier
from txmq.broker.offsets import ConsumerOffsetManager
from txmq.broker.pop.service import PopService
from txmq.broker.pull import PullProcessor
from txmq.broker.refusal import Handler, answering_refusals
from txmq.broker.registration import NameServerRegistration
from txmq.broker.reply import ReplyProcessor
from txmq.broker.runtime import BrokerStats, RuntimeInfo
from txmq.broker.schedule import ScheduleService
from txmq.broker.send import SendProcessor
from txmq.broker.subscriptions import SubscriptionGroupManager
from txmq.broker.tools_admin import ToolsAdminProcessor
from txmq.broker.topics import TopicConfigManager
from txmq.broker.tx_admin import TransactionAdminProcessor
from txmq.broker.txn import TransactionService
from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.net import Dispatcher, Server
from txmq.protocol.codes import RequestCode, ResponseCode, TxmqReplicaRequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.store.config import StoreConfig
from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker")

CLIENT_SCAN_SECONDS = 10.0
OFFSET_PERSIST_SECONDS = 5.0


def store_config_of(config: BrokerConfig) -> StoreConfig:
    return StoreConfig.from_properties({**config.store_properties(), "messageDelayLevel": config.message_delay_level})


class BrokerApp:
    """A broker whose store is open and whose server listens: build it with ``await BrokerApp.open(config)``, then
    ``await start()`` its timers and services, and ``await close()``."""

    @classmethod
    async def open(cls, config: BrokerConfig, *, clock: Clock = SYSTEM_CLOCK, host: str = "0.0.0.0") -> BrokerApp:
        """Open (recover) the store, then listen; a ``listen_port`` of 0 becomes the port picked. The handlers are
        registered before the event loop runs again, so no request meets a half-built broker."""
        config.check_role()
        store_config = store_config_of(config)
        store = MessageStore(store_config, clock=clock)
        await store.start()
        store.replica = config.is_slave
        server: Server | None = None
        try:
            dispatcher = Dispatcher()
            acl = AclService.from_broker_config(config, clock=clock) if config.acl_enable else None
            if acl is not None:
                acl.install(dispatcher)
            # Bound now (the port is known to every part), accepting once started: no request is served before the
            # transaction table is rebuilt and any COMMIT a crash cut short is finished.
            server = await Server.start(host, config.listen_port, dispatcher, clock=clock, serving=False)
            if config.listen_port == 0:
                config.listen_port = server.port
            return cls(
                config=config,
                clock=clock,
                store_config=store_config,
                store=store,
                dispatcher=dispatcher,
                server=server,
                acl=acl,
                host=host,
            )
        except BaseException:
            if server is not None:
                await server.close()
            await store.close()
            raise

    def __init__(
        self,
        *,
        config: BrokerConfig,
        clock: Clock,
        store_config: StoreConfig,
        store: MessageStore,
        dispatcher: Dispatcher,
        server: Server,
        acl: AclService | None,
        host: str = "0.0.0.0",
    ) -> None:
        self.config = config
        self.clock = clock
        self.store_config = store_config
        self.store = store
        self.dispatcher = dispatcher
        self.server = server
        self.acl = acl
        self.store_host: tuple[str, int] = (config.advertised_ip, config.listen_port)
        self.started_at_ms = clock.now_ms()
        config_dir = Path(config.store_path_root_dir) / "config"
        store_host = self.store_host

        # Bookkeeping: files under config/ and in-memory registries.
        self.topics = TopicConfigManager(
            config_dir / "topics.json",
            cluster_name=config.broker_cluster_name,
            broker_name=config.broker_name,
            default_queue_nums=config.default_topic_queue_nums,
            auto_create=config.auto_create_topic_enable,
            cluster_topic=config.cluster_topic_enable,
            broker_topic=config.broker_topic_enable,
            clock=clock,
        )
        self.offsets = ConsumerOffsetManager(config_dir / "consumerOffset.json")
        self.subscriptions = SubscriptionGroupManager(
            config_dir / "subscriptionGroup.json", auto_create=config.auto_create_subscription_group
        )
        self.clients = ClientRegistry(expiry_seconds=config.client_channel_expired_seconds)
        self.locks = QueueLockManager(lock_lifetime_seconds(config))
        self.pull_holds = PullHoldService(clock)
        self.filters = ConsumerFilters()
        self.stats = BrokerStats()
        self.notifier = ConsumerIdsNotifier(self.clients, self.subscriptions)
        self.registration = NameServerRegistration(config=config, clock=clock, topics=self.topics)
        topic_changed = self.registration.topic_changed

        # Services and processors.
        self.schedule = ScheduleService(
            config=config,
            clock=clock,
            store_host=store_host,
            store=store,
            levels_ms=store_config.delay_levels_ms(),
            topics=self.topics,
            subscriptions=self.subscriptions,
            topic_changed=topic_changed,
            config_dir=config_dir,
        )
        self.transactions = TransactionService(
            config=config,
            clock=clock,
            store_host=store_host,
            store=store,
            topics=self.topics,
            offsets=self.offsets,
            clients=self.clients,
            schedule=self.schedule,
            topic_changed=topic_changed,
        )
        self.send_processor = SendProcessor(
            config=config,
            store_host=store_host,
            store=store,
            topics=self.topics,
            subscriptions=self.subscriptions,
            transactions=self.transactions,
            schedule=self.schedule,
            topic_changed=topic_changed,
            requester_seen=self.clients.note_requester,
        )
        self.reply_processor = ReplyProcessor(
            config=config,
            store_host=store_host,
            store=store,
            send=self.send_processor,
            clients=self.clients,
            clock=clock,
        )
        self.pull_processor = PullProcessor(
            config=config,
            clock=clock,
            store=store,
            topics=self.topics,
            subscriptions=self.subscriptions,
            clients=self.clients,
            offsets=self.offsets,
            pull_holds=self.pull_holds,
            filters=self.filters,
            stats=self.stats,
        )
        self.consumer_admin = ConsumerAdminProcessor(
            config=config,
            store_host=store_host,
            store=store,
            topics=self.topics,
            subscriptions=self.subscriptions,
            clients=self.clients,
            offsets=self.offsets,
            config_dir=config_dir,
        )
        self.tools_admin = ToolsAdminProcessor(
            config=config,
            store_config=store_config,
            clock=clock,
            started_at_ms=self.started_at_ms,
            store=store,
            topics=self.topics,
            clients=self.clients,
            offsets=self.offsets,
            stats=self.stats,
            consumer_admin=self.consumer_admin,
        )
        self.runtime_info = RuntimeInfo(
            config=config,
            clock=clock,
            started_at_ms=self.started_at_ms,
            store=store,
            stats=self.stats,
            pull_holds=self.pull_holds,
            tools_admin=self.tools_admin,
            transactions=self.transactions,
        )
        self.admin = AdminProcessor(
            config=config,
            clock=clock,
            store=store,
            topics=self.topics,
            subscriptions=self.subscriptions,
            clients=self.clients,
            offsets=self.offsets,
            locks=self.locks,
            filters=self.filters,
            notifier=self.notifier,
            topic_changed=topic_changed,
            register_now=self.registration.register_now,
            broker_runtime_info=self.runtime_info,
        )
        self.end_transaction = EndTransactionProcessor(self.transactions)
        self.tx_admin = TransactionAdminProcessor(config=config, transactions=self.transactions)
        self.pop = PopService(
            config=config,
            clock=clock,
            store_host=store_host,
            store=store,
            topics=self.topics,
            subscriptions=self.subscriptions,
            offsets=self.offsets,
            topic_changed=topic_changed,
            delay_levels_ms=store_config.delay_levels_ms(),
            folder=Path(config.store_path_root_dir) / "pop",
            stats=self.stats,
        )
        # Replication: a master listens on its HA port for slaves; a slave copies its master's log and metadata.
        self.ha_master: HaMaster | None = None
        self.ha_slave: HaSlave | None = None
        # Every write an acknowledgement depends on asks it (4.x and gRPC sends, decisions, delay re-puts).
        self.replica_gate = ReplicaGate(config, store)
        self.transactions.writer.gate = self.replica_gate
        self.schedule.gate = self.replica_gate
        if config.is_slave:
            self.ha_slave = HaSlave(
                config=config,
                clock=clock,
                store=store,
                topics=self.topics,
                subscriptions=self.subscriptions,
                offsets=self.offsets,
                delay_offsets_path=self.schedule.path,
                master_addrs=self._master_addrs,
            )
        else:
            self.ha_master = HaMaster(config=config, clock=clock, store=store)
            self.replica_gate.master = self.ha_master
        self._host = host
        # Controller mode: the master named in etcd (broker address, HA address), and the controller's view for
        # admin answers; both set by the Broker that owns the controller.
        self.master_override: tuple[str, str] | None = None
        self.controller_status: Any = None
        # A slave's gRPC door refuses writes and consumption (5.x clients have no slave reads) until it is promoted.
        self.grpc_door = self._grpc_door(host) if config.grpc_listen_port else None
        self.rpc_latency: Any = None
        self.metrics_server: Any = None
        if config.metrics_port:
            self._metrics(host)
        self.console: Any = None

        self.runtime_info.sources.append(self._replication_runtime_info)
        store.on_new_messages(self.pull_holds.notify)
        self._register_handlers()
        self._tasks: list[asyncio.Task[Any]] = []

    def _grpc_door(self, host: str) -> Any:
        # Imported here: a broker with the gRPC door off never loads grpc.
        from txmq.door_grpc.peers import KV_NAMESPACE, ClusterPeers
        from txmq.door_grpc.server import GrpcDoor
        from txmq.door_grpc.service import MessagingDoor

        config = self.config
        # Other brokers find this one's gRPC endpoint in the name server's KV config; it finds theirs there.
        self.registration.kv.append(
            (KV_NAMESPACE, config.broker_addr, f"{config.advertised_ip}:{config.grpc_listen_port}")
        )
        peers = ClusterPeers(broker_name=config.broker_name, ask=self.registration.ask, monotonic=self.clock.monotonic)
        door = MessagingDoor(
            config=config,
            clock=self.clock,
            store=self.store,
            topics=self.topics,
            subscriptions=self.subscriptions,
            send=self.send_processor,
            schedule=self.schedule,
            pop=self.pop,
            transactions=self.transactions,
            clients=self.clients,
            acl=self.acl,
            delay_levels_ms=self.store_config.delay_levels_ms(),
            endpoints=lambda: (config.advertised_ip, config.grpc_listen_port),
            peers=peers.queues if config.namesrv_addrs else None,
            gate=self.replica_gate,
        )
        return GrpcDoor(door, host=host, port=config.grpc_listen_port, max_message_size=config.max_message_size)

    def _metrics(self, host: str) -> None:
        # Imported here: a broker with metricsPort=0 never loads prometheus_client or aiohttp.
        from prometheus_client import CollectorRegistry

        from txmq.broker.metrics import BrokerCollector, MetricsServer, RpcLatency

        self.rpc_latency = RpcLatency()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(
            BrokerCollector(
                config=self.config,
                store=self.store,
                stats=self.stats,
                offsets=self.offsets,
                clients=self.clients,
                transactions=self.transactions,
                server=self.server,
                rpc=self.rpc_latency,
            )
        )
        self.metrics_server = MetricsServer(registry, self.config.metrics_host or host, self.config.metrics_port)

    def _register_handlers(self) -> None:
        handlers: dict[int, Handler] = {}
        for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
            handlers[code] = self.send_processor.handle
        for code in (RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2):
            handlers[code] = self.reply_processor.handle
        handlers[RequestCode.PULL_MESSAGE] = self.pull_processor.handle
        handlers[RequestCode.LITE_PULL_MESSAGE] = self.pull_processor.handle
        handlers.update(self.admin.handlers())
        handlers[RequestCode.END_TRANSACTION] = self.end_transaction.handle
        handlers.update(self.tx_admin.handlers())
        handlers[RequestCode.CONSUMER_SEND_MSG_BACK] = self.schedule.send_back
        handlers.update(self.consumer_admin.handlers())
        handlers.update(self.tools_admin.handlers())
        handlers[TxmqReplicaRequestCode.TXMQ_PROMOTE_BROKER] = self._promote
        handlers[RequestCode.GET_ALL_DELAY_OFFSET] = self.schedule.all_delay_offsets
        handlers.update(self._role_handlers())
        for code, handler in handlers.items():
            self._register(code, handler)

    def _register(self, code: int, handler: Handler) -> None:
        wrapped = answering_refusals(handler)
        if self.rpc_latency is not None:
            wrapped = self.rpc_latency.timed(code, wrapped)
        self.dispatcher.register(code, wrapped)

    def _role_handlers(self) -> dict[int, Handler]:
        """The handlers that depend on the role: a slave refuses writes, a SYNC_MASTER waits for its slave."""
        send_codes = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
        handlers: dict[int, Handler] = {}
        reply_codes = (RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2)
        if self.config.is_slave:
            for code in (*send_codes, *reply_codes):
                handlers[code] = slave_send_handler
            handlers[RequestCode.CONSUMER_SEND_MSG_BACK] = slave_send_handler
            handlers[RequestCode.END_TRANSACTION] = slave_end_transaction_handler
            return handlers
        for code in send_codes:
            handlers[code] = self.send_processor.handle
        for code in reply_codes:
            handlers[code] = self.reply_processor.handle
        if self.config.broker_role == "SYNC_MASTER" and self.ha_master is not None:
            for code in send_codes:
                handlers[code] = waiting_for_slave(
                    handlers[code], self.ha_master, self.store, self.config.sync_flush_timeout
                )
        elif self.config.enable_controller_mode and self.ha_master is not None:
            for code in send_codes:
                handlers[code] = refusing_when_fenced(handlers[code], self.ha_master)
        handlers[RequestCode.END_TRANSACTION] = self.end_transaction.handle
        handlers[RequestCode.CONSUMER_SEND_MSG_BACK] = self.schedule.send_back
        if self.config.broker_role == "SYNC_MASTER" and self.ha_master is not None:
            # A send-back is acknowledged once its retry copy is on a slave too (the consumer then moves past the
            # original). END_TRANSACTION waits in the transaction writer (ReplicaGate), answered or oneway.
            handlers[RequestCode.CONSUMER_SEND_MSG_BACK] = waiting_for_slave(
                handlers[RequestCode.CONSUMER_SEND_MSG_BACK], self.ha_master, self.store, self.config.sync_flush_timeout
            )
        if self.config.enable_controller_mode and self.ha_master is not None:
            # A fenced master decides no transaction and takes no send-back either (its tail may be cut).
            for code in (RequestCode.END_TRANSACTION, RequestCode.CONSUMER_SEND_MSG_BACK):
                handlers[code] = refusing_when_fenced(handlers[code], self.ha_master)
        return handlers

    async def _promote(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """TXMQ_PROMOTE_BROKER: this slave becomes its brokerName's master (manual failover, no controller)."""
        try:
            body = orjson.loads(cmd.body) if cmd.body else {}
            role = str(body.get("brokerRole") or "ASYNC_MASTER").upper()
            force = bool(body.get("force", False))
        except (orjson.JSONDecodeError, AttributeError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"promote: the body is not a JSON object: {exc}")
        if not self.config.is_slave:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"this broker is already a master ({self.config.broker_role})"
            )
        if role not in ("ASYNC_MASTER", "SYNC_MASTER"):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"promote to {role}: use ASYNC_MASTER or SYNC_MASTER")
        await self.registration.register_now()
        previous = self.registration.master_addr
        if previous and not force:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"the name server still lists {previous} as the master of {self.config.broker_name}: stop it first "
                "(or promote with force, and make sure it never comes back as a master)",
            )
        await self.promote(role)
        answer = {
            "brokerRole": self.config.broker_role,
            "brokerId": self.config.broker_id,
            "maxOffset": self.store.max_physical_offset(),
            "previousMaster": previous,
        }
        return cmd.response(body=orjson.dumps(answer))

    async def promote(self, role: str = "ASYNC_MASTER") -> None:
        """Stop copying (everything received is already applied: a slave's appends are durable and dispatched
        when acknowledged), take writes, rebuild the transaction table and start the master's services."""
        if self.ha_slave is not None:
            await self.ha_slave.close()
            self.ha_slave = None
        self.store.replica = False
        config = self.config
        config.broker_role, config.broker_id = role, 0
        self.ha_master = HaMaster(config=config, clock=self.clock, store=self.store)
        self.replica_gate.master = self.ha_master
        if config.enable_controller_mode:
            self.ha_master.required = frozenset()  # until the controller's in-sync set names the slaves
        await self.ha_master.start(self._host)
        self.registration.ha_port = self.ha_master.port
        self.registration.master_addr = self.registration.master_ha_addr = ""
        await self.transactions.start()
        await self.schedule.start()
        await self.pop.start()
        for code, handler in self._role_handlers().items():
            self._register(code, handler)
        log.warning(
            "promoted: %s is now the %s of %s at commit-log offset %d",
            config.broker_addr,
            role,
            config.broker_name,
            self.store.max_physical_offset(),
        )
        await self.registration.register_now()

    def _master_addrs(self) -> tuple[str, str]:
        """A slave's master: (broker address, HA address), from ``haMasterAddress`` or the name server's answer."""
        if self.master_override is not None:
            return self.master_override
        registration = self.registration
        return registration.master_addr, self.config.ha_master_address or registration.master_ha_addr

    def _replication_runtime_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"brokerRole": self.config.broker_role}
        if self.ha_master is not None:
            slaves = self.ha_master.slaves()
            in_sync = [s for s in slaves if s["state"] == "streaming"]
            info["haServerAddr"] = self.ha_master.ha_addr
            info["haSlavesInSync"] = len(in_sync)
            info["haSlaveLagBytes"] = min((s["lagBytes"] for s in in_sync), default=-1)
        if self.controller_status is not None:
            ctl = self.controller_status()
            info["haControllerRole"] = ctl["controllerRole"]
            info["haEpoch"] = ctl["epoch"]
            info["haSyncStateSet"] = ",".join(ctl["syncStateSet"] or [])
            info["haTruncatedBytes"] = ctl.get("droppedBytes", 0)  # cut from this log when it last rejoined
        if self.ha_slave is not None:
            status = self.ha_slave.status()
            info["haMasterAddr"] = status["masterHaAddr"]
            info["haReplicaState"] = status["state"]
            info["haSlaveDurableOffset"] = status["durableOffset"]
        return info

    def replication_status(self) -> dict[str, Any]:
        """Role, offsets and the slaves (a master) or the link to the master (a slave), for admin views."""
        status: dict[str, Any] = {
            "brokerRole": self.config.broker_role,
            "brokerId": self.config.broker_id,
            "maxOffset": self.store.max_physical_offset(),
        }
        if self.ha_master is not None:
            status["haAddr"] = self.ha_master.ha_addr
            status["slaves"] = self.ha_master.slaves()
        if self.ha_slave is not None:
            status["master"] = self.ha_slave.status()
        if self.controller_status is not None:
            status["controller"] = self.controller_status()
        return status

    # -- lifecycle

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._client_scan_loop(), name="broker-client-scan"),
            asyncio.create_task(self._persist_loop(), name="broker-persist"),
            asyncio.create_task(self._stats_sample_loop(), name="broker-stats"),
        ]
        if self.ha_master is not None:
            await self.ha_master.start(self._host)
            self.registration.ha_port = self.ha_master.port
        if self.ha_slave is None:
            await self.transactions.start()
            await self.schedule.start()
            await self.pop.start()
        else:
            # A slave appends only its master's bytes: no transaction checks, delay deliveries or pop revives here.
            self.ha_slave.start()
        if self.acl is not None:
            await self.acl.start()
        if self.grpc_door is not None:
            await self.grpc_door.start()
        if self.metrics_server is not None:
            try:
                await self.metrics_server.start()
                self.config.metrics_port = self.metrics_server.port
            except OSError as exc:
                # Monitoring must not keep a broker from serving (two brokers on one machine both default to 5557).
                log.error("no /metrics: %s", exc.strerror or exc)
                self.metrics_server = None
        await self.server.begin_serving()
        self.registration.start()  # once both doors serve, the name servers may send clients here
        if self.config.console_port:
            await self._start_console()
        log.info(
            "broker %s (%s, %s id %d) serving on %s%s, store %s, flush %s",
            self.config.broker_name,
            self.config.broker_cluster_name,
            self.config.broker_role,
            self.config.broker_id,
            self.config.broker_addr,
            f" and gRPC port {self.config.grpc_listen_port}" if self.grpc_door is not None else "",
            self.store_config.store_path_root_dir,
            self.config.flush_disk_type,
        )

    async def _start_console(self) -> None:
        # Imported here: a broker without consolePort never loads the console. The console is a client of the
        # cluster (the same Admin calls as ``txmq console``), found through this broker's name servers.
        from txmq.console import Console, ConsoleSettings

        config = self.config
        if not config.namesrv_addrs:
            log.error(
                "consolePort=%d is set but namesrvAddr is empty: the console needs a name server; not started",
                config.console_port,
            )
            return
        acl = self.acl
        self.console = Console(
            ConsoleSettings(
                namesrv=config.namesrv_addr,
                host=config.console_host,
                port=config.console_port,
                access_key=config.console_access_key or None,
                secret_key=config.console_secret_key or None,
                acl=(lambda: acl.state) if acl is not None else None,
                sample_seconds=max(1, config.console_sample_seconds),
            )
        )
        await self.console.start()
        config.console_port = self.console.port

    async def close(self) -> None:
        if self.console is not None:
            await self.console.close()
        self.registration.stop()
        if self.ha_slave is not None:
            await self.ha_slave.close()
        if self.ha_master is not None:
            await self.ha_master.close()
        for task in self._tasks:
            task.cancel()
        if self.grpc_door is not None:
            await self.grpc_door.close()
        if self.metrics_server is not None:
            await self.metrics_server.close()
        await self.pop.close()
        await self.transactions.close()
        await self.schedule.close()
        if self.acl is not None:
            await self.acl.close()
        await self.registration.unregister()
        self.pull_holds.release_all()
        await self.server.close()
        self.registration.close_connections()
        self.offsets.persist(force=True)
        await self.store.close()

    # -- timers

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
                self.notifier.notify_consumer_ids_changed(group)

    async def _stats_sample_loop(self) -> None:
        while True:
            self.tools_admin.sample()
            await self.clock.sleep(1.0)

    async def _persist_loop(self) -> None:
        """Consumer offsets every few seconds, and the topic and subscription-group tables whose last write a full
        disk deferred."""
        while True:
            await self.clock.sleep(OFFSET_PERSIST_SECONDS)
            for what, save in (
                ("consumer offsets", self.offsets.persist),
                ("the topic table", self.topics.save_unsaved),
                ("the subscription groups", self.subscriptions.save_unsaved),
            ):
                try:
                    await asyncio.get_running_loop().run_in_executor(None, save)
                except OSError as exc:
                    log.error("persisting %s failed: %s", what, exc)
