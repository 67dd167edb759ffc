"""Fixtures for the message-store tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers_store import small_config

from txmq.clock import Clock
from txmq.store.config import StoreConfig
from txmq.store.message_store import MessageStore
from txmq.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_store(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., MessageStore]]:
    """Open stores on small segments (blocking API); every store still open is shut down afterwards."""
    opened: list[MessageStore] = []

    def make(
        root: Path | None = None,
        config: StoreConfig | None = None,
        store_clock: Clock | None = None,
        disk_usage: Callable[[], float] | None = None,
        **overrides: Any,
    ) -> MessageStore:
        cfg = config if config is not None else small_config(root or tmp_path / "store", **overrides)
        store = MessageStore(cfg, clock=store_clock or clock, disk_usage=disk_usage)
        store.open()
        opened.append(store)
        return store

    yield make
    for store in opened:
        if store.is_open:
            store.shutdown()


@pytest.fixture
async def store(make_store: Callable[..., MessageStore]) -> AsyncIterator[MessageStore]:
    s = make_store()
    yield s
    if s.is_open:
        await s.close()
