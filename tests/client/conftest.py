"""Fixtures for client tests: an in-process name server and fake brokers registered with it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from client_fakes import FakeBroker

from txmq.namesrv.server import NameServer


@pytest.fixture
async def namesrv() -> AsyncIterator[str]:
    ns = NameServer()
    port = await ns.start("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await ns.close()


@pytest.fixture
async def make_broker(namesrv: str) -> AsyncIterator[Callable[..., Awaitable[FakeBroker]]]:
    brokers: list[FakeBroker] = []

    async def make(name: str, topics: dict[str, tuple[int, int, int]] | None = None) -> FakeBroker:
        broker = await FakeBroker(name).start()
        brokers.append(broker)
        await broker.register(namesrv, topics)
        return broker

    yield make
    for broker in brokers:
        await broker.close()
