"""Client-side message model: :class:`Message`, :class:`MessageExt`, :class:`MessageQueue`, send and pull results.

A message's properties map is the single source of truth, as in RocketMQ: ``tags``, ``keys`` and ``delay_level``
are views over the ``TAGS``, ``KEYS`` and ``DELAY`` properties, so what the broker stores is what the object shows.
"""

from __future__ import annotations

import enum
import logging
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from txmq.protocol.record import MessageRecord, Prop, SysFlag
from txmq.protocol.record.properties import SYSTEM_PROPERTIES
from txmq.protocol.topics import AUTO_CREATE_TOPIC_KEY, RETRY_GROUP_TOPIC_PREFIX, retry_topic  # noqa: F401

log = logging.getLogger("txmq.client")

DEFAULT_TOPIC = AUTO_CREATE_TOPIC_KEY  # the broker's auto-create template topic

# Compression type bits of sysFlag (mask 0x700); type 0 with COMPRESSED set is zlib (older Java, C++).
_COMPRESSION_TYPE_MASK = 0x700
_COMPRESSION_ZLIB = 0x300

# Properties the client sets itself (protocol.record): put_user_property refuses them.


class MessageQueue(NamedTuple):
    """One queue of a topic on one broker. Tuple order (topic, broker, queue id) is RocketMQ's sort order."""

    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MessageQueue:
        return cls(str(data["topic"]), str(data["brokerName"]), int(data["queueId"]))

    def __str__(self) -> str:
        return f"MessageQueue[topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


class Message:
    """A message to send: topic, body, and properties (tags, keys, delay level and user properties among them)."""

    __slots__ = ("body", "flag", "properties", "topic")

    def __init__(
        self,
        topic: str,
        body: bytes | bytearray | memoryview | str = b"",
        tags: str | None = None,
        keys: str | Iterable[str] | None = None,
        *,
        properties: Mapping[str, str] | None = None,
        delay_level: int = 0,
        flag: int = 0,
        wait_store_msg_ok: bool = True,
    ) -> None:
        self.topic = topic
        self.body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        self.flag = flag
        self.properties: dict[str, str] = {}
        if properties:
            self.properties.update({str(k): str(v) for k, v in properties.items()})
        if tags:
            self.tags = tags
        if keys:
            self.keys = keys  # type: ignore[assignment]
        if delay_level:
            self.delay_level = delay_level
        # Java's Message constructor writes WAIT=true; keep it so brokers that look at it see the same thing.
        if Prop.WAIT not in self.properties:
            self.properties[Prop.WAIT] = "true" if wait_store_msg_ok else "false"

    # -- property views --------------------------------------------------------------------------------------

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @tags.setter
    def tags(self, value: str | None) -> None:
        self._set(Prop.TAGS, value)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(Prop.KEYS, "").split(" ") if k]

    @keys.setter
    def keys(self, value: str | Iterable[str] | None) -> None:
        if value is None:
            self.properties.pop(Prop.KEYS, None)
        elif isinstance(value, str):
            self._set(Prop.KEYS, value)
        else:
            self._set(Prop.KEYS, " ".join(str(k) for k in value))

    @property
    def delay_level(self) -> int:
        try:
            return int(self.properties.get(Prop.DELAY, "0"))
        except ValueError:
            return 0

    @delay_level.setter
    def delay_level(self, level: int) -> None:
        self._set(Prop.DELAY, str(int(level)) if level else None)

    @property
    def wait_store_msg_ok(self) -> bool:
        return self.properties.get(Prop.WAIT, "true").lower() != "false"

    @property
    def transaction_id(self) -> str | None:
        return self.properties.get(Prop.TRANSACTION_ID)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(Prop.UNIQ_KEY)

    def get_property(self, key: str, default: str | None = None) -> str | None:
        return self.properties.get(key, default)

    def put_user_property(self, key: str, value: str) -> None:
        """Set a user property. System property names (``TAGS``, ``UNIQ_KEY``, ...) are refused."""
        if key in SYSTEM_PROPERTIES:
            raise ValueError(f"the property name {key!r} is reserved by the system; choose another name")
        if not key or value is None or value == "":
            raise ValueError("user property key and value must be non-empty")
        self.properties[key] = str(value)

    @property
    def user_properties(self) -> dict[str, str]:
        """Properties that are not system ones."""
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTIES}

    def _set(self, key: str, value: str | None) -> None:
        if value is None or value == "":
            self.properties.pop(key, None)
        else:
            self.properties[key] = value

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in _all_slots(type(self)))

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 64 else self.body[:64] + b"..."
        return f"{type(self).__name__}(topic={self.topic!r}, tags={self.tags!r}, keys={self.keys!r}, body={body!r})"


def _all_slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        names.extend(getattr(klass, "__slots__", ()))
    return names


class MessageExt(Message):
    """A stored message as a consumer or a query sees it: the :class:`Message` plus where and when it was stored.

    ``msg_id`` is the client-generated ``UNIQ_KEY`` (falling back to ``offset_msg_id`` for messages sent without
    one), which is what RocketMQ clients show as the message id.
    """

    __slots__ = (
        "body_crc",
        "born_host",
        "born_timestamp",
        "broker_name",
        "commit_log_offset",
        "offset_msg_id",
        "prepared_transaction_offset",
        "queue_id",
        "queue_offset",
        "reconsume_times",
        "store_host",
        "store_size",
        "store_timestamp",
        "sys_flag",
    )

    def __init__(self, topic: str, body: bytes = b"", **kwargs: Any) -> None:
        # Not Message.__init__: a stored message keeps exactly the properties it was stored with (no WAIT added).
        self.topic = topic
        self.body = bytes(body)
        self.flag: int = kwargs.pop("flag", 0)
        self.properties = dict(kwargs.pop("properties", None) or {})
        self.queue_id: int = kwargs.pop("queue_id", 0)
        self.queue_offset: int = kwargs.pop("queue_offset", 0)
        self.commit_log_offset: int = kwargs.pop("commit_log_offset", 0)
        self.sys_flag: int = kwargs.pop("sys_flag", 0)
        self.born_timestamp: int = kwargs.pop("born_timestamp", 0)
        self.born_host: tuple[str, int] = kwargs.pop("born_host", ("", 0))
        self.store_timestamp: int = kwargs.pop("store_timestamp", 0)
        self.store_host: tuple[str, int] = kwargs.pop("store_host", ("", 0))
        self.reconsume_times: int = kwargs.pop("reconsume_times", 0)
        self.prepared_transaction_offset: int = kwargs.pop("prepared_transaction_offset", 0)
        self.body_crc: int = kwargs.pop("body_crc", 0)
        self.store_size: int = kwargs.pop("store_size", 0)
        self.offset_msg_id: str = kwargs.pop("offset_msg_id", "")
        self.broker_name: str | None = kwargs.pop("broker_name", None)
        if kwargs:
            raise TypeError(f"unexpected MessageExt fields: {sorted(kwargs)}")

    @classmethod
    def from_record(cls, record: MessageRecord, broker_name: str | None = None) -> MessageExt:
        """Build from a decoded commit-log record; a compressed body is decompressed."""
        body = record.body
        if record.sys_flag & SysFlag.COMPRESSED:
            body = decompress_body(body, record.sys_flag)
        ext = cls.__new__(cls)
        ext.topic = record.topic
        ext.body = body
        ext.flag = record.flag
        ext.properties = dict(record.properties)
        ext.queue_id = record.queue_id
        ext.queue_offset = record.queue_offset
        ext.commit_log_offset = record.physical_offset
        ext.sys_flag = record.sys_flag
        ext.born_timestamp = record.born_timestamp
        ext.born_host = record.born_host
        ext.store_timestamp = record.store_timestamp
        ext.store_host = record.store_host
        ext.reconsume_times = record.reconsume_times
        ext.prepared_transaction_offset = record.prepared_transaction_offset
        ext.body_crc = record.body_crc or 0
        ext.store_size = record.store_size
        ext.offset_msg_id = record.offset_msg_id
        ext.broker_name = broker_name
        return ext

    @property
    def msg_id(self) -> str:
        return self.properties.get(Prop.UNIQ_KEY) or self.offset_msg_id

    @property
    def queue(self) -> MessageQueue | None:
        """The queue this message was read from, when the broker name is known."""
        if self.broker_name is None:
            return None
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    def __repr__(self) -> str:
        return (
            f"MessageExt(topic={self.topic!r}, msg_id={self.msg_id!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, tags={self.tags!r}, keys={self.keys!r}, "
            f"reconsume_times={self.reconsume_times}, body={self.body[:64]!r})"
        )


def compress_body(body: bytes, level: int = 5) -> bytes:
    return zlib.compress(body, level)


def decompress_body(body: bytes, sys_flag: int) -> bytes:
    """Undo the producer's compression. zlib is built in; LZ4/ZSTD bodies are returned as stored, with a warning."""
    kind = sys_flag & _COMPRESSION_TYPE_MASK
    if kind in (0, _COMPRESSION_ZLIB):
        try:
            return zlib.decompress(body)
        except zlib.error as exc:
            log.warning("message body is flagged compressed but is not zlib data (%s); delivering it as stored", exc)
            return body
    log.warning("message body uses compression type 0x%x, which txmq cannot decompress; delivering it as stored", kind)
    return body


# ---------------------------------------------------------------------------------------------------------------
# Results and enums


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


# Response codes a send treats as "stored" (wire §2.3), with the status each maps to.
SEND_STATUS_BY_CODE: dict[int, SendStatus] = {
    0: SendStatus.SEND_OK,
    10: SendStatus.FLUSH_DISK_TIMEOUT,
    11: SendStatus.SLAVE_NOT_AVAILABLE,
    12: SendStatus.FLUSH_SLAVE_TIMEOUT,
}


@dataclass(slots=True)
class SendResult:
    """What a successful send returns. ``msg_id`` is the UNIQ_KEY; ``offset_msg_id`` is the broker's id."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    region_id: str | None = None
    trace_on: bool = True


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


PULL_STATUS_BY_CODE: dict[int, PullStatus] = {
    0: PullStatus.FOUND,
    19: PullStatus.NO_NEW_MSG,
    20: PullStatus.NO_MATCHED_MSG,
    21: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = 0


class ConsumeStatus(enum.Enum):
    """What a concurrent listener returns."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    """What an orderly listener returns."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class MessageModel(enum.Enum):
    BROADCASTING = "BROADCASTING"
    CLUSTERING = "CLUSTERING"


class ConsumeFromWhere(enum.Enum):
    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"

    # Short aliases, so callers can write ConsumeFromWhere.LAST_OFFSET as the issue does.
    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class ConsumeType(enum.Enum):
    CONSUME_ACTIVELY = "CONSUME_ACTIVELY"  # pull
    CONSUME_PASSIVELY = "CONSUME_PASSIVELY"  # push
