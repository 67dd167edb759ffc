"""The broker as the CLI and the tests hold it: ``Broker(config, clock=...)``, ``await start(host)``, ``await close()``.
Starting it builds a :class:`~txmq.broker.app.BrokerApp` (the composition root); the parts are read through it."""

from __future__ import annotations

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
from txmq.net import Dispatcher
from txmq.store.message_store import MessageStore


class Broker:
    """One broker process's worth of state. ``await start()``, then ``await close()``."""

    def __init__(self, config: BrokerConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self._app: BrokerApp | None = None

    async def start(self, host: str = "0.0.0.0") -> None:
        self._app = await BrokerApp.open(self.config, clock=self.clock, host=host)
        await self._app.start()

    async def close(self) -> None:
        if self._app is not None:
            await self._app.close()

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
