"""Typed request and response headers: the extFields of a remoting command, parsed Java-style (no IO).

Each header is a dataclass whose fields say their kind (``wire_text``, ``wire_int``, ``wire_bool``), their wire name
(the Python name unless given) and whether they are required. ``from_ext`` parses a dict of strings the way RocketMQ
does (ints and longs as Java's ``Long.parseLong``, booleans true only for "true" in any case, or "1") and names the
field that is missing or malformed; ``to_ext`` writes every value as a string, which is what C++ clients need.

One implementation of the parsing: the field readers below (``text_of``, ``int_of``, ``bool_of`` and their
``required_*`` forms). The headers every message goes through (SEND_MESSAGE / V2, END_TRANSACTION, PULL_MESSAGE) have
a ``from_ext`` written out field by field with those readers; every other header's ``from_ext`` runs the same
readers in a loop over its fields. This module is compiled by mypyc (setup.py), so it holds no class attributes
read through a class but ``Final`` module constants, and declares each field's kind rather than reading annotations
(a compiled class keeps none).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Self

from txmq._hotpath import reduce_by_fields
from txmq.errors import ProtocolError


class HeaderError(ProtocolError):
    """A request header that misses a required field or has one that does not parse."""


TEXT: Final = "text"
INT: Final = "int"
BOOL: Final = "bool"


def _field(kind: str, name: str | None, required: bool, default: Any) -> Any:
    return dataclasses.field(default=default, metadata={"wire": name, "kind": kind, "required": required})


def wire_text(name: str | None = None, *, required: bool = False, default: str | None = None) -> Any:
    """A text field (its wire name defaults to the Python name)."""
    return _field(TEXT, name, required, default)


def wire_int(name: str | None = None, *, required: bool = False, default: int | None = None) -> Any:
    """A number field (a Java int or long)."""
    return _field(INT, name, required, default)


def wire_bool(name: str | None = None, *, required: bool = False, default: bool | None = None) -> Any:
    """A boolean field."""
    return _field(BOOL, name, required, default)


def parse_bool(text: str) -> bool:
    """Java's ``Boolean.parseBoolean``; C++ also sends ``"1"`` for true in batch flags, which we accept too."""
    t = text.strip().lower()
    return t == "true" or t == "1"


_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def parse_int(text: str) -> int:
    """Java's ``Long.parseLong`` (surrounding blanks forgiven): ASCII digits with an optional sign, within 64 bits.
    Python's ``int`` alone would take "1_000", non-ASCII digits and numbers of any size, which then break whatever
    stores them (a consumer offset of 10**30 made every later write of the offsets file fail)."""
    if len(text) <= 18 and text.isdigit() and text.isascii():
        return int(text)  # what every client sends: plain digits, fewer than 19 of them, so within 64 bits
    t = text.strip()
    if not t.isascii() or not t.lstrip("+-").isdigit() or t.count("-") + t.count("+") > 1:
        raise ValueError(f"not a decimal integer: {text!r:.40}")
    value = int(t)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{t:.40} is outside the 64-bit range")
    return value


# -- the field readers: every header's parsing goes through these ----------------------------------------------------
# ``ext`` is the command's extFields; ``key`` the name read from it; ``who`` the header class's name and ``name`` the
# field's wire name, both for the error (SEND_MESSAGE_V2 reads one-letter keys and names the long field).


def _missing(who: str, name: str) -> HeaderError:
    return HeaderError(f"{who}: the required field '{name}' is missing")


def _invalid(who: str, name: str, raw: object) -> HeaderError:
    return HeaderError(f"{who}: field '{name}' has an invalid value {raw!r}")


def text_of(ext: dict[str, str], key: str, default: str | None) -> str | None:
    raw = ext.get(key)
    return default if raw is None else raw


def text_or(ext: dict[str, str], key: str, default: str) -> str:
    raw = ext.get(key)
    return default if raw is None else raw


def required_text(ext: dict[str, str], key: str, who: str, name: str) -> str:
    raw = ext.get(key)
    if raw is None:
        raise _missing(who, name)
    return raw


def _int(raw: str, who: str, name: str) -> int:
    try:
        return parse_int(raw)
    except (ValueError, TypeError, AttributeError) as exc:
        raise _invalid(who, name, raw) from exc


def _bool(raw: str, who: str, name: str) -> bool:
    try:
        return parse_bool(raw)
    except (ValueError, TypeError, AttributeError) as exc:
        raise _invalid(who, name, raw) from exc


# One reader per kind and presence (optional with None, optional with a default, required), each typed exactly, so
# that compiled callers get unboxed ints and bools where the field cannot be None.


def int_of(ext: dict[str, str], key: str, default: int | None, who: str, name: str) -> int | None:
    raw = ext.get(key)
    return default if raw is None else _int(raw, who, name)


def int_or(ext: dict[str, str], key: str, default: int, who: str, name: str) -> int:
    raw = ext.get(key)
    return default if raw is None else _int(raw, who, name)


def required_int(ext: dict[str, str], key: str, who: str, name: str) -> int:
    raw = ext.get(key)
    if raw is None:
        raise _missing(who, name)
    return _int(raw, who, name)


def bool_of(ext: dict[str, str], key: str, default: bool | None, who: str, name: str) -> bool | None:
    raw = ext.get(key)
    return default if raw is None else _bool(raw, who, name)


def bool_or(ext: dict[str, str], key: str, default: bool, who: str, name: str) -> bool:
    raw = ext.get(key)
    return default if raw is None else _bool(raw, who, name)


def required_bool(ext: dict[str, str], key: str, who: str, name: str) -> bool:
    raw = ext.get(key)
    if raw is None:
        raise _missing(who, name)
    return _bool(raw, who, name)


def _text_field(ext: dict[str, str], key: str, default: Any, who: str, name: str) -> str | None:
    return text_of(ext, key, default)


_OPTIONAL: Final[dict[str, Callable[[dict[str, str], str, Any, str, str], Any]]] = {
    TEXT: _text_field,
    INT: int_of,
    BOOL: bool_of,
}
_REQUIRED: Final[dict[str, Callable[[dict[str, str], str, str, str], Any]]] = {
    TEXT: required_text,
    INT: required_int,
    BOOL: required_bool,
}

# (Python name, wire name, kind, required, default) per field of a header class, built once per class.
Spec = tuple[tuple[str, str, str, bool, Any], ...]
_SPECS: Final[dict[type, Spec]] = {}


def spec_of(cls: type) -> Spec:
    spec = _SPECS.get(cls)
    if spec is None:
        spec = tuple(
            (f.name, f.metadata.get("wire") or f.name, f.metadata["kind"], bool(f.metadata["required"]), f.default)
            for f in dataclasses.fields(cls)
        )
        _SPECS[cls] = spec
    return spec


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Header:
    """Base of every typed header (dataclasses)."""

    @classmethod
    def from_ext(cls, ext: dict[str, str] | None) -> Self:
        return cls.parse_fields(ext or {})

    @classmethod
    def parse_fields(cls, ext: dict[str, str]) -> Self:
        """Each field read from ``ext`` by its wire name, with the field readers."""
        who = cls.__name__
        values: dict[str, Any] = {}
        for name, wire_name, kind, required, default in spec_of(cls):
            if required:
                values[name] = _REQUIRED[kind](ext, wire_name, who, wire_name)
            else:
                values[name] = _OPTIONAL[kind](ext, wire_name, default, who, wire_name)
        return cls(**values)

    def to_ext(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, wire_name, _kind, _required, _default in spec_of(type(self)):
            value = getattr(self, name)
            if value is not None:
                out[wire_name] = value if type(value) is str else _format(value)
        return out


# ---------------------------------------------------------------------------------------------------------------
# Send


@dataclass(init=False)
class SendMessageRequestHeader(Header):
    """SEND_MESSAGE (10, long names) and SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (310 / 320, one-letter names)."""

    producerGroup: str = wire_text(required=True)
    topic: str = wire_text(required=True)
    defaultTopic: str = wire_text(default="TBW102")
    defaultTopicQueueNums: int = wire_int(default=4)
    queueId: int = wire_int(default=-1)
    sysFlag: int = wire_int(default=0)
    bornTimestamp: int = wire_int(default=0)
    flag: int = wire_int(default=0)
    properties: str | None = wire_text()
    reconsumeTimes: int | None = wire_int()
    unitMode: bool | None = wire_bool()
    maxReconsumeTimes: int | None = wire_int()
    batch: bool | None = wire_bool()

    # The headers of every message have their __init__ written out: mypyc compiles it, while a dataclass's generated
    # __init__ runs interpreted. tests/protocol/test_constructors.py holds each to its fields.
    def __init__(
        self,
        producerGroup: str,
        topic: str,
        defaultTopic: str = "TBW102",
        defaultTopicQueueNums: int = 4,
        queueId: int = -1,
        sysFlag: int = 0,
        bornTimestamp: int = 0,
        flag: int = 0,
        properties: str | None = None,
        reconsumeTimes: int | None = None,
        unitMode: bool | None = None,
        maxReconsumeTimes: int | None = None,
        batch: bool | None = None,
    ) -> None:
        self.producerGroup = producerGroup
        self.topic = topic
        self.defaultTopic = defaultTopic
        self.defaultTopicQueueNums = defaultTopicQueueNums
        self.queueId = queueId
        self.sysFlag = sysFlag
        self.bornTimestamp = bornTimestamp
        self.flag = flag
        self.properties = properties
        self.reconsumeTimes = reconsumeTimes
        self.unitMode = unitMode
        self.maxReconsumeTimes = maxReconsumeTimes
        self.batch = batch

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return reduce_by_fields(self)  # copy and pickle (the written-out __init__ needs its arguments)

    @classmethod
    def from_ext(cls, ext: dict[str, str] | None) -> Self:
        """Either naming: V2's letters when ``a`` or ``b`` is present (then only letters are read), else V1's long
        names."""
        ext = ext or {}
        if "a" in ext or "b" in ext:
            return cls.read(ext, SEND_V2_KEYS)
        return cls.read(ext, SEND_V1_KEYS)

    @classmethod
    def read(cls, ext: dict[str, str], k: tuple[str, ...]) -> Self:
        """Every producer request comes through here: the fields one by one, read at the keys ``k`` (V1's or
        V2's), errors naming the long field names."""
        n = SEND_V1_KEYS
        who = "SendMessageRequestHeader"
        return cls(
            required_text(ext, k[0], who, n[0]),
            required_text(ext, k[1], who, n[1]),
            text_or(ext, k[2], "TBW102"),
            int_or(ext, k[3], 4, who, n[3]),
            int_or(ext, k[4], -1, who, n[4]),
            int_or(ext, k[5], 0, who, n[5]),
            int_or(ext, k[6], 0, who, n[6]),
            int_or(ext, k[7], 0, who, n[7]),
            text_of(ext, k[8], None),
            int_of(ext, k[9], None, who, n[9]),
            bool_of(ext, k[10], None, who, n[10]),
            int_of(ext, k[11], None, who, n[11]),
            bool_of(ext, k[12], None, who, n[12]),
        )

    def to_v2_ext(self) -> dict[str, str]:
        return {SEND_V2_LETTERS.get(k, k): v for k, v in self.to_ext().items()}


# SendMessageRequestHeaderV2's one-letter names, in the order of SendMessageRequestHeader's fields.
SEND_V1_KEYS: Final = (
    "producerGroup",
    "topic",
    "defaultTopic",
    "defaultTopicQueueNums",
    "queueId",
    "sysFlag",
    "bornTimestamp",
    "flag",
    "properties",
    "reconsumeTimes",
    "unitMode",
    "maxReconsumeTimes",
    "batch",
)
SEND_V2_KEYS: Final = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m")
SEND_V2_LETTERS: Final = dict(zip(SEND_V1_KEYS, SEND_V2_KEYS, strict=True))


@dataclass
class SendMessageResponseHeader(Header):
    msgId: str = wire_text(required=True)
    queueId: int = wire_int(required=True)
    queueOffset: int = wire_int(required=True)
    transactionId: str | None = wire_text()
    MSG_REGION: str | None = wire_text()
    TRACE_ON: str | None = wire_text()


# ---------------------------------------------------------------------------------------------------------------
# Consume


@dataclass(init=False)
class PullMessageRequestHeader(Header):
    consumerGroup: str = wire_text(required=True)
    topic: str = wire_text(required=True)
    queueId: int = wire_int(required=True)
    queueOffset: int = wire_int(required=True)
    maxMsgNums: int = wire_int(required=True)
    sysFlag: int = wire_int(required=True)
    commitOffset: int = wire_int(required=True)
    suspendTimeoutMillis: int = wire_int(required=True)
    subscription: str | None = wire_text()
    subVersion: int = wire_int(default=0)
    expressionType: str | None = wire_text()

    def __init__(
        self,
        consumerGroup: str,
        topic: str,
        queueId: int,
        queueOffset: int,
        maxMsgNums: int,
        sysFlag: int,
        commitOffset: int,
        suspendTimeoutMillis: int,
        subscription: str | None = None,
        subVersion: int = 0,
        expressionType: str | None = None,
    ) -> None:
        self.consumerGroup = consumerGroup
        self.topic = topic
        self.queueId = queueId
        self.queueOffset = queueOffset
        self.maxMsgNums = maxMsgNums
        self.sysFlag = sysFlag
        self.commitOffset = commitOffset
        self.suspendTimeoutMillis = suspendTimeoutMillis
        self.subscription = subscription
        self.subVersion = subVersion
        self.expressionType = expressionType

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return reduce_by_fields(self)  # copy and pickle (the written-out __init__ needs its arguments)

    @classmethod
    def from_ext(cls, ext: dict[str, str] | None) -> Self:
        """One per pull: the fields one by one."""
        ext = ext or {}
        who = "PullMessageRequestHeader"
        return cls(
            required_text(ext, "consumerGroup", who, "consumerGroup"),
            required_text(ext, "topic", who, "topic"),
            required_int(ext, "queueId", who, "queueId"),
            required_int(ext, "queueOffset", who, "queueOffset"),
            required_int(ext, "maxMsgNums", who, "maxMsgNums"),
            required_int(ext, "sysFlag", who, "sysFlag"),
            required_int(ext, "commitOffset", who, "commitOffset"),
            required_int(ext, "suspendTimeoutMillis", who, "suspendTimeoutMillis"),
            text_of(ext, "subscription", None),
            int_or(ext, "subVersion", 0, who, "subVersion"),
            text_of(ext, "expressionType", None),
        )


@dataclass
class PullMessageResponseHeader(Header):
    suggestWhichBrokerId: int = wire_int(required=True)
    nextBeginOffset: int = wire_int(required=True)
    minOffset: int = wire_int(required=True)
    maxOffset: int = wire_int(required=True)


@dataclass
class QueryConsumerOffsetRequestHeader(Header):
    consumerGroup: str = wire_text(required=True)
    topic: str = wire_text(required=True)
    queueId: int = wire_int(required=True)


@dataclass
class UpdateConsumerOffsetRequestHeader(Header):
    consumerGroup: str = wire_text(required=True)
    topic: str = wire_text(required=True)
    queueId: int = wire_int(required=True)
    commitOffset: int = wire_int(required=True)


@dataclass
class QueueHeader(Header):
    """GET_MAX_OFFSET, GET_MIN_OFFSET and GET_EARLIEST_MSG_STORETIME."""

    topic: str = wire_text(required=True)
    queueId: int = wire_int(required=True)


@dataclass
class SearchOffsetRequestHeader(Header):
    topic: str = wire_text(required=True)
    queueId: int = wire_int(required=True)
    timestamp: int = wire_int(required=True)


@dataclass
class OffsetResponseHeader(Header):
    offset: int = wire_int(required=True)


@dataclass
class ConsumerSendMsgBackRequestHeader(Header):
    offset: int = wire_int(required=True)
    group: str = wire_text(required=True)
    delayLevel: int = wire_int(required=True)
    originMsgId: str | None = wire_text()
    originTopic: str | None = wire_text()
    unitMode: bool = wire_bool(default=False)
    maxReconsumeTimes: int | None = wire_int()


@dataclass
class ConsumerGroupHeader(Header):
    """GET_CONSUMER_LIST_BY_GROUP and NOTIFY_CONSUMER_IDS_CHANGED."""

    consumerGroup: str = wire_text(required=True)


@dataclass
class UnregisterClientRequestHeader(Header):
    clientID: str = wire_text(required=True)
    producerGroup: str | None = wire_text()
    consumerGroup: str | None = wire_text()


# ---------------------------------------------------------------------------------------------------------------
# Queries and admin


@dataclass
class QueryMessageRequestHeader(Header):
    topic: str = wire_text(required=True)
    key: str = wire_text(required=True)
    maxNum: int = wire_int(required=True)
    beginTimestamp: int = wire_int(required=True)
    endTimestamp: int = wire_int(required=True)


@dataclass
class ViewMessageRequestHeader(Header):
    offset: int = wire_int(required=True)


@dataclass
class CreateTopicRequestHeader(Header):
    topic: str = wire_text(required=True)
    defaultTopic: str = wire_text(default="TBW102")
    readQueueNums: int = wire_int(required=True)
    writeQueueNums: int = wire_int(required=True)
    perm: int = wire_int(required=True)
    topicFilterType: str = wire_text(default="SINGLE_TAG")
    topicSysFlag: int | None = wire_int()
    order: bool = wire_bool(default=False)


@dataclass
class TopicHeader(Header):
    """GET_TOPIC_STATS_INFO, GET_ROUTEINFO_BY_TOPIC, DELETE_TOPIC_*."""

    topic: str = wire_text(required=True)


@dataclass
class GetConsumeStatsRequestHeader(Header):
    consumerGroup: str = wire_text(required=True)
    topic: str | None = wire_text()


# ---------------------------------------------------------------------------------------------------------------
# Transactions


@dataclass
class EndTransactionRequestHeader(Header):
    producerGroup: str = wire_text(required=True)
    tranStateTableOffset: int = wire_int(required=True)  # queue offset of the half message in the half topic
    commitLogOffset: int = wire_int(required=True)
    commitOrRollback: int = wire_int(required=True)  # 0 unknown, 8 commit, 12 rollback
    fromTransactionCheck: bool = wire_bool(default=False)
    msgId: str = wire_text(required=True)
    transactionId: str | None = wire_text()
    txmqMessages: int | None = wire_int()  # txmq: how many messages the transaction holds (several in one)

    @classmethod
    def from_ext(cls, ext: dict[str, str] | None) -> Self:
        return cls(*end_transaction_fields(ext or {}))


EndTransactionFields = tuple[str, int, int, int, bool, str, str | None, int | None]


def end_transaction_fields(ext: dict[str, str]) -> EndTransactionFields:
    """END_TRANSACTION's fields one by one, in :class:`EndTransactionRequestHeader`'s order: the broker reads one
    per transaction straight into its decision, without the header object."""
    who = "EndTransactionRequestHeader"
    return (
        required_text(ext, "producerGroup", who, "producerGroup"),
        required_int(ext, "tranStateTableOffset", who, "tranStateTableOffset"),
        required_int(ext, "commitLogOffset", who, "commitLogOffset"),
        required_int(ext, "commitOrRollback", who, "commitOrRollback"),
        bool_or(ext, "fromTransactionCheck", False, who, "fromTransactionCheck"),
        required_text(ext, "msgId", who, "msgId"),
        text_of(ext, "transactionId", None),
        int_of(ext, "txmqMessages", None, who, "txmqMessages"),
    )


@dataclass
class CheckTransactionStateRequestHeader(Header):
    tranStateTableOffset: int = wire_int(required=True)
    commitLogOffset: int = wire_int(required=True)
    msgId: str | None = wire_text()
    transactionId: str | None = wire_text()
    offsetMsgId: str | None = wire_text()


# ---------------------------------------------------------------------------------------------------------------
# Name server


@dataclass
class RegisterBrokerRequestHeader(Header):
    brokerName: str = wire_text(required=True)
    brokerAddr: str = wire_text(required=True)
    clusterName: str = wire_text(required=True)
    haServerAddr: str = wire_text(default="")
    brokerId: int = wire_int(required=True)
    compressed: bool = wire_bool(default=False)
    bodyCrc32: int = wire_int(default=0)


@dataclass
class UnregisterBrokerRequestHeader(Header):
    brokerName: str = wire_text(required=True)
    brokerAddr: str = wire_text(required=True)
    clusterName: str = wire_text(required=True)
    brokerId: int = wire_int(required=True)


@dataclass
class KVConfigRequestHeader(Header):
    namespace: str = wire_text(required=True)
    key: str = wire_text(required=True)
    value: str | None = wire_text()
