"""Consumer offsets per (topic, group, queue), persisted atomically."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import orjson

from txmq.util import atomic_write_json

log = logging.getLogger("txmq.broker")


class ConsumerOffsetManager:
    """Offsets keyed ``topic@group`` -> {queueId: offset}, as RocketMQ keeps them.

    Updates are in memory; :meth:`persist` writes the whole table atomically (the broker calls it every 5 s and at
    shutdown). A dirty flag avoids rewriting an unchanged table.
    """

    def __init__(self, path: str | Path | None) -> None:
        self._path = Path(path) if path else None
        self._lock = threading.Lock()
        self.table: dict[str, dict[int, int]] = {}
        self._dirty = False
        if self._path is not None and self._path.exists():
            try:
                raw = orjson.loads(self._path.read_bytes())
                self.table = {k: {int(q): int(o) for q, o in v.items()} for k, v in raw["offsetTable"].items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.error("consumer offsets %s are unreadable (%s); starting empty", self._path, exc)

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}@{group}"

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            queues = self.table.setdefault(self.key(topic, group), {})
            if queues.get(queue_id) != offset:
                queues[queue_id] = offset
                self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.table.get(self.key(topic, group), {}).get(queue_id)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.table.get(self.key(topic, group), {}))

    def topics_of_group(self, group: str) -> list[str]:
        suffix = "@" + group
        return sorted(k[: -len(suffix)] for k in self.table if k.endswith(suffix))

    def groups_of_topic(self, topic: str) -> list[str]:
        prefix = topic + "@"
        return sorted(k[len(prefix) :] for k in self.table if k.startswith(prefix))

    def groups(self) -> list[str]:
        return sorted({k.split("@", 1)[1] for k in self.table if "@" in k})

    def reset(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        with self._lock:
            self.table[self.key(topic, group)] = dict(offsets)
            self._dirty = True

    def delete_group(self, group: str) -> None:
        with self._lock:
            for key in [k for k in self.table if k.endswith("@" + group)]:
                del self.table[key]
                self._dirty = True

    def follow(self, table: dict[str, dict[Any, Any]]) -> None:
        """A slave takes its master's offsets (GET_ALL_CONSUMER_OFFSET's ``offsetTable``), as RocketMQ's slaves do:
        what a consumer committed to this slave while the master was away is replaced once the master answers."""
        parsed = {str(k): {int(q): int(o) for q, o in v.items()} for k, v in table.items() if isinstance(v, dict)}
        with self._lock:
            if parsed != self.table:
                self.table = parsed
                self._dirty = True

    def persist(self, *, force: bool = False) -> bool:
        """Write the table if it changed; return whether it wrote."""
        if self._path is None:
            return False
        with self._lock:
            if not (self._dirty or force):
                return False
            snapshot = {k: dict(v) for k, v in self.table.items()}
            self._dirty = False
        try:
            atomic_write_json(self._path, {"offsetTable": snapshot})
        except BaseException:
            with self._lock:
                self._dirty = True  # the next call writes it again
            raise
        return True
