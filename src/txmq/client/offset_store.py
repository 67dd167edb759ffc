"""Where a consumer keeps its progress: on the brokers (clustering) or in a local JSON file (broadcasting)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import orjson

from txmq.client.message import MessageQueue
from txmq.errors import MQClientError, RemotingError
from txmq.util import atomic_write_bytes

if TYPE_CHECKING:
    from txmq.client.config import ClientConfig
    from txmq.client.instance import ClientInstance

log = logging.getLogger("txmq.client")


class OffsetStore(Protocol):
    def get(self, mq: MessageQueue) -> int | None: ...

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = False) -> None: ...

    async def read(self, mq: MessageQueue, *, from_store: bool = True) -> int: ...

    async def persist(self, mq: MessageQueue, *, wait: bool = False) -> None: ...

    async def persist_all(self, mqs: Iterable[MessageQueue], *, wait: bool = False) -> None: ...

    def remove(self, mq: MessageQueue) -> None: ...


class _MemoryTable:
    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}

    def get(self, mq: MessageQueue) -> int | None:
        return self.table.get(mq)

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = False) -> None:
        if offset < 0:
            return
        old = self.table.get(mq)
        if old is None or not increase_only or offset > old:
            self.table[mq] = offset

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)


class RemoteBrokerOffsetStore(_MemoryTable):
    """Offsets committed to the broker that owns each queue (UPDATE_CONSUMER_OFFSET, QUERY_CONSUMER_OFFSET)."""

    def __init__(self, instance: ClientInstance, group: str) -> None:
        super().__init__()
        self._instance = instance
        self.group = group

    async def _addr(self, mq: MessageQueue) -> str:
        addr = await self._instance.find_broker_addr_refreshing(mq.broker_name, mq.topic, master_only=False)
        if addr is None:
            raise MQClientError(f"the broker {mq.broker_name} of {mq} is not known")
        return addr

    async def read(self, mq: MessageQueue, *, from_store: bool = True) -> int:
        """The offset to resume from, -1 when the broker has none. Connection or broker errors propagate."""
        if not from_store:
            cached = self.table.get(mq)
            if cached is not None:
                return cached
        offset = await self._instance.api.query_consumer_offset(await self._addr(mq), self.group, mq)
        if offset >= 0:
            self.update(mq, offset)
        return offset

    async def persist(self, mq: MessageQueue, *, wait: bool = False) -> None:
        offset = self.table.get(mq)
        if offset is None:
            return
        # Periodic commits go oneway like Java's; a shutdown or a queue handed to another consumer waits for the
        # answer so the next owner reads the final offset.
        await self._instance.api.update_consumer_offset(await self._addr(mq), self.group, mq, offset, oneway=not wait)

    async def persist_all(self, mqs: Iterable[MessageQueue], *, wait: bool = False) -> None:
        for mq in list(mqs):
            try:
                await self.persist(mq, wait=wait)
            except (RemotingError, MQClientError) as exc:
                log.warning("committing the offset of %s for group %s failed: %s", mq, self.group, exc)


def default_offset_dir() -> Path:
    return Path(os.environ.get("TXMQ_OFFSET_STORE_DIR") or Path.home() / ".txmq" / "offsets")


class LocalFileOffsetStore(_MemoryTable):
    """Broadcasting progress in ``<dir>/<file_name>.json``; every consumer owns its offsets, so none go to brokers."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        self._loaded = False

    def load(self) -> None:
        self._loaded = True
        try:
            data = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as exc:
            raise MQClientError(f"cannot read the local offset file {self.path}: {exc}") from exc
        for entry in data.get("offsetTable", []) if isinstance(data, dict) else []:
            try:
                mq = MessageQueue(str(entry["topic"]), str(entry["brokerName"]), int(entry["queueId"]))
                self.table[mq] = int(entry["offset"])
            except (KeyError, TypeError, ValueError):
                log.warning("ignoring a malformed entry in %s: %r", self.path, entry)

    async def read(self, mq: MessageQueue, *, from_store: bool = True) -> int:
        if not self._loaded:  # this process is the file's only writer: read it once
            self.load()
        return self.table.get(mq, -1)

    async def persist(self, mq: MessageQueue, *, wait: bool = False) -> None:
        self._write()

    async def persist_all(self, mqs: Iterable[MessageQueue], *, wait: bool = False) -> None:
        self._write()

    def _write(self) -> None:
        if not self.table:
            return
        entries = [
            {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
            for mq, off in sorted(self.table.items())
        ]
        try:
            # Not fsynced: losing the last few seconds of broadcast progress only re-delivers, and this runs every 5 s.
            atomic_write_bytes(
                self.path, orjson.dumps({"offsetTable": entries}, option=orjson.OPT_INDENT_2), durable=False
            )
        except OSError as exc:
            log.warning("writing the local offset file %s failed: %s", self.path, exc)


def offset_store_for(
    instance: ClientInstance, group: str, config: ClientConfig, clustering: bool, offset_store_dir: Path | None
) -> OffsetStore:
    """Clustering: the brokers keep the group's offsets. Broadcasting: a local file per group (and instance name,
    when the consumer was given one, so that two members in one process keep apart)."""
    if clustering:
        return RemoteBrokerOffsetStore(instance, group)
    name = f"{group}@{config.instance_name}" if config.instance_name_set else group
    store = LocalFileOffsetStore((offset_store_dir or default_offset_dir()) / f"{name}.json")
    store.load()
    return store
