"""Between protobuf messages (``apache.rocketmq.v2.Message``) and stored records (:class:`MessageRecord`).

A 5.x message keeps its wire identity in the record's properties, under the names RocketMQ uses: ``UNIQ_KEY`` (the
message id), ``TAGS``, ``KEYS``, ``__SHARDINGKEY`` (the message group), ``TIMER_DELIVER_MS`` (a delivery time), so
that a 4.x consumer reads it as it would one from the proxy, and the other way round.
"""

from __future__ import annotations

import functools
import re
import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from txmq.broker.schedule import PROP_DLQ_REASON
from txmq.door_grpc.pb import definition_pb2 as d
from txmq.protocol.record import MessageRecord, Prop, SysFlag
from txmq.protocol.record.properties import SYSTEM_PROPERTIES

PROP_MESSAGE_GROUP = "__SHARDINGKEY"
PROP_DELIVER_MS = "TIMER_DELIVER_MS"

# Properties that are system properties on the 5.x wire (or the broker's own bookkeeping), not user properties.
SYSTEM_PROPERTY_KEYS = SYSTEM_PROPERTIES | {Prop.TRANSACTION_ID, PROP_MESSAGE_GROUP, PROP_DELIVER_MS}


class MessageProblem(ValueError):
    """A message that cannot be stored as sent; ``code`` is the ``apache.rocketmq.v2.Code`` to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def timestamp_ms(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def duration_ms(duration: Duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def _timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


@functools.lru_cache(maxsize=1024)  # a client sends the same born host with every message
def parse_host(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host:
        host, port = text, "0"
    host = host.strip("[]") or "127.0.0.1"
    parts = host.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        host = "127.0.0.1"  # the record layout holds IPv4 born hosts here; an IPv6 or a name is not kept
    try:
        return host, int(port) & 0xFFFF
    except ValueError:
        return host, 0


def body_of(message: d.Message, max_size: int) -> bytes:
    body = message.body
    encoding = message.system_properties.body_encoding
    if encoding == d.GZIP:
        try:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            body = inflater.decompress(body, max_size + 1)
        except zlib.error as exc:
            raise MessageProblem(d.MESSAGE_CORRUPTED, f"the GZIP body does not inflate: {exc}") from exc
    if len(body) > max_size:
        raise MessageProblem(
            d.MESSAGE_BODY_TOO_LARGE, f"the message body is {len(body)} bytes, over the limit of {max_size} bytes"
        )
    if not body:
        raise MessageProblem(d.MESSAGE_BODY_EMPTY, "the message body is empty")
    return body


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _control_character(text: str) -> str | None:
    """The first control character of ``text``, or None. The record's properties
    string separates names and values with \\x01 and entries with \\x02, so a value carrying them would write other
    properties (a user property ``"v\\x02DELAY\\x013"`` a delay level, a key ``"\\x02TRAN_MSG\\x01true"`` a transaction
    flag) into the stored record."""
    found = _CONTROL.search(text)
    return found.group() if found else None


def _check_text(text: str, what: str, code: int) -> None:
    bad = _control_character(text)
    if bad is not None:
        raise MessageProblem(code, f"{what} {text[:64]!r} contains the control character {bad!r}")


def record_properties(message: d.Message) -> dict[str, str]:
    """The record properties of a 5.x message: its user properties and its identity (id, tag, keys, group). Names
    and values with control characters are refused (they would break the record's properties string)."""
    sp = message.system_properties
    props: dict[str, str] = {}
    for key, value in message.user_properties.items():
        if key in SYSTEM_PROPERTY_KEYS:
            raise MessageProblem(d.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property {key!r} is a reserved name")
        _check_text(key, "user property name", d.ILLEGAL_MESSAGE_PROPERTY_KEY)
        _check_text(value, f"the value of user property {key!r}", d.ILLEGAL_MESSAGE_PROPERTY_KEY)
        props[key] = value
    if not sp.message_id:
        raise MessageProblem(d.ILLEGAL_MESSAGE_ID, "the message has no message_id")
    _check_text(sp.message_id, "message_id", d.ILLEGAL_MESSAGE_ID)
    props[Prop.UNIQ_KEY] = sp.message_id
    if sp.HasField("tag") and sp.tag:
        if "|" in sp.tag:
            raise MessageProblem(d.ILLEGAL_MESSAGE_TAG, f"tag {sp.tag!r} may not contain '|'")
        _check_text(sp.tag, "tag", d.ILLEGAL_MESSAGE_TAG)
        props[Prop.TAGS] = sp.tag
    if sp.keys:
        for key in sp.keys:
            _check_text(key, "key", d.ILLEGAL_MESSAGE_KEY)
        props[Prop.KEYS] = " ".join(k for k in sp.keys if k)
    if sp.HasField("message_group") and sp.message_group:
        _check_text(sp.message_group, "message_group", d.ILLEGAL_MESSAGE_GROUP)
        props[PROP_MESSAGE_GROUP] = sp.message_group
    return props


def message_of(
    record: MessageRecord,
    *,
    topic: str,
    receipt_handle: str | None = None,
    delivery_attempt: int | None = None,
    invisible_ms: int | None = None,
) -> d.Message:
    """The 5.x view of a stored record (``topic``: the topic the consumer knows, not a retry topic)."""
    props = record.properties
    body = record.body
    if record.sys_flag & SysFlag.COMPRESSED:
        # A 4.x producer zlib-compresses bodies over 4 KiB; the 5.x wire knows GZIP only, so inflate it here.
        try:
            body = zlib.decompress(body)
        except zlib.error:
            pass
    sp = d.SystemProperties(
        message_id=props.get(Prop.UNIQ_KEY) or record.offset_msg_id,
        body_digest=d.Digest(type=d.CRC32, checksum=f"{zlib.crc32(body) & 0xFFFFFFFF:08X}"),
        body_encoding=d.IDENTITY,
        born_timestamp=_timestamp(record.born_timestamp),
        born_host=record.born_host[0],
        store_timestamp=_timestamp(record.store_timestamp),
        store_host=f"{record.store_host[0]}:{record.store_host[1]}",
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
    )
    tag = props.get(Prop.TAGS)
    if tag:
        sp.tag = tag
    keys = props.get(Prop.KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(" ") if k)
    group = props.get(PROP_MESSAGE_GROUP)
    deliver_ms = props.get(PROP_DELIVER_MS)
    if group:
        sp.message_type = d.FIFO
        sp.message_group = group
    elif deliver_ms and deliver_ms.isdigit():
        sp.message_type = d.DELAY
        sp.delivery_timestamp.CopyFrom(_timestamp(int(deliver_ms)))
    elif props.get(Prop.TRAN_MSG, "").lower() == "true":
        sp.message_type = d.TRANSACTION
    else:
        sp.message_type = d.NORMAL
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if delivery_attempt is not None:
        sp.delivery_attempt = delivery_attempt
    if invisible_ms is not None:
        sp.invisible_duration.CopyFrom(Duration(seconds=invisible_ms // 1000, nanos=(invisible_ms % 1000) * 1_000_000))
    reason = props.get(PROP_DLQ_REASON)
    if reason:
        sp.dead_letter_queue.CopyFrom(d.DeadLetterQueue(topic=record.topic, message_id=sp.message_id))
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTY_KEYS}
    return d.Message(topic=d.Resource(name=topic), user_properties=user, system_properties=sp, body=body)
