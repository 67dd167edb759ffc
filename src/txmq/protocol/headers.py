"""Typed request and response headers: the extFields of a remoting command, parsed Java-style (no IO).

Each header is a dataclass whose fields carry their wire name. ``from_ext`` parses a dict of strings the way RocketMQ
does (ints and longs in decimal, booleans true only for "true" in any case) and names the field that is missing or
malformed; ``to_ext`` writes every value as a string, which is what C++ clients need.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Self, get_type_hints

from txmq.errors import ProtocolError


class HeaderError(ProtocolError):
    """A request header that misses a required field or has one that does not parse."""


def wire(name: str | None = None, *, required: bool = False, default: Any = None) -> Any:
    """Declare a header field with its wire name (defaults to the Python name) and whether it is required."""
    return dataclasses.field(default=default, metadata={"wire": name, "required": required})


def parse_bool(text: str) -> bool:
    """Java's ``Boolean.parseBoolean``; C++ also sends ``"1"`` for true in batch flags, which we accept too."""
    t = text.strip().lower()
    return t == "true" or t == "1"


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _parse_int(text: str) -> int:
    """Java's ``Long.parseLong`` (surrounding blanks forgiven): ASCII digits with an optional sign, within 64 bits.
    Python's ``int`` alone would take "1_000", non-ASCII digits and numbers of any size, which then break whatever
    stores them (a consumer offset of 10**30 made every later write of the offsets file fail)."""
    t = text.strip()
    if not t.isascii() or not t.lstrip("+-").isdigit() or t.count("-") + t.count("+") > 1:
        raise ValueError(f"not a decimal integer: {text!r:.40}")
    value = int(t)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{t:.40} is outside the 64-bit range")
    return value


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_PARSERS: dict[Any, Callable[[str], Any]] = {int: _parse_int, bool: parse_bool, str: str}


class Header:
    """Base of every typed header; subclasses are slotted dataclasses."""

    __slots__ = ()

    @classmethod
    def _build_spec(cls) -> tuple[tuple[str, str, Callable[[str], Any], bool], ...]:
        hints = get_type_hints(cls)
        spec = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            hint = hints[f.name]
            base = next((t for t in (bool, int, str) if hint is t or t in getattr(hint, "__args__", ())), str)
            spec.append((f.name, f.metadata.get("wire") or f.name, _PARSERS[base], f.metadata.get("required", False)))
        return tuple(spec)

    @classmethod
    def from_ext(cls, ext: dict[str, str] | None) -> Self:
        return cls._parse(ext)

    @classmethod
    def _spec(cls) -> tuple[tuple[str, str, Callable[[str], Any], bool], ...]:
        """(name, wire name, parser, required) per field, built once per class."""
        spec = cls.__dict__.get("_spec_cache")
        if spec is None:
            spec = cls._build_spec()
            cls._spec_cache = spec  # type: ignore[attr-defined]
        return spec

    @classmethod
    def _parse(cls, ext: dict[str, str] | None) -> Self:
        spec = cls._spec()
        ext = ext or {}
        values: dict[str, Any] = {}
        for name, wire_name, parse, required in spec:
            raw = ext.get(wire_name)
            if raw is None:
                if required:
                    raise HeaderError(f"{cls.__name__}: the required field '{wire_name}' is missing")
                continue
            try:
                values[name] = parse(raw)
            except (ValueError, TypeError) as exc:
                raise HeaderError(f"{cls.__name__}: field '{wire_name}' has an invalid value {raw!r}") from exc
        return cls(**values)

    def to_ext(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, wire_name, _parse, _required in self._spec():
            value = getattr(self, name)
            if value is not None:
                out[wire_name] = value if type(value) is str else _format(value)
        return out


def header(cls: type) -> type:
    return dataclasses.dataclass(slots=True)(cls)


# ---------------------------------------------------------------------------------------------------------------
# Send


@header
class SendMessageRequestHeader(Header):
    """SEND_MESSAGE (10, long names) and SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (310 / 320, one-letter names)."""

    producerGroup: str = wire(required=True)
    topic: str = wire(required=True)
    defaultTopic: str = wire(default="TBW102")
    defaultTopicQueueNums: int = wire(default=4)
    queueId: int = wire(default=-1)
    sysFlag: int = wire(default=0)
    bornTimestamp: int = wire(default=0)
    flag: int = wire(default=0)
    properties: str | None = wire()
    reconsumeTimes: int | None = wire()
    unitMode: bool | None = wire()
    maxReconsumeTimes: int | None = wire()
    batch: bool | None = wire()

    V2_NAMES: ClassVar[dict[str, str]] = {
        "a": "producerGroup",
        "b": "topic",
        "c": "defaultTopic",
        "d": "defaultTopicQueueNums",
        "e": "queueId",
        "f": "sysFlag",
        "g": "bornTimestamp",
        "h": "flag",
        "i": "properties",
        "j": "reconsumeTimes",
        "k": "unitMode",
        "l": "maxReconsumeTimes",
        "m": "batch",
    }

    @classmethod
    def from_ext(cls, ext: dict[str, str] | None) -> Self:
        """Accept either naming: V2's letters when ``a`` or ``b`` is present, else V1's long names."""
        ext = ext or {}
        if "b" in ext or "a" in ext:
            if "a" in ext and "b" in ext:
                try:
                    return cls._fast_v2(ext)
                except (ValueError, TypeError, AttributeError):
                    pass  # the generic path below names the bad field
            ext = {cls.V2_NAMES.get(k, k): v for k, v in ext.items()}
        return cls._parse(ext)

    @classmethod
    def _fast_v2(cls, e: dict[str, str]) -> Self:
        """The send hot path: every producer request goes through here, so no per-field loop."""
        get = e.get
        j, k, l_, m = get("j"), get("k"), get("l"), get("m")
        return cls(
            e["a"],
            e["b"],
            get("c", "TBW102"),
            int(get("d", "4")),
            int(get("e", "-1")),
            int(get("f", "0")),
            int(get("g", "0")),
            int(get("h", "0")),
            get("i"),
            None if j is None else int(j),
            None if k is None else parse_bool(k),
            None if l_ is None else int(l_),
            None if m is None else parse_bool(m),
        )

    def to_v2_ext(self) -> dict[str, str]:
        long_to_short = {v: k for k, v in self.V2_NAMES.items()}
        return {long_to_short.get(k, k): v for k, v in self.to_ext().items()}


@header
class SendMessageResponseHeader(Header):
    msgId: str = wire(required=True)
    queueId: int = wire(required=True)
    queueOffset: int = wire(required=True)
    transactionId: str | None = wire()
    MSG_REGION: str | None = wire()
    TRACE_ON: str | None = wire()


# ---------------------------------------------------------------------------------------------------------------
# Consume


@header
class PullMessageRequestHeader(Header):
    consumerGroup: str = wire(required=True)
    topic: str = wire(required=True)
    queueId: int = wire(required=True)
    queueOffset: int = wire(required=True)
    maxMsgNums: int = wire(required=True)
    sysFlag: int = wire(required=True)
    commitOffset: int = wire(required=True)
    suspendTimeoutMillis: int = wire(required=True)
    subscription: str | None = wire()
    subVersion: int = wire(default=0)
    expressionType: str | None = wire()


@header
class PullMessageResponseHeader(Header):
    suggestWhichBrokerId: int = wire(required=True)
    nextBeginOffset: int = wire(required=True)
    minOffset: int = wire(required=True)
    maxOffset: int = wire(required=True)


@header
class QueryConsumerOffsetRequestHeader(Header):
    consumerGroup: str = wire(required=True)
    topic: str = wire(required=True)
    queueId: int = wire(required=True)


@header
class UpdateConsumerOffsetRequestHeader(Header):
    consumerGroup: str = wire(required=True)
    topic: str = wire(required=True)
    queueId: int = wire(required=True)
    commitOffset: int = wire(required=True)


@header
class QueueHeader(Header):
    """GET_MAX_OFFSET, GET_MIN_OFFSET and GET_EARLIEST_MSG_STORETIME."""

    topic: str = wire(required=True)
    queueId: int = wire(required=True)


@header
class SearchOffsetRequestHeader(Header):
    topic: str = wire(required=True)
    queueId: int = wire(required=True)
    timestamp: int = wire(required=True)


@header
class OffsetResponseHeader(Header):
    offset: int = wire(required=True)


@header
class ConsumerSendMsgBackRequestHeader(Header):
    offset: int = wire(required=True)
    group: str = wire(required=True)
    delayLevel: int = wire(required=True)
    originMsgId: str | None = wire()
    originTopic: str | None = wire()
    unitMode: bool = wire(default=False)
    maxReconsumeTimes: int | None = wire()


@header
class ConsumerGroupHeader(Header):
    """GET_CONSUMER_LIST_BY_GROUP and NOTIFY_CONSUMER_IDS_CHANGED."""

    consumerGroup: str = wire(required=True)


@header
class UnregisterClientRequestHeader(Header):
    clientID: str = wire(required=True)
    producerGroup: str | None = wire()
    consumerGroup: str | None = wire()


# ---------------------------------------------------------------------------------------------------------------
# Queries and admin


@header
class QueryMessageRequestHeader(Header):
    topic: str = wire(required=True)
    key: str = wire(required=True)
    maxNum: int = wire(required=True)
    beginTimestamp: int = wire(required=True)
    endTimestamp: int = wire(required=True)


@header
class ViewMessageRequestHeader(Header):
    offset: int = wire(required=True)


@header
class CreateTopicRequestHeader(Header):
    topic: str = wire(required=True)
    defaultTopic: str = wire(default="TBW102")
    readQueueNums: int = wire(required=True)
    writeQueueNums: int = wire(required=True)
    perm: int = wire(required=True)
    topicFilterType: str = wire(default="SINGLE_TAG")
    topicSysFlag: int | None = wire()
    order: bool = wire(default=False)


@header
class TopicHeader(Header):
    """GET_TOPIC_STATS_INFO, GET_ROUTEINFO_BY_TOPIC, DELETE_TOPIC_*."""

    topic: str = wire(required=True)


@header
class GetConsumeStatsRequestHeader(Header):
    consumerGroup: str = wire(required=True)
    topic: str | None = wire()


# ---------------------------------------------------------------------------------------------------------------
# Transactions


@header
class EndTransactionRequestHeader(Header):
    producerGroup: str = wire(required=True)
    tranStateTableOffset: int = wire(required=True)  # queue offset of the half message in the half topic
    commitLogOffset: int = wire(required=True)
    commitOrRollback: int = wire(required=True)  # 0 unknown, 8 commit, 12 rollback
    fromTransactionCheck: bool = wire(default=False)
    msgId: str = wire(required=True)
    transactionId: str | None = wire()
    txmqMessages: int | None = wire()  # txmq: how many messages the transaction holds (several in one)

    @classmethod
    def from_ext(cls, ext: dict[str, str] | None) -> Self:
        """One per transaction: no per-field loop when every field is well formed (the generic path names the
        bad one otherwise)."""
        if ext is not None:
            try:
                check = ext.get("fromTransactionCheck")
                return cls(
                    ext["producerGroup"],
                    int(ext["tranStateTableOffset"]),
                    int(ext["commitLogOffset"]),
                    int(ext["commitOrRollback"]),
                    False if check is None else parse_bool(check),
                    ext["msgId"],
                    ext.get("transactionId"),
                    None if (n := ext.get("txmqMessages")) is None else int(n),
                )
            except (KeyError, ValueError, TypeError, AttributeError):
                pass
        return cls._parse(ext)


@header
class CheckTransactionStateRequestHeader(Header):
    tranStateTableOffset: int = wire(required=True)
    commitLogOffset: int = wire(required=True)
    msgId: str | None = wire()
    transactionId: str | None = wire()
    offsetMsgId: str | None = wire()


# ---------------------------------------------------------------------------------------------------------------
# Name server


@header
class RegisterBrokerRequestHeader(Header):
    brokerName: str = wire(required=True)
    brokerAddr: str = wire(required=True)
    clusterName: str = wire(required=True)
    haServerAddr: str = wire(default="")
    brokerId: int = wire(required=True)
    compressed: bool = wire(default=False)
    bodyCrc32: int = wire(default=0)


@header
class UnregisterBrokerRequestHeader(Header):
    brokerName: str = wire(required=True)
    brokerAddr: str = wire(required=True)
    clusterName: str = wire(required=True)
    brokerId: int = wire(required=True)


@header
class KVConfigRequestHeader(Header):
    namespace: str = wire(required=True)
    key: str = wire(required=True)
    value: str | None = wire()
