"""Append entries: a record encoded in the caller's thread, plus what the writer needs to stamp and dispatch it.

``encode_entry`` produces exactly the bytes of :func:`txmq.protocol.record.encode_record` (a test pins this), but
with precompiled structs and cached host and tag encodings, because it runs once per message on the event loop.
"""

from __future__ import annotations

import ipaddress
import struct
from zlib import crc32

from txmq.errors import RecordDecodeError
from txmq.protocol.record import (
    MAGIC_CODE,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    MessageRecord,
    Prop,
    SysFlag,
    decode_properties,
    decode_record,
    tags_code,
)
from txmq.store.dispatch import DispatchRequest

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"

# Fixed part up to BODYLEN for each (born v6, store v6) combination: TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET
# PHYSICALOFFSET SYSFLAG BORNTIMESTAMP BORNHOST STORETIMESTAMP STOREHOST RECONSUMETIMES PREPAREDTXOFFSET BODYLEN
_FIXED = {(b, s): struct.Struct(f">iIiiiqqiq{20 if b else 8}sq{20 if s else 8}siqi") for b in (0, 1) for s in (0, 1)}
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HEAD = struct.Struct(">iIiiiqqi")  # TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG
_HOSTS: dict[tuple[str, int], bytes] = {}
_TAGS: dict[str, int] = {}
_CACHE_LIMIT = 4096
# Plain ints: IntFlag arithmetic costs about a microsecond per operation on this path.
_BORN_V6 = int(SysFlag.BORNHOST_V6)
_STORE_V6 = int(SysFlag.STOREHOST_V6)
_V6_BITS = _BORN_V6 | _STORE_V6


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
        68 if sys_flag & _BORN_V6 else 56,
        store_host,
    )


class EntryError(ValueError):
    """A record that cannot be stored; ``status`` names the RocketMQ PutMessageStatus."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def host_bytes(host: tuple[str, int]) -> bytes:
    """Packed ip + int32 port, IPv4-mapped IPv6 turned into IPv4 (cached: hosts repeat per connection)."""
    cached = _HOSTS.get(host)
    if cached is not None:
        return cached
    ip, port = host
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError as exc:
        raise EntryError("MESSAGE_ILLEGAL", f"not an IP address: {ip!r}") from exc
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if not -(2**31) <= port < 2**31:
        raise EntryError("MESSAGE_ILLEGAL", f"port {port} does not fit an int32")
    packed = addr.packed + struct.pack(">i", port)
    if len(_HOSTS) >= _CACHE_LIMIT:
        _HOSTS.clear()
    _HOSTS[host] = packed
    return packed


def cached_tags_code(tags: str | None) -> int:
    if not tags:
        return 0
    code = _TAGS.get(tags)
    if code is None:
        code = tags_code(tags)
        if len(_TAGS) >= _CACHE_LIMIT:
            _TAGS.clear()
        _TAGS[tags] = code
    return code


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
    topic_text = record.topic
    topic = topic_text.encode()
    topic_len = len(topic)
    if not 0 < topic_len <= MAX_TOPIC_BYTES:
        raise EntryError("MESSAGE_ILLEGAL", f"topic must be 1..{MAX_TOPIC_BYTES} bytes of UTF-8, got {topic_len}")
    body = record.body
    body_len = len(body)
    if body_len > max_body:
        raise EntryError("MESSAGE_ILLEGAL", f"body is {body_len} bytes, more than maxMessageSize {max_body}")
    properties = record.properties
    if properties:
        # encode_properties, inlined: same text, fewer calls.
        props = "\x02".join([f"{k}\x01{v}" for k, v in properties.items() if k and v is not None and v != ""]).encode()
        props_len = len(props)
        if props_len > MAX_PROPERTIES_BYTES:
            raise EntryError(
                "PROPERTIES_SIZE_EXCEEDED", f"properties are {props_len} bytes, more than {MAX_PROPERTIES_BYTES}"
            )
    else:
        props = b""
        props_len = 0
    born_host = record.born_host
    store_host = record.store_host
    born = _HOSTS.get(born_host) or host_bytes(born_host)
    store = _HOSTS.get(store_host) or host_bytes(store_host)
    born_v6 = len(born) == 20
    store_v6 = len(store) == 20
    sys_flag = record.sys_flag & ~_V6_BITS
    if born_v6:
        sys_flag |= _BORN_V6
    if store_v6:
        sys_flag |= _STORE_V6
    fixed = _FIXED[born_v6, store_v6]
    crc = record.body_crc
    if crc is None:
        crc = crc32(body) & 0x7FFFFFFF
    pos = fixed.size
    total = pos + body_len + 3 + topic_len + props_len
    buf = bytearray(total)
    try:
        fixed.pack_into(
            buf,
            0,
            total,
            MAGIC_CODE,
            crc,
            record.queue_id,
            record.flag,
            0,
            0,
            sys_flag,
            record.born_timestamp,
            born,
            0,
            store,
            record.reconsume_times,
            record.prepared_transaction_offset,
            body_len,
        )
    except struct.error as exc:
        raise EntryError("MESSAGE_ILLEGAL", f"a numeric field is out of range: {exc}") from exc
    end = pos + body_len
    buf[pos:end] = body
    buf[end] = topic_len
    pos = end + 1 + topic_len
    buf[end + 1 : pos] = topic
    _U16.pack_into(buf, pos, props_len)
    buf[pos + 2 :] = props
    if properties:
        get = properties.get
        tags = get("TAGS")
        code = (_TAGS.get(tags) or cached_tags_code(tags)) if tags else 0
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
        68 if born_v6 else 56,
        store_host,
    )


def entry_from_bytes(
    data: bytes | bytearray, max_body: int, delay_levels_ms: list[int], store_host: tuple[str, int] | None = None
) -> AppendEntry:
    """Wrap an already encoded record (the broker's raw put path). Its offsets and store time get overwritten."""
    try:
        record = decode_record(data, check_crc=True, with_body=False)
    except RecordDecodeError as exc:
        raise EntryError("MESSAGE_ILLEGAL", f"not a valid record: {exc}") from exc
    if len(data) != record.store_size:
        raise EntryError("MESSAGE_ILLEGAL", f"{len(data)} bytes given, the record says {record.store_size}")
    body_len_pos = 84 + (12 if record.sys_flag & _BORN_V6 else 0)
    body_len_pos += 12 if record.sys_flag & _STORE_V6 else 0
    (body_len,) = _I32.unpack_from(data, body_len_pos)
    if body_len > max_body:
        raise EntryError("MESSAGE_ILLEGAL", f"body is {body_len} bytes, more than maxMessageSize {max_body}")
    props = record.properties
    return make_entry(
        bytearray(data),
        record.topic,
        record.queue_id,
        record.sys_flag,
        cached_tags_code(props.get(Prop.TAGS)),
        props.get(Prop.KEYS),
        props.get(Prop.UNIQ_KEY),
        schedule_delay_ms(record.topic, props, delay_levels_ms),
        store_host,
    )


def property_value(text: str, key: str) -> str | None:
    """The value :func:`decode_properties` would give ``key`` in a properties string, without building the map.

    Later duplicates win, a key counts only at the start of an item, and empty values are skipped.
    """
    marker = key + "\x01"
    i = text.rfind(marker)
    while i > 0 and text[i - 1] != "\x02":
        i = text.rfind(marker, 0, i)
    if i < 0:
        return None
    start = i + len(marker)
    stop = text.find("\x02", start)
    value = text[start:] if stop < 0 else text[start:stop]
    if not value and i > 0:  # an empty value is dropped; an earlier occurrence may still count
        return decode_properties(text).get(key)
    return value or None


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
            code = _TAGS.get(tags) or cached_tags_code(tags)
        keys = property_value(text, "KEYS")
        uniq = property_value(text, "UNIQ_KEY")
        if topic == SCHEDULE_TOPIC:
            delay = schedule_delay_ms(topic, decode_properties(text), delay_levels_ms)
            if delay:
                code = store_ts + delay
    return DispatchRequest(topic, queue_id, queue_offset, phys, size, code, store_ts, sys_flag, keys, uniq)


def record_fields(record: memoryview | bytes) -> tuple[int, int, int, int, int, bytes, bytes]:
    """``(queue_id, queue_offset, sys_flag, store_timestamp, body_len, topic bytes, properties bytes)`` of a
    record known to be well formed."""
    _size, _magic, _crc, queue_id, _flag, queue_offset, _phys, sys_flag = _HEAD.unpack_from(record, 0)
    extra_born = 12 if sys_flag & _BORN_V6 else 0
    (store_ts,) = _I64.unpack_from(record, 56 + extra_born)
    body_len_pos = 84 + extra_born + (12 if sys_flag & _STORE_V6 else 0)
    (body_len,) = _I32.unpack_from(record, body_len_pos)
    pos = body_len_pos + 4 + body_len
    topic_len = record[pos]
    topic = bytes(record[pos + 1 : pos + 1 + topic_len])
    pos += 1 + topic_len
    (props_len,) = _U16.unpack_from(record, pos)
    return queue_id, queue_offset, sys_flag, store_ts, body_len, topic, bytes(record[pos + 2 : pos + 2 + props_len])
