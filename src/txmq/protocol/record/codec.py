"""Commit-log records: the encoder, the checked decoder, hosts, tag hash, batch bodies and message ids (no IO).

A stored record is also the unit of PULL / QUERY / VIEW response bodies and of the CHECK_TRANSACTION_STATE body, so
the same encoder and decoder serve the store and the wire. Offsets come from :mod:`.layout`.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import ipaddress
import os
import random
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Final

from txmq._hotpath import reduce_by_fields
from txmq.errors import ProtocolError, RecordDecodeError
from txmq.protocol.record.layout import (
    BLANK_MAGIC_CODE,
    BORN_V6,
    FIXED,
    HEAD,
    HEAD_SIZE,
    I32,
    I64,
    MAGIC_CODE,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    QUEUE_OFFSET_POS,
    SIZE_MAGIC,
    STORE_V6,
    SYS_FLAG_POS,
    TAIL_AFTER_HOSTS,
    TRANSACTION_MASK,
    U16,
    V6_HOSTS,
    store_timestamp_pos,
)
from txmq.protocol.record.properties import Prop, decode_properties

_I64 = I64
_U16 = U16


class TransactionType(enum.IntEnum):
    """The two transaction bits of sysFlag."""

    NOT_TYPE = 0x0
    PREPARED = 0x4
    COMMIT = 0x8
    ROLLBACK = 0xC


def transaction_type(sys_flag: int) -> TransactionType:
    return TransactionType(sys_flag & TRANSACTION_MASK)


def with_transaction_type(sys_flag: int, tran_type: int) -> int:
    return (sys_flag & ~TRANSACTION_MASK) | (tran_type & TRANSACTION_MASK)


def needs_consume_queue(sys_flag: int) -> bool:
    """Consume-queue entries are built only for NOT and COMMIT transaction types."""
    return sys_flag & TRANSACTION_MASK in (TransactionType.NOT_TYPE, TransactionType.COMMIT)


class RecordEncodeError(ProtocolError, ValueError):
    """A record that cannot be encoded; ``status`` names the RocketMQ PutMessageStatus a store answers with."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------------------------
# Tag hash and hosts


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` over UTF-16 code units, as a signed 32-bit int (``"TagA"`` -> 2598919)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


_TAGS: Final[dict[str, int]] = {}
TAGS_CODE_CACHE: Final = _TAGS  # hot paths try ``TAGS_CODE_CACHE.get(tags) or tags_code(tags)``: one call fewer
_HOSTS: Final[dict[tuple[str, int], bytes]] = {}
_CACHE_LIMIT: Final = 4096


def tags_code(tags: str | None) -> int:
    """The consume-queue tagsCode of a TAGS value; 0 when there is no tag (cached: tags repeat)."""
    if not tags:
        return 0
    code = _TAGS.get(tags)
    if code is None:
        code = java_string_hash(tags)
        if len(_TAGS) >= _CACHE_LIMIT:
            _TAGS.clear()
        _TAGS[tags] = code
    return code


Host = tuple[str, int]


def host_bytes(host: Host) -> bytes:
    """Packed ip + int32 port, IPv4-mapped IPv6 turned into IPv4 (cached: hosts repeat per connection)."""
    cached = _HOSTS.get(host)
    if cached is not None:
        return cached
    ip, port = host
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError as exc:
        raise RecordEncodeError("MESSAGE_ILLEGAL", f"not an IP address: {ip!r}") from exc
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if not -(2**31) <= port < 2**31:
        raise RecordEncodeError("MESSAGE_ILLEGAL", f"port {port} does not fit an int32")
    packed = addr.packed + I32.pack(port)
    if len(_HOSTS) >= _CACHE_LIMIT:
        _HOSTS.clear()
    _HOSTS[host] = packed
    return packed


_host_bytes = host_bytes


@functools.lru_cache(maxsize=4096)
def normalize_host(host: Host) -> Host:
    """Turn an IPv4-mapped IPv6 peer (``::ffff:1.2.3.4``) into plain IPv4, as C++ clients need."""
    ip, port = host
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return (str(addr.ipv4_mapped), port)
    return (str(addr), port)


def _decode_host(data: bytes | memoryview) -> Host:
    return _decode_host_bytes(bytes(data))


@functools.lru_cache(maxsize=4096)
def _decode_host_bytes(data: bytes) -> Host:
    ip = str(ipaddress.ip_address(data[:-4]))
    (port,) = I32.unpack(data[-4:])
    return (ip, port)


# ---------------------------------------------------------------------------------------------------------------
# Records


def body_crc(body: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


@dataclass(slots=True, init=False)
class MessageRecord:
    """One commit-log record. ``properties`` is the decoded map; the raw text round-trips through it."""

    topic: str
    body: bytes = b""
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: Host = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    body_crc: int | None = None  # filled in on decode; computed on encode when None
    store_size: int = 0  # TOTALSIZE, filled in on decode

    # Written out so that mypyc compiles it (a dataclass's generated __init__ runs interpreted); one to three
    # records per message. tests/protocol/test_constructors.py holds it to the fields.
    def __init__(
        self,
        topic: str,
        body: bytes = b"",
        queue_id: int = 0,
        flag: int = 0,
        queue_offset: int = 0,
        physical_offset: int = 0,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: Host = ("127.0.0.1", 0),
        store_timestamp: int = 0,
        store_host: Host = ("127.0.0.1", 0),
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        properties: dict[str, str] | None = None,
        body_crc: int | None = None,
        store_size: int = 0,
    ) -> None:
        self.topic = topic
        self.body = body
        self.queue_id = queue_id
        self.flag = flag
        self.queue_offset = queue_offset
        self.physical_offset = physical_offset
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.store_timestamp = store_timestamp
        self.store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.properties = {} if properties is None else properties
        self.body_crc = body_crc
        self.store_size = store_size

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return reduce_by_fields(self)  # copy and pickle (the written-out __init__ needs its arguments)

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(Prop.KEYS, "").split(" ") if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(Prop.UNIQ_KEY)

    @property
    def transaction_type(self) -> TransactionType:
        return transaction_type(self.sys_flag)

    @property
    def offset_msg_id(self) -> str:
        return encode_offset_msg_id(self.store_host, self.physical_offset)


_crc32: Final = zlib.crc32

# A topic's length byte and UTF-8 bytes, as a record holds them (topics repeat; bounded like _HOSTS).
_TOPIC_PARTS: Final[dict[str, bytes]] = {}


def _topic_part(topic: str) -> bytes:
    encoded = topic.encode()
    topic_len = len(encoded)
    if not 0 < topic_len <= MAX_TOPIC_BYTES:
        raise RecordEncodeError(
            "MESSAGE_ILLEGAL", f"topic must be 1..{MAX_TOPIC_BYTES} bytes of UTF-8, got {topic_len}"
        )
    part = bytes((topic_len,)) + encoded
    if len(_TOPIC_PARTS) >= _CACHE_LIMIT:
        _TOPIC_PARTS.clear()
    _TOPIC_PARTS[topic] = part
    return part


def encode_parts(
    record: MessageRecord, max_body: int | None = None, properties_text: str | None = None
) -> tuple[bytearray, int]:
    """Encode ``record``; return the bytes and the sysFlag written (its V6 bits derived from the hosts).

    The store's append path calls this once per message, so it packs the whole fixed part with one precompiled
    struct. Raises :class:`RecordEncodeError` (``status`` MESSAGE_ILLEGAL or PROPERTIES_SIZE_EXCEEDED).
    """
    topic_text = record.topic
    topic_part = _TOPIC_PARTS.get(topic_text)
    if topic_part is None:
        topic_part = _topic_part(topic_text)
    topic_len = len(topic_part) - 1
    body = record.body
    body_len = len(body)
    if max_body is not None and body_len > max_body:
        raise RecordEncodeError("MESSAGE_ILLEGAL", f"body is {body_len} bytes, more than maxMessageSize {max_body}")
    if properties_text is None:
        properties = record.properties
        # encode_properties, inlined: same text, fewer calls.
        props = (
            "\x02".join([f"{k}\x01{v}" for k, v in properties.items() if k and v is not None and v != ""]).encode()
            if properties
            else b""
        )
    else:
        props = properties_text.encode()
    props_len = len(props)
    if props_len > MAX_PROPERTIES_BYTES:
        raise RecordEncodeError(
            "PROPERTIES_SIZE_EXCEEDED", f"properties are {props_len} bytes, more than {MAX_PROPERTIES_BYTES}"
        )
    born_host = record.born_host
    store_host = record.store_host
    born = _HOSTS.get(born_host) or host_bytes(born_host)
    store = _HOSTS.get(store_host) or host_bytes(store_host)
    born_v6 = len(born) == 20
    store_v6 = len(store) == 20
    sys_flag = record.sys_flag & ~V6_HOSTS
    if born_v6:
        sys_flag |= BORN_V6
    if store_v6:
        sys_flag |= STORE_V6
    fixed = FIXED[born_v6, store_v6]
    crc = record.body_crc
    if crc is None:
        crc = _crc32(body) & 0x7FFFFFFF
    total = fixed.size + body_len + 3 + topic_len + props_len
    try:
        head = fixed.pack(
            total,
            MAGIC_CODE,
            crc,
            record.queue_id,
            record.flag,
            record.queue_offset,
            record.physical_offset,
            sys_flag,
            record.born_timestamp,
            born,
            record.store_timestamp,
            store,
            record.reconsume_times,
            record.prepared_transaction_offset,
            body_len,
        )
    except struct.error as exc:
        raise RecordEncodeError("MESSAGE_ILLEGAL", f"a numeric field is out of range: {exc}") from exc
    # One join, one copy of each part: slice assignments into a zeroed buffer cost twice as much.
    buf = bytearray().join((head, body, topic_part, U16.pack(props_len), props))
    return buf, sys_flag


def encode_record(record: MessageRecord, properties_text: str | None = None) -> bytearray:
    """Encode a record. The V6 sysFlag bits are derived from the hosts. ``properties_text`` overrides the map."""
    return encode_parts(record, None, properties_text)[0]


def stamp_record(
    buf: bytearray | memoryview, pos: int, queue_offset: int, physical_offset: int, store_timestamp: int
) -> None:
    """Write QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP into an encoded record at ``buf[pos:]``."""
    I64.pack_into(buf, pos + QUEUE_OFFSET_POS, queue_offset)
    I64.pack_into(buf, pos + PHYSICAL_OFFSET_POS, physical_offset)
    (sys_flag,) = I32.unpack_from(buf, pos + SYS_FLAG_POS)
    I64.pack_into(buf, pos + store_timestamp_pos(sys_flag), store_timestamp)


def read_store_timestamp(data: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """STORETIMESTAMP of the record at ``data[offset:]`` (its first 76 or 88 bytes are enough), unchecked."""
    (sys_flag,) = I32.unpack_from(data, offset + SYS_FLAG_POS)
    return I64.unpack_from(data, offset + store_timestamp_pos(sys_flag))[0]  # type: ignore[no-any-return]


def _need(data: bytes | bytearray | memoryview, pos: int, n: int, what: str) -> None:
    if n < 0 or pos + n > len(data):
        raise RecordDecodeError(f"record truncated: {what} needs {n} bytes at {pos}, only {len(data) - pos} left")


def read_record_size(data: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, int]:
    """Return ``(total_size, magic)`` of the record or blank at ``offset`` without decoding it."""
    _need(data, offset, 8, "record header")
    size, magic = SIZE_MAGIC.unpack_from(data, offset)
    return size, magic


# (total, sys_flag, body_pos, body_len, topic_pos, topic_len, props_pos, props_len); positions relative to the
# record's start.
Located = tuple[int, int, int, int, int, int, int, int]


def locate(view: memoryview | bytes | bytearray, offset: int = 0) -> Located:
    """Check the structure of the record at ``view[offset:]`` (magic, TOTALSIZE, field lengths adding up) and
    return where its variable fields are. Raises :class:`RecordDecodeError` on anything malformed. No CRC check."""
    _need(view, offset, HEAD_SIZE, "fixed header")
    total, magic = SIZE_MAGIC.unpack_from(view, offset)
    if magic != MAGIC_CODE:
        if magic == BLANK_MAGIC_CODE:
            raise RecordDecodeError(f"end-of-file blank at {offset}, not a message record")
        raise RecordDecodeError(f"bad magic code 0x{magic:08X} at {offset}")
    if total < MIN_RECORD_SIZE or offset + total > len(view):
        raise RecordDecodeError(f"record size {total} at {offset} is impossible or runs past the data ({len(view)})")
    (sys_flag,) = I32.unpack_from(view, offset + SYS_FLAG_POS)
    body_len_at = FIXED[bool(sys_flag & BORN_V6), bool(sys_flag & STORE_V6)].size - 4
    if body_len_at + 4 > total:
        raise RecordDecodeError(f"record at {offset}: hosts do not fit in TOTALSIZE {total}")
    (body_len,) = I32.unpack_from(view, offset + body_len_at)
    body_pos = body_len_at + 4
    topic_len_at = body_pos + body_len
    if body_len < 0 or topic_len_at + 1 > total:
        raise RecordDecodeError(f"record at {offset}: body length {body_len} does not fit in TOTALSIZE {total}")
    topic_len = view[offset + topic_len_at]
    props_len_at = topic_len_at + 1 + topic_len
    if props_len_at + 2 > total:
        raise RecordDecodeError(f"record at {offset}: topic length {topic_len} does not fit in TOTALSIZE {total}")
    (props_len,) = U16.unpack_from(view, offset + props_len_at)
    if props_len > MAX_PROPERTIES_BYTES:
        raise RecordDecodeError(f"properties length {props_len} at {offset} is over {MAX_PROPERTIES_BYTES}")
    if props_len_at + 2 + props_len != total:
        raise RecordDecodeError(f"record at {offset} declares {total} bytes but its fields take more or less")
    return total, sys_flag, body_pos, body_len, topic_len_at + 1, topic_len, props_len_at + 2, props_len


def decode_record(
    data: bytes | bytearray | memoryview, offset: int = 0, *, check_crc: bool = True, with_body: bool = True
) -> MessageRecord:
    """Decode the record at ``data[offset:]``. Raises :class:`RecordDecodeError` on anything malformed."""
    view = memoryview(data)
    total, sys_flag, body_pos, body_len, topic_pos, topic_len, props_pos, props_len = locate(view, offset)
    rec = view[offset : offset + total]
    _total, _magic, crc, queue_id, flag, queue_offset, phys, _sys_flag, born_ts = HEAD.unpack_from(rec, 0)
    body_view = rec[body_pos : body_pos + body_len]
    if check_crc and body_crc(body_view) != crc:
        raise RecordDecodeError(f"body CRC mismatch at {offset}: stored {crc}, computed {body_crc(body_view)}")
    store_ts_at = store_timestamp_pos(sys_flag)
    (store_ts,) = I64.unpack_from(rec, store_ts_at)
    reconsume, prepared, _body_len = TAIL_AFTER_HOSTS.unpack_from(rec, body_pos - TAIL_AFTER_HOSTS.size)
    try:
        topic = bytes(rec[topic_pos : topic_pos + topic_len]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordDecodeError(f"topic at {offset} is not UTF-8") from exc
    try:
        props = decode_properties(bytes(rec[props_pos : props_pos + props_len]).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RecordDecodeError(f"properties at {offset} are not UTF-8") from exc
    return MessageRecord(
        topic=topic,
        body=bytes(body_view) if with_body else b"",
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=phys,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=_decode_host(rec[HEAD_SIZE:store_ts_at]),
        store_timestamp=store_ts,
        store_host=_decode_host(rec[store_ts_at + 8 : body_pos - TAIL_AFTER_HOSTS.size]),
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        properties=props,
        body_crc=crc,
        store_size=total,
    )


def decode_records(data: bytes | bytearray | memoryview, *, check_crc: bool = True) -> list[MessageRecord]:
    """Decode a run of records, as in a PULL or QUERY response body."""
    view = memoryview(data)
    out: list[MessageRecord] = []
    pos = 0
    while pos < len(view):
        rec = decode_record(view, pos, check_crc=check_crc)
        out.append(rec)
        pos += rec.store_size
    return out


def encode_blank(size: int) -> bytes:
    """The end-of-file filler that tells readers to continue at the next segment."""
    if size < 8:
        raise ValueError("a blank needs at least 8 bytes")
    return SIZE_MAGIC.pack(size, BLANK_MAGIC_CODE) + bytes(size - 8)


# ---------------------------------------------------------------------------------------------------------------
# Batch bodies (client -> broker)

_BATCH_HEAD = struct.Struct(">iiiii")  # totalSize magic bodyCRC flag bodyLen


@dataclass(slots=True)
class BatchEntry:
    body: bytes
    flag: int = 0
    properties: str = ""  # raw properties text as the client wrote it


def encode_batch(entries: list[BatchEntry]) -> bytes:
    parts: list[bytes] = []
    for e in entries:
        props = e.properties.encode("utf-8")
        total = 20 + len(e.body) + 2 + len(props)
        parts.append(_BATCH_HEAD.pack(total, 0, 0, e.flag, len(e.body)) + e.body + _U16.pack(len(props)) + props)
    return b"".join(parts)


def decode_batch(body: bytes | bytearray | memoryview) -> list[BatchEntry]:
    """Split a batch body into entries. Raises :class:`RecordDecodeError` on any inconsistency."""
    view = memoryview(body)
    entries: list[BatchEntry] = []
    pos = 0
    while pos < len(view):
        if pos + _BATCH_HEAD.size > len(view):
            raise RecordDecodeError(f"batch entry header truncated at {pos}")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(view, pos)
        if body_len < 0 or total < 22 + body_len or pos + total > len(view):
            raise RecordDecodeError(f"batch entry at {pos}: size {total} / body {body_len} do not fit")
        start = pos + _BATCH_HEAD.size
        entry_body = bytes(view[start : start + body_len])
        (props_len,) = _U16.unpack_from(view, start + body_len)
        if 22 + body_len + props_len != total:
            raise RecordDecodeError(f"batch entry at {pos} declares {total} bytes but its fields take more or less")
        props_start = start + body_len + 2
        try:
            props = bytes(view[props_start : props_start + props_len]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordDecodeError(f"batch entry at {pos}: properties are not UTF-8") from exc
        entries.append(BatchEntry(body=entry_body, flag=flag, properties=props))
        pos += total
    return entries


# ---------------------------------------------------------------------------------------------------------------
# Message ids


def encode_offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """offsetMsgId: store IP + port + commit-log offset, upper-case hex (32 chars for IPv4)."""
    return (_host_bytes(store_host) + _I64.pack(physical_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """Return ``((ip, port), physical_offset)`` of an offsetMsgId."""
    if len(msg_id) not in (32, 56):
        raise RecordDecodeError(f"an offsetMsgId has 32 or 56 hex characters, got {len(msg_id)}: {msg_id!r}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise RecordDecodeError(f"offsetMsgId is not hex: {msg_id!r}") from exc
    host = _decode_host(raw[:-8])
    (offset,) = _I64.unpack_from(raw, len(raw) - 8)
    return host, offset


class UniqKeyGenerator:
    """Client message ids (UNIQ_KEY) in Java's layout: ip(4) pid(2) token(4) | ms-since-month-start(4) counter(2).

    Treat the result as opaque; only uniqueness matters. ``now_ms`` lets tests inject a clock.
    """

    def __init__(self, ip: str = "127.0.0.1", pid: int | None = None, token: int | None = None) -> None:
        try:
            ip_bytes = ipaddress.ip_address(ip).packed[-4:]
        except ValueError:
            ip_bytes = bytes(4)
        pid = os.getpid() if pid is None else pid
        token = random.getrandbits(32) if token is None else token
        self._prefix = (ip_bytes + struct.pack(">HI", pid & 0xFFFF, token & 0xFFFFFFFF)).hex().upper()
        self._counter = 0
        self._month_start_ms = 0
        self._next_month_ms = 0

    def _roll_month(self, now_ms: int) -> None:
        now = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.UTC)
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (start + dt.timedelta(days=32)).replace(day=1)
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(nxt.timestamp() * 1000)

    def next(self, now_ms: int | None = None) -> str:
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        if not self._month_start_ms <= now < self._next_month_ms:
            self._roll_month(now)
        self._counter = (self._counter + 1) & 0xFFFF
        tail = struct.pack(">IH", (now - self._month_start_ms) & 0xFFFFFFFF, self._counter)
        return self._prefix + tail.hex().upper()
