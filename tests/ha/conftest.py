"""Shared fixtures of the HA tests: a master's HA port over a real store on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from txmq.broker.config import BrokerConfig
from txmq.broker.ha import HaMaster
from txmq.clock import SYSTEM_CLOCK
from txmq.store.config import StoreConfig
from txmq.store.message_store import MessageStore


@pytest.fixture
async def make_master(tmp_path: Path) -> AsyncIterator[Callable[[int], Awaitable[HaMaster]]]:
    """``await make_master(segment_size)``: an HaMaster (broker "b") listening on loopback over a fresh store; every
    one made is closed, with its store, afterwards."""
    made: list[HaMaster] = []

    async def make(segment_size: int) -> HaMaster:
        root = tmp_path / f"master{len(made)}"
        store = MessageStore(StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=segment_size))
        await store.start()
        ha = HaMaster(
            config=BrokerConfig(broker_name="b", ha_listen_port=0, broker_ip1="127.0.0.1"),
            clock=SYSTEM_CLOCK,
            store=store,
        )
        made.append(ha)
        await ha.start("127.0.0.1")
        return ha

    try:
        yield make
    finally:
        for ha in made:
            await ha.close()
            await ha.store.close()
