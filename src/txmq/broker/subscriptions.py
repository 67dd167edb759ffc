"""Subscription group configuration (retry limits, consume switches), auto-created and persisted."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from txmq.broker.topics import validate_group
from txmq.util import TableFile, change_or_restore

log = logging.getLogger("txmq.broker")


@dataclass(slots=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    consume_message_orderly: bool = False  # RocketMQ 5: a FIFO group (5.x consumers get messages of a queue in order)


class SubscriptionGroupManager:
    def __init__(self, path: str | Path | None, *, auto_create: bool = True) -> None:
        self._path = Path(path) if path else None
        self._file = TableFile(self._path, "subscription groups")
        self._lock = threading.Lock()
        self.auto_create = auto_create
        self.groups: dict[str, SubscriptionGroupConfig] = {}
        if self._path is not None and self._path.exists():
            try:
                raw = orjson.loads(self._path.read_bytes())
                self.groups = {n: SubscriptionGroupConfig(**c) for n, c in raw["subscriptionGroupTable"].items()}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("subscription groups %s are unreadable (%s); starting empty", self._path, exc)

    def _persist_locked(self, *, defer_when_full: bool = False) -> None:
        """Write the table. ``defer_when_full``: a full disk only logs a warning, and the change, kept in memory, is
        written by the next change or :meth:`save_unsaved` (what automatic creation does: a consumer's heartbeat or
        pull must not fail because the broker's disk is full)."""
        self._file.write(
            lambda: {"subscriptionGroupTable": {n: asdict(c) for n, c in self.groups.items()}},
            defer_when_full=defer_when_full,
        )

    def save_unsaved(self) -> None:
        """Write the table again when a full disk deferred its last write."""
        with self._lock:
            if self._file.unsaved:
                self._persist_locked(defer_when_full=True)

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config, created with defaults when auto-creation is on and ``group`` is a valid name (its
        retry topic, named after it, becomes a directory of the store)."""
        cfg = self.groups.get(group)
        if cfg is None and self.auto_create and validate_group(group) is None:
            cfg = self.upsert(SubscriptionGroupConfig(group), defer_when_full=True)
        return cfg

    def upsert(self, config: SubscriptionGroupConfig, *, defer_when_full: bool = False) -> SubscriptionGroupConfig:
        """Set ``config``; when it cannot be written (and is not deferred), the table is left as it was and the
        error raised."""
        with self._lock:
            change_or_restore(
                self.groups, config.group_name, config, lambda: self._persist_locked(defer_when_full=defer_when_full)
            )
        return config

    def delete(self, group: str) -> bool:
        with self._lock:
            return change_or_restore(self.groups, group, None, self._persist_locked) is not None

    def follow(self, table: dict[str, Any]) -> bool:
        """A slave takes its master's groups (GET_ALL_SUBSCRIPTIONGROUP_CONFIG's table); returns whether any changed."""
        groups: dict[str, SubscriptionGroupConfig] = {}
        names = {f.name: camel for f in fields(SubscriptionGroupConfig) if (camel := _camel(f.name))}
        for name, raw in table.items():
            if not isinstance(raw, dict):
                continue
            try:
                groups[name] = SubscriptionGroupConfig(**{f: raw[c] for f, c in names.items() if c in raw})
            except TypeError:
                log.warning("master's subscription group %r is malformed; skipped", name)
        with self._lock:
            if groups == self.groups:
                return False
            self.groups = groups
            self._persist_locked(defer_when_full=True)
        return True


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)
