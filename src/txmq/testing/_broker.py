"""An in-process broker driven by a FakeClock, and :func:`wait_idle` for its background services."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmq.broker.broker import Broker
from txmq.broker.config import BrokerConfig
from txmq.net import Connection, connect
from txmq.testing._clock import FakeClock
from txmq.testing._eventually import DEFAULT_TIMEOUT, aeventually


def _parked(task: asyncio.Task[Any], clock: FakeClock) -> bool:
    """True when ``task`` waits for time (a FakeClock deadline not reached) or for an unset asyncio.Event."""
    coro: Any = task.get_coro()
    while coro is not None and hasattr(coro, "cr_code"):
        if coro.cr_code is FakeClock.sleep.__code__:
            return clock.is_sleeping(task)
        if coro.cr_code is asyncio.Event.wait.__code__:
            return not coro.cr_frame.f_locals["self"].is_set()
        coro = coro.cr_await
    return False


def _service_tasks(services: tuple[object, ...]) -> list[asyncio.Task[Any]]:
    """The live tasks running a method of one of ``services`` (their loops and their request handlers)."""
    found = []
    for task in asyncio.all_tasks():
        frame = getattr(task.get_coro(), "cr_frame", None)
        if not task.done() and frame is not None and any(frame.f_locals.get("self") is s for s in services):
            found.append(task)
    return found


async def wait_idle(broker: Broker, *, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Wait until the broker's clock-driven services (transaction checks, delay levels) have nothing due.

    Idle means every task of those services is parked: asleep on the broker's :class:`FakeClock` until a deadline
    still ahead, or waiting for new work on an event nobody has set. Call it after ``clock.advance()`` to let the
    rounds that the advance made due finish, including their store writes.
    """
    clock = broker.clock
    if not isinstance(clock, FakeClock):
        raise TypeError("wait_idle needs a broker driven by a txmq.testing.FakeClock")
    services = (broker.transactions, broker.schedule)

    def idle() -> bool:
        return all(_parked(task, clock) for task in _service_tasks(services))

    await aeventually(
        idle, "the broker's transaction checks and delay levels to go idle", timeout=timeout, interval=0.002
    )


class InProcessBroker:
    """A broker on loopback in this event loop, driven by a :class:`FakeClock` and restartable on the same store.

    ``start()`` / ``stop()`` / ``restart()`` it; ``connect()`` opens raw client connections to it. ``defaults`` are
    BrokerConfig fields a test family always wants; ``start(**overrides)`` adds to them and the overrides stick
    across restarts. Real sockets, real store; only time is simulated.
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
            "grpc_listen_port": 0,  # no gRPC door unless a test asks for one (8081 would clash between tests)
            "metrics_port": 0,  # no /metrics either (5557 would clash the same way)
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

    async def wait_idle(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """:func:`wait_idle` for the running broker."""
        assert self.broker is not None
        await wait_idle(self.broker, timeout=timeout)

    async def advance(self, seconds: float, *, step: float | None = None) -> None:
        """Move fake time by ``seconds`` (in steps of ``step``), waiting for the services to go idle before and
        after each step."""
        step = seconds if step is None or step <= 0 else step
        remaining = seconds
        await self.wait_idle()
        while remaining > 1e-9:
            delta = min(step, remaining)
            await self.clock.advance(delta)
            await self.wait_idle()
            remaining -= delta
