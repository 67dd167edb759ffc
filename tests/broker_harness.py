"""An in-process broker on loopback, driven by a FakeClock and restartable on the same store, for unit-level tests
of broker services (transactions, delay levels, retries). Real sockets, real store; only time is simulated."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmq.broker.broker import Broker
from txmq.broker.config import BrokerConfig
from txmq.clock import FakeClock
from txmq.net import Connection, connect


class InProcessBroker:
    """``start()`` / ``stop()`` / ``restart()`` a broker; ``connect()`` opens raw client connections to it.

    ``defaults`` are BrokerConfig fields a test family always wants; ``start(**overrides)`` adds to them and the
    overrides stick across restarts.
    """

    def __init__(self, root: Path, defaults: dict[str, Any] | None = None, **overrides: Any) -> None:
        self.root = root
        self.clock = FakeClock()
        self.broker: Broker | None = None
        self.defaults = dict(defaults or {})
        self.overrides: dict[str, Any] = dict(overrides)
        self.conns: list[Connection] = []

    async def start(self, **overrides: Any) -> Broker:
        self.overrides.update(overrides)
        fields: dict[str, Any] = {
            "listen_port": 0,
            "broker_ip1": "127.0.0.1",
            "store_path_root_dir": str(self.root / "store"),
            "mapped_file_size_commit_log": 1 << 20,
            "client_channel_expired_seconds": 10**7,  # fake time jumps must not expire the test's connections
            **self.defaults,
            **self.overrides,
        }
        self.broker = Broker(BrokerConfig(**fields), clock=self.clock)
        await self.broker.start("127.0.0.1")
        return self.broker

    async def stop(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns.clear()
        if self.broker is not None:
            await self.broker.close()
            self.broker = None

    async def restart(self) -> Broker:
        await self.stop()
        return await self.start()

    async def connect(self, handler: Callable[..., Any] | None = None) -> Connection:
        assert self.broker is not None
        conn = await connect("127.0.0.1", self.broker.config.listen_port, handler, clock=self.clock)
        self.conns.append(conn)
        return conn
