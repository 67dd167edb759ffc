"""Commit-log records, byte for byte as RocketMQ 4.x lays them out (no IO).

A stored record is also the unit of PULL / QUERY / VIEW response bodies and of the CHECK_TRANSACTION_STATE body, so
the same encoder and decoder serve the store and the wire. All integers are big-endian.
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

from txmq.errors import RecordDecodeError

MAGIC_CODE = 0xDAA320A7  # stored as the signed int -626843481
BLANK_MAGIC_CODE = 0xCBD43194  # end-of-file filler, signed -875286124

MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767


class SysFlag(enum.IntFlag):
    """MessageSysFlag bits."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80


TRANSACTION_MASK = 0xC


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


# ---------------------------------------------------------------------------------------------------------------
# Properties


class Prop:
    """Property keys (MessageConst) used by txmq."""

    UNIQ_KEY = "UNIQ_KEY"
    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT = "WAIT"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    TRAN_MSG = "TRAN_MSG"
    PGROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIME = "CONSUME_START_TIME"
    TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    CLUSTER = "CLUSTER"
    MSG_REGION = "MSG_REGION"
    TRACE_ON = "TRACE_ON"
    TRANSACTION_ID = "__transactionId__"


NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


def encode_properties(properties: dict[str, str]) -> str:
    """``k\\x01v\\x02k\\x01v`` with no trailing separator (Java's form). Empty keys or values are not written."""
    return PROPERTY_SEPARATOR.join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in properties.items() if k and v is not None and v != ""
    )


def decode_properties(text: str) -> dict[str, str]:
    """Parse a properties string the way RocketMQ does, tolerating the trailing ``\\x02`` C++ writes."""
    result: dict[str, str] = {}
    if not text:
        return result
    for item in text.split(PROPERTY_SEPARATOR):
        if len(item) < 3:
            continue
        key, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and key and value:
            result[key] = value
    return result


# ---------------------------------------------------------------------------------------------------------------
# Tag hash and hosts


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` over UTF-16 code units, as a signed 32-bit int (``"TagA"`` -> 2598919)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def tags_code(tags: str | None) -> int:
    """The consume-queue tagsCode of a TAGS value; 0 when there is no tag."""
    return java_string_hash(tags) if tags else 0


Host = tuple[str, int]


@functools.lru_cache(maxsize=4096)
def _host_bytes(host: Host) -> bytes:
    ip, port = host
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError as exc:
        raise ValueError(f"not an IP address: {ip!r}") from exc
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.packed + struct.pack(">i", port)


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


def _is_v6(host: Host) -> bool:
    return len(_host_bytes(host)) == 20


def _decode_host(data: bytes) -> Host:
    return _decode_host_bytes(bytes(data))


@functools.lru_cache(maxsize=4096)
def _decode_host_bytes(data: bytes) -> Host:
    ip = str(ipaddress.ip_address(data[:-4]))
    (port,) = struct.unpack(">i", data[-4:])
    return (ip, port)


# ---------------------------------------------------------------------------------------------------------------
# Records

# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTIMESTAMP
_HEAD = struct.Struct(">iIiiiqqiq")
_HEAD_SIZE = _HEAD.size  # 48
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")
_TAIL_AFTER_HOSTS = struct.Struct(">iqi")  # RECONSUMETIMES PREPARED_TX_OFFSET BODYLEN

QUEUE_OFFSET_POS = 20
PHYSICAL_OFFSET_POS = 28
SYS_FLAG_POS = 36
BORN_HOST_POS = 48


def store_timestamp_pos(sys_flag: int) -> int:
    """Byte position of STORETIMESTAMP, which follows the (4- or 16-byte) born host."""
    return BORN_HOST_POS + (20 if sys_flag & SysFlag.BORNHOST_V6 else 8)


def body_crc(body: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


@dataclass(slots=True)
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


def encode_record(record: MessageRecord, properties_text: str | None = None) -> bytearray:
    """Encode a record. The V6 sysFlag bits are derived from the hosts. ``properties_text`` overrides the map."""
    topic = record.topic.encode("utf-8")
    if not topic or len(topic) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic must be 1..{MAX_TOPIC_BYTES} bytes of UTF-8, got {len(topic)}")
    props_text = encode_properties(record.properties) if properties_text is None else properties_text
    props = props_text.encode("utf-8")
    if len(props) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties are {len(props)} bytes, more than {MAX_PROPERTIES_BYTES}")
    born = _host_bytes(record.born_host)
    store = _host_bytes(record.store_host)
    sys_flag = record.sys_flag & ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
    if len(born) == 20:
        sys_flag |= SysFlag.BORNHOST_V6
    if len(store) == 20:
        sys_flag |= SysFlag.STOREHOST_V6
    body = record.body
    crc = body_crc(body) if record.body_crc is None else record.body_crc
    total = _HEAD_SIZE + len(born) + 8 + len(store) + _TAIL_AFTER_HOSTS.size + len(body) + 1 + len(topic) + 2
    total += len(props)
    out = bytearray(total)
    _HEAD.pack_into(
        out,
        0,
        total,
        MAGIC_CODE,
        crc,
        record.queue_id,
        record.flag,
        record.queue_offset,
        record.physical_offset,
        sys_flag,
        record.born_timestamp,
    )
    pos = _HEAD_SIZE
    out[pos : pos + len(born)] = born
    pos += len(born)
    _I64.pack_into(out, pos, record.store_timestamp)
    pos += 8
    out[pos : pos + len(store)] = store
    pos += len(store)
    _TAIL_AFTER_HOSTS.pack_into(out, pos, record.reconsume_times, record.prepared_transaction_offset, len(body))
    pos += _TAIL_AFTER_HOSTS.size
    out[pos : pos + len(body)] = body
    pos += len(body)
    out[pos] = len(topic)
    pos += 1
    out[pos : pos + len(topic)] = topic
    pos += len(topic)
    _U16.pack_into(out, pos, len(props))
    pos += 2
    out[pos:] = props
    return out


def stamp_record(
    buf: bytearray | memoryview, pos: int, queue_offset: int, physical_offset: int, store_timestamp: int
) -> None:
    """Write QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP into an encoded record at ``buf[pos:]``."""
    _I64.pack_into(buf, pos + QUEUE_OFFSET_POS, queue_offset)
    _I64.pack_into(buf, pos + PHYSICAL_OFFSET_POS, physical_offset)
    (sys_flag,) = _I32.unpack_from(buf, pos + SYS_FLAG_POS)
    _I64.pack_into(buf, pos + store_timestamp_pos(sys_flag), store_timestamp)


def _need(data: memoryview | bytes, pos: int, n: int, what: str) -> None:
    if n < 0 or pos + n > len(data):
        raise RecordDecodeError(f"record truncated: {what} needs {n} bytes at {pos}, only {len(data) - pos} left")


def read_record_size(data: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, int]:
    """Return ``(total_size, magic)`` of the record or blank at ``offset`` without decoding it."""
    _need(data, offset, 8, "record header")
    size, magic = struct.unpack_from(">iI", data, offset)
    return size, magic


def decode_record(
    data: bytes | bytearray | memoryview, offset: int = 0, *, check_crc: bool = True, with_body: bool = True
) -> MessageRecord:
    """Decode the record at ``data[offset:]``. Raises :class:`RecordDecodeError` on anything malformed."""
    view = memoryview(data)
    _need(view, offset, _HEAD_SIZE, "fixed header")
    total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts = _HEAD.unpack_from(view, offset)
    if magic != MAGIC_CODE:
        if magic == BLANK_MAGIC_CODE:
            raise RecordDecodeError(f"end-of-file blank at {offset}, not a message record")
        raise RecordDecodeError(f"bad magic code 0x{magic:08X} at {offset}")
    if total < 91 or offset + total > len(view):
        raise RecordDecodeError(f"record size {total} at {offset} is impossible or runs past the data ({len(view)})")
    rec = view[offset : offset + total]
    pos = _HEAD_SIZE
    born_len = 16 if sys_flag & SysFlag.BORNHOST_V6 else 4
    _need(rec, pos, born_len + 4 + 8, "born host")
    born_host = _decode_host(rec[pos : pos + born_len + 4])
    pos += born_len + 4
    (store_ts,) = _I64.unpack_from(rec, pos)
    pos += 8
    store_len = 16 if sys_flag & SysFlag.STOREHOST_V6 else 4
    _need(rec, pos, store_len + 4 + _TAIL_AFTER_HOSTS.size, "store host")
    store_host = _decode_host(rec[pos : pos + store_len + 4])
    pos += store_len + 4
    reconsume, prepared, body_len = _TAIL_AFTER_HOSTS.unpack_from(rec, pos)
    pos += _TAIL_AFTER_HOSTS.size
    _need(rec, pos, body_len, "body")
    body_view = rec[pos : pos + body_len]
    if check_crc and body_crc(body_view) != crc:
        raise RecordDecodeError(f"body CRC mismatch at {offset}: stored {crc}, computed {body_crc(body_view)}")
    body = bytes(body_view) if with_body else b""
    pos += body_len
    _need(rec, pos, 1, "topic length")
    topic_len = rec[pos]
    pos += 1
    _need(rec, pos, topic_len, "topic")
    try:
        topic = bytes(rec[pos : pos + topic_len]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordDecodeError(f"topic at {offset} is not UTF-8") from exc
    pos += topic_len
    _need(rec, pos, 2, "properties length")
    (props_len,) = _U16.unpack_from(rec, pos)
    pos += 2
    if props_len > MAX_PROPERTIES_BYTES:
        raise RecordDecodeError(f"properties length {props_len} at {offset} is over {MAX_PROPERTIES_BYTES}")
    _need(rec, pos, props_len, "properties")
    try:
        props = decode_properties(bytes(rec[pos : pos + props_len]).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RecordDecodeError(f"properties at {offset} are not UTF-8") from exc
    pos += props_len
    if pos != total:
        raise RecordDecodeError(f"record at {offset} declares {total} bytes but its fields take {pos}")
    return MessageRecord(
        topic=topic,
        body=body,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=phys,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
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
    return struct.pack(">iI", size, BLANK_MAGIC_CODE) + bytes(size - 8)


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


def join_properties(entry_props: str, batch_props: str) -> str:
    """An entry's own properties followed by the batch-level ones, with one separator between."""
    if not batch_props:
        return entry_props
    if entry_props and not entry_props.endswith(PROPERTY_SEPARATOR):
        return entry_props + PROPERTY_SEPARATOR + batch_props
    return entry_props + batch_props


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
