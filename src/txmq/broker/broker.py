"""The broker as the CLI and the tests hold it: ``Broker(config, clock=...)``, ``await start(host)``, ``await close()``.
Starting it builds a :class:`~txmq.broker.app.BrokerApp` (the composition root); the parts are read through it."""

from __future__ import annotations

import logging
from typing import Any

from txmq.broker.app import BrokerApp
from txmq.broker.clients import ClientRegistry
from txmq.broker.config import BrokerConfig
from txmq.broker.offsets import ConsumerOffsetManager
from txmq.broker.schedule import ScheduleService
from txmq.broker.subscriptions import SubscriptionGroupManager
from txmq.broker.topics import TopicConfigManager
from txmq.broker.txn import TransactionService
from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.errors import ConfigError
from txmq.net import Dispatcher
from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.ha")


class Broker:
    """One broker process's worth of state. ``await start()``, then ``await close()``."""

    def __init__(self, config: BrokerConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self._app: BrokerApp | None = None
        self.controller: Any = None  # txmq.broker.ha.controller.EtcdController in controller mode
        self._host = "0.0.0.0"
        self.dropped_bytes = 0  # controller mode: bytes of the log's tail cut when it last rejoined as a slave

    async def start(self, host: str = "0.0.0.0") -> None:
        self._host = host
        if self.config.enable_controller_mode:
            await self._start_in_controller_mode(host)
            return
        self._app = await BrokerApp.open(self.config, clock=self.clock, host=host)
        await self._app.start()

    async def close(self) -> None:
        if self.controller is not None:
            await self.controller.close()
        if self._app is not None:
            await self._app.close()

    # -- controller mode: every replica starts as a slave; the controller elects one and promotes it

    async def _start_in_controller_mode(self, host: str) -> None:
        from txmq.broker.ha.controller import EtcdController
        from txmq.broker.ha.epoch_file import read_epochs
        from txmq.ha.election import truncation_point

        config = self.config
        role = config.broker_role.upper()
        if role not in ("SYNC_MASTER", "ASYNC_MASTER"):
            raise ConfigError(
                f"enableControllerMode=true: brokerRole is the role this replica takes when elected (SYNC_MASTER "
                f"or ASYNC_MASTER), not {config.broker_role}"
            )
        if config.broker_id < 1:
            raise ConfigError("enableControllerMode=true: give each replica its own brokerId >= 1")
        self.master_role = role
        self.replica_id = config.broker_id
        root = config.store_path_root_dir
        local = read_epochs(root)
        self.controller = EtcdController(config=config, clock=self.clock, local_epochs=local)
        view = await self.controller.prepare()
        cut = truncation_point(local, view.history)
        self._truncate(cut, f"the controller's epoch history {[(e.epoch, e.start_offset) for e in view.history]}")
        await self._open_as_slave(host)
        self.controller.start(self)

    def _truncate(self, cut: int | None, why: str) -> None:
        from txmq.store.replica import truncate_tail_offline

        if cut is None:
            return
        dropped = truncate_tail_offline(self.config.store_path_root_dir, self.config.mapped_file_size_commit_log, cut)
        if dropped:
            self.dropped_bytes = dropped
            log.warning(
                "controller: dropped %d bytes of commit log after offset %d that the new master never had (%s)",
                dropped,
                cut,
                why,
            )

    async def _open_as_slave(self, host: str) -> None:
        config = self.config
        config.broker_role, config.broker_id = "SLAVE", self.replica_id
        app = await BrokerApp.open(config, clock=self.clock, host=host)
        app.master_override = ("", "")  # no master until the controller names one
        app.controller_status = lambda: {**self.controller.status(), "droppedBytes": self.dropped_bytes}
        self._app = app
        await app.start()

    # ReplicaHost (what the controller drives)

    def log_end(self) -> int:
        return self.app.store.max_physical_offset()

    def ha_addr(self) -> str:
        ha = self.app.ha_master
        if ha is not None and ha.port:
            return ha.ha_addr
        port = self.config.ha_listen_port if self.config.ha_listen_port >= 0 else self.config.listen_port + 1
        return f"{self.config.advertised_ip}:{port}"

    async def stop_replicating(self) -> None:
        if self.app.ha_slave is not None:
            await self.app.ha_slave.stop_link()

    async def follow(self, leader: Any) -> None:
        app = self.app
        app.master_override = (leader.addr, leader.ha_addr)
        log.info("controller: following %s (HA %s) at epoch %d", leader.addr, leader.ha_addr, leader.epoch)
        if app.ha_slave is not None:
            await app.ha_slave.restart_link()

    async def become_master(self, epoch: int, start_offset: int) -> None:
        app = self.app
        if app.ha_slave is not None or app.config.is_slave:
            app.master_override = None
            await app.promote(self.master_role)
        log.warning("controller: serving as the %s of %s at epoch %d", self.master_role, self.config.broker_name, epoch)

    async def rejoin(self, leader: Any, truncate_at: int | None, reason: str) -> None:
        from txmq.broker.ha.epoch_file import read_epochs

        if self._app is not None:
            await self._app.close()
            self._app = None
        self._truncate(truncate_at, reason)
        await self._open_as_slave(self._host)
        self.controller.machine.rejoined(leader, read_epochs(self.config.store_path_root_dir))

    def fence(self, reason: str) -> None:
        if self._app is not None and self._app.ha_master is not None:
            self._app.ha_master.fence(reason)

    def unfence(self) -> None:
        if self._app is not None and self._app.ha_master is not None:
            self._app.ha_master.unfence()

    def in_sync_replicas(self) -> frozenset[str]:
        ha = self.app.ha_master
        return ha.in_sync_replicas() if ha is not None else frozenset()

    def set_required(self, replicas: frozenset[str] | None) -> None:
        ha = self.app.ha_master
        if ha is not None:
            ha.set_required(replicas)

    def set_lease_deadline(self, deadline: float | None) -> None:
        ha = self.app.ha_master
        if ha is not None:
            ha.lease_deadline = deadline

    def save_epochs(self, entries: list[Any]) -> None:
        from txmq.broker.ha.epoch_file import write_epochs

        write_epochs(self.config.store_path_root_dir, entries)

    @property
    def app(self) -> BrokerApp:
        if self._app is None:
            raise RuntimeError("the broker is not started: await broker.start() first")
        return self._app

    # The parts tests and tools read.

    @property
    def store(self) -> MessageStore:
        return self.app.store

    @property
    def store_host(self) -> tuple[str, int]:
        return self.app.store_host

    @property
    def topics(self) -> TopicConfigManager:
        return self.app.topics

    @property
    def offsets(self) -> ConsumerOffsetManager:
        return self.app.offsets

    @property
    def subscriptions(self) -> SubscriptionGroupManager:
        return self.app.subscriptions

    @property
    def clients(self) -> ClientRegistry:
        return self.app.clients

    @property
    def transactions(self) -> TransactionService:
        return self.app.transactions

    @property
    def schedule(self) -> ScheduleService:
        return self.app.schedule

    @property
    def dispatcher(self) -> Dispatcher:
        return self.app.dispatcher

    def runtime_info(self) -> dict[str, Any]:
        return self.app.runtime_info()
