"""Topic configuration: system topics, auto-creation from TBW102, validation and persistence."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from txmq.clock import SYSTEM_CLOCK, Clock

# The names and bits live in txmq.protocol.topics; re-exported here for the broker's modules.
from txmq.protocol.topics import (  # noqa: F401
    AUTO_CREATE_TOPIC_KEY,
    BENCHMARK_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    MAX_TOPIC_LENGTH,
    NOT_ALLOWED_SEND_TOPICS,
    OFFSET_MOVED_EVENT,
    PERM_INHERIT,
    PERM_PRIORITY,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    dlq_topic,
    is_readable,
    is_writable,
    reply_topic,
    retry_topic,
)
from txmq.protocol.topics import TOPIC_NAME_RE as _TOPIC_RE
from txmq.util import TableFile, change_or_restore

log = logging.getLogger("txmq.broker")


def validate_topic(topic: str | None) -> str | None:
    """Return why ``topic`` is not a valid topic name, or None when it is."""
    if not topic or not topic.strip():
        return "The specified topic is blank."
    if len(topic) > MAX_TOPIC_LENGTH:
        return f"The specified topic is longer than topic max length {MAX_TOPIC_LENGTH}."
    if not _TOPIC_RE.fullmatch(topic):  # fullmatch: ``$`` alone lets a trailing newline through
        return f"The specified topic[{topic}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    return None


# A group's retry and dead-letter topics (``%RETRY%<group>``, ``%DLQ%<group>``) must be valid topics too: the store
# keeps a topic of at most MAX_TOPIC_LENGTH characters, and a consume queue's directory is named after it.
MAX_GROUP_LENGTH = MAX_TOPIC_LENGTH - len(retry_topic(""))


def validate_group(group: str | None) -> str | None:
    """Return why ``group`` is not a valid consumer group name, or None when it is."""
    if not group or not group.strip():
        return "The specified group is blank."
    if len(group) > MAX_GROUP_LENGTH:
        return (
            f"The specified group is longer than {MAX_GROUP_LENGTH} characters (its retry topic "
            f"{retry_topic('')}<group> must fit the topic max length {MAX_TOPIC_LENGTH})."
        )
    if not _TOPIC_RE.fullmatch(group):
        return f"The specified group[{group[:200]}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    return None


@dataclass(slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    @property
    def queue_count(self) -> int:
        return max(self.read_queue_nums, self.write_queue_nums)

    @property
    def writable(self) -> bool:
        return is_writable(self.perm)

    @property
    def readable(self) -> bool:
        return is_readable(self.perm)

    def to_json(self) -> dict[str, Any]:
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }


class TopicConfigManager:
    """All topics of one broker, persisted as JSON. Changes bump the data version the name server compares."""

    def __init__(
        self,
        path: str | Path | None,
        *,
        cluster_name: str,
        broker_name: str,
        default_queue_nums: int = 8,
        auto_create: bool = True,
        cluster_topic: bool = True,
        broker_topic: bool = True,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._path = Path(path) if path else None
        self._clock = clock
        self._lock = threading.Lock()
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = {"timestamp": clock.now_ms(), "counter": 0}
        self._file = TableFile(self._path, "topic config")
        self._load()
        system = [
            TopicConfig(SELF_TEST_TOPIC, 1, 1),
            TopicConfig(BENCHMARK_TOPIC, 1024, 1024),
            TopicConfig(OFFSET_MOVED_EVENT, 1, 1),
            TopicConfig(SCHEDULE_TOPIC, 18, 18),
            TopicConfig(reply_topic(cluster_name), 1, 1),
        ]
        if auto_create:
            system.append(TopicConfig(AUTO_CREATE_TOPIC_KEY, default_queue_nums, default_queue_nums, perm=7))
        if cluster_topic:
            system.append(TopicConfig(cluster_name, 16, 16, perm=7))
        if broker_topic:
            system.append(TopicConfig(broker_name, 1, 1, perm=7))
        self.system_topics = frozenset(t.topic_name for t in system) | NOT_ALLOWED_SEND_TOPICS
        for cfg in system:
            self.topics.setdefault(cfg.topic_name, cfg)

    def _load(self) -> None:
        if self._path is None or not self._path.exists():
            return
        try:
            data = orjson.loads(self._path.read_bytes())
            for name, raw in data.get("topicConfigTable", {}).items():
                self.topics[name] = TopicConfig(**raw)
            self.data_version = data.get("dataVersion", self.data_version)
        except (OSError, ValueError, TypeError) as exc:
            log.error("topic config %s is unreadable (%s); starting from the system topics only", self._path, exc)

    def _persist_locked(self, *, defer_when_full: bool = False) -> None:
        """Bump the data version and write the table. ``defer_when_full``: a full disk only logs a warning, and the
        change, kept in memory, is written by the next change or :meth:`save_unsaved` (what automatic creation does:
        a heartbeat, pull or send must not fail on the topic table because the broker's disk is full)."""
        self.data_version = {"timestamp": self._clock.now_ms(), "counter": self.data_version["counter"] + 1}
        self._write_locked(defer_when_full)

    def _write_locked(self, defer_when_full: bool) -> None:
        self._file.write(
            lambda: {
                "topicConfigTable": {n: asdict(c) for n, c in self.topics.items()},
                "dataVersion": self.data_version,
            },
            defer_when_full=defer_when_full,
        )

    def save_unsaved(self) -> None:
        """Write the table again when a full disk deferred its last write."""
        with self._lock:
            if self._file.unsaved:
                self._write_locked(True)

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def is_system_topic(self, topic: str) -> bool:
        return topic in self.system_topics or topic.lower().startswith(SYSTEM_TOPIC_PREFIX)

    def upsert(self, config: TopicConfig, *, defer_when_full: bool = False) -> TopicConfig:
        """Set ``config``; when it cannot be written (and is not deferred), the table is left as it was and the
        error raised."""
        with self._lock:
            change_or_restore(
                self.topics, config.topic_name, config, lambda: self._persist_locked(defer_when_full=defer_when_full)
            )
        log.info(
            "topic %s set: %d/%d queues, perm %d",
            config.topic_name,
            config.read_queue_nums,
            config.write_queue_nums,
            config.perm,
        )
        return config

    def ensure(self, topic: str, queue_nums: int, perm: int = PERM_READ | PERM_WRITE) -> tuple[TopicConfig, bool]:
        """Create ``topic`` with ``queue_nums`` queues when missing; return it and whether it was created."""
        existing = self.topics.get(topic)
        if existing is not None:
            return existing, False
        return self.upsert(TopicConfig(topic, queue_nums, queue_nums, perm), defer_when_full=True), True

    def create_from_template(self, topic: str, template: str, requested_queues: int) -> TopicConfig | None:
        """Auto-create a topic the way a send does: from a template topic that has PERM_INHERIT."""
        existing = self.topics.get(topic)
        if existing is not None:
            return existing
        tpl = self.topics.get(template)
        if tpl is None or not tpl.perm & PERM_INHERIT:
            return None
        queues = max(1, min(requested_queues, tpl.write_queue_nums))
        return self.upsert(TopicConfig(topic, queues, queues, tpl.perm & ~PERM_INHERIT), defer_when_full=True)

    def delete(self, topic: str) -> bool:
        with self._lock:
            return change_or_restore(self.topics, topic, None, self._persist_locked) is not None

    def follow(self, wrapper: dict[str, Any]) -> bool:
        """A slave takes its master's topics (a GET_ALL_TOPIC_CONFIG answer) and data version; returns whether
        anything changed. Malformed entries are skipped."""
        table = wrapper.get("topicConfigTable")
        if not isinstance(table, dict):
            return False
        topics: dict[str, TopicConfig] = {}
        for name, raw in table.items():
            try:
                topics[name] = TopicConfig(
                    topic_name=str(raw.get("topicName", name)),
                    read_queue_nums=int(raw.get("readQueueNums", 16)),
                    write_queue_nums=int(raw.get("writeQueueNums", 16)),
                    perm=int(raw.get("perm", PERM_READ | PERM_WRITE)),
                    topic_filter_type=str(raw.get("topicFilterType", "SINGLE_TAG")),
                    topic_sys_flag=int(raw.get("topicSysFlag", 0)),
                    order=bool(raw.get("order", False)),
                )
            except (AttributeError, TypeError, ValueError):
                log.warning("master's topic %r is malformed; skipped", name)
        with self._lock:
            if topics == self.topics:
                return False
            self.topics = topics
            self._persist_locked(defer_when_full=True)
            version = wrapper.get("dataVersion")
            if isinstance(version, dict) and "counter" in version:
                self.data_version = dict(version)
        return True

    def wrapper(self) -> dict[str, Any]:
        """The TopicConfigSerializeWrapper the name server registration carries."""
        return {
            "topicConfigTable": {n: c.to_json() for n, c in self.topics.items()},
            "dataVersion": dict(self.data_version),
        }
