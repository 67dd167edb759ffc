"""Append entries: a record encoded in the caller's thread, plus what the writer needs to stamp and dispatch it.

The bytes come from :func:`txmq.protocol.record.encode_parts`, the one record encoder (a positional one, built for
this path: it runs once per message on the event loop); this module adds the consume-queue and index facts.
"""

from __future__ import annotations

from txmq.errors import RecordDecodeError
from txmq.protocol.record import (
    MessageRecord,
    Prop,
    RecordEncodeError,
    RecordView,
    decode_properties,
    encode_parts,
    host_bytes,
    property_value,
    tags_code,
)
from txmq.protocol.record.codec import TAGS_CODE_CACHE
from txmq.protocol.record.layout import BORN_V6, STORE_TIMESTAMP_POS_BY_BORN_V6
from txmq.protocol.topics import SCHEDULE_TOPIC
from txmq.store.dispatch import DispatchRequest

__all__ = [
    "SCHEDULE_TOPIC",
    "AppendEntry",
    "EntryError",
    "cached_tags_code",
    "dispatch_from_fields",
    "encode_entry",
    "entry_from_bytes",
    "host_bytes",
    "make_entry",
    "property_value",
    "schedule_delay_ms",
]

_CACHE_LIMIT = 4096
_TS_POS_V4, _TS_POS_V6 = STORE_TIMESTAMP_POS_BY_BORN_V6

# One encoded record waiting for the writer, as a plain tuple because it is built once per message on the event
# loop (a slots class costs about 1 us more). ``buf`` is stamped in place with the offsets and the store time.
#   (buf, topic, queue_id, queue_key, sys_flag, needs_cq, tags_code, keys, uniq_key, delay_ms, ts_pos, store_host)
# needs_cq: NOT or COMMIT transaction type; delay_ms: SCHEDULE_TOPIC_XXXX only, the CQ tagsCode becomes store time
# plus this; ts_pos: byte position of STORETIMESTAMP.
AppendEntry = tuple[
    bytearray, str, int, tuple[str, int], int, bool, int, "str | None", "str | None", int, int, "tuple[str, int] | None"
]


def make_entry(
    buf: bytearray,
    topic: str,
    queue_id: int,
    sys_flag: int,
    tags_code: int,
    keys: str | None,
    uniq_key: str | None,
    delay_ms: int,
    store_host: tuple[str, int] | None,
) -> AppendEntry:
    return (
        buf,
        topic,
        queue_id,
        (topic, queue_id),
        sys_flag,
        (sys_flag & 0xC) in (0x0, 0x8),
        tags_code,
        keys,
        uniq_key,
        delay_ms,
        _TS_POS_V6 if sys_flag & BORN_V6 else _TS_POS_V4,
        store_host,
    )


# A record that cannot be stored; ``status`` names the RocketMQ PutMessageStatus.
EntryError = RecordEncodeError
cached_tags_code = tags_code  # tags_code caches: tags repeat


def schedule_delay_ms(topic: str, properties: dict[str, str], delay_levels_ms: list[int]) -> int:
    """For SCHEDULE_TOPIC_XXXX the CQ tagsCode is the delivery time: store time + the DELAY level's delay."""
    if topic != SCHEDULE_TOPIC or not delay_levels_ms:
        return 0
    try:
        level = int(properties.get(Prop.DELAY, "0"))
    except ValueError:
        return 0
    if level <= 0:
        return 0
    return delay_levels_ms[min(level, len(delay_levels_ms)) - 1]


def encode_entry(record: MessageRecord, max_body: int, delay_levels_ms: list[int]) -> AppendEntry:
    """Encode ``record`` for the append pipeline. Raises :class:`EntryError` for records that cannot be stored."""
    buf, sys_flag = encode_parts(record, max_body)
    topic_text = record.topic
    properties = record.properties
    if properties:
        get = properties.get
        tags = get("TAGS")
        code = (TAGS_CODE_CACHE.get(tags) or tags_code(tags)) if tags else 0
        keys = get("KEYS")
        uniq = get("UNIQ_KEY")
        delay = schedule_delay_ms(topic_text, properties, delay_levels_ms) if topic_text == SCHEDULE_TOPIC else 0
    else:
        code = delay = 0
        keys = uniq = None
    queue_id = record.queue_id
    return (
        buf,
        topic_text,
        queue_id,
        (topic_text, queue_id),
        sys_flag,
        (sys_flag & 0xC) in (0x0, 0x8),
        code,
        keys,
        uniq,
        delay,
        _TS_POS_V6 if sys_flag & BORN_V6 else _TS_POS_V4,
        record.store_host,
    )


def entry_from_bytes(
    data: bytes | bytearray, max_body: int, delay_levels_ms: list[int], store_host: tuple[str, int] | None = None
) -> AppendEntry:
    """Wrap an already encoded record (the broker's raw put path). Its offsets and store time get overwritten."""
    try:
        record = RecordView(data, check_crc=True)
        topic = record.topic
        props = record.properties
    except RecordDecodeError as exc:
        raise EntryError("MESSAGE_ILLEGAL", f"not a valid record: {exc}") from exc
    if len(data) != record.store_size:
        raise EntryError("MESSAGE_ILLEGAL", f"{len(data)} bytes given, the record says {record.store_size}")
    if record.body_len > max_body:
        raise EntryError("MESSAGE_ILLEGAL", f"body is {record.body_len} bytes, more than maxMessageSize {max_body}")
    return make_entry(
        bytearray(data),
        topic,
        record.queue_id,
        record.sys_flag,
        tags_code(props.get(Prop.TAGS)),
        props.get(Prop.KEYS),
        props.get(Prop.UNIQ_KEY),
        schedule_delay_ms(topic, props, delay_levels_ms),
        store_host,
    )


_TOPICS: dict[bytes, str] = {}


def dispatch_from_fields(
    phys: int,
    size: int,
    queue_id: int,
    queue_offset: int,
    sys_flag: int,
    store_ts: int,
    topic_raw: bytes,
    props_raw: bytes,
    delay_levels_ms: list[int],
) -> DispatchRequest:
    """The DispatchRequest of a verified record (fields as :meth:`CommitLog.scan` yields them): what recovery
    replays into the consume queues and the index."""
    topic = _TOPICS.get(topic_raw)
    if topic is None:
        topic = topic_raw.decode("utf-8", "replace")
        if len(_TOPICS) >= _CACHE_LIMIT:
            _TOPICS.clear()
        _TOPICS[topic_raw] = topic
    keys = uniq = None
    code = 0
    if props_raw:
        text = props_raw.decode("utf-8", "replace")
        tags = property_value(text, "TAGS")
        if tags:
            code = tags_code(tags)
        keys = property_value(text, "KEYS")
        uniq = property_value(text, "UNIQ_KEY")
        if topic == SCHEDULE_TOPIC:
            delay = schedule_delay_ms(topic, decode_properties(text), delay_levels_ms)
            if delay:
                code = store_ts + delay
    return DispatchRequest(topic, queue_id, queue_offset, phys, size, code, store_ts, sys_flag, keys, uniq)
