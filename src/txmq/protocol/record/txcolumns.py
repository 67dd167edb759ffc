"""The transaction records of a segment as columns: what the audit reads (format ``txmq-store``, view
``transactions``), taken straight from the segment's bytes with no record object or row in between.

Compiled with mypyc (setup.py ``HOT_MODULES``): this loop runs once per record of a store. :meth:`TxColumns.walk`
walks the records as :func:`txmq.protocol.record.walk.walk_segment` does (the same checks in the same order, the
same reasons; the offsets from :mod:`.layout`), but over ``bytes``, whose bytes compiled code reads without a call,
and reads only the fields the audit needs. A record is classified from its topic length and bytes and its sysFlag
(half message, op marker or resume record, discard copy, committed delivery); any other record costs its header
checks and CRC. Per transaction record: its fixed fields in one unpack, the properties it needs read by key from the
properties text (no map of them all), and no Python string built for values that repeat:
kinds, producer groups, topics, decisions and store hosts are kept as indices into :attr:`TxColumns.names` and
:attr:`TxColumns.hosts`, which the reader turns into Arrow dictionaries; the offsetMsgId is left to the reader
(store host index + commit-log offset, turned into text in bulk).

A value that cannot be held in its column (an int property out of the int32 range, or not an integer) is null. The
int columns hold :data:`NULL` where the value is null (no None): the reader turns each into an Arrow array in one copy
(``array.array``), with the nulls found in bulk.
"""

from __future__ import annotations

from typing import Final
from zlib import crc32

from txmq.errors import RecordDecodeError
from txmq.protocol.op_marker import OP_TAG, PROP_DECISION, PROP_HALF_PHYS, RESUME_TAG, UNKNOWN, parse_marker
from txmq.protocol.record.layout import (
    BLANK_HEADER_SIZE,
    BLANK_MAGIC_CODE,
    HEAD,
    HEAD_TO_SYS_FLAG,
    MAGIC_CODE,
    MAX_TOPIC_BYTES,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    TAIL_AFTER_HOSTS,
    body_len_pos,
    store_timestamp_pos,
)
from txmq.protocol.record.properties import NAME_VALUE_SEPARATOR, Prop, decode_properties, marker_value
from txmq.protocol.topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

# Row kinds, by their index in the ``kinds`` column.
KINDS: Final = ("HALF", "OP", "RESUME", "DELIVERY", "DISCARD_COPY")
HALF: Final = 0
OP: Final = 1
RESUME: Final = 2
DELIVERY: Final = 3
DISCARD_COPY: Final = 4

_HALF_TOPIC: Final = TRANS_HALF_TOPIC.encode()
_OP_TOPIC: Final = TRANS_OP_HALF_TOPIC.encode()
_DISCARD_TOPIC: Final = TRANS_CHECK_MAX_TIME_TOPIC.encode()
_HALF_LEN: Final = len(_HALF_TOPIC)
_OP_LEN: Final = len(_OP_TOPIC)
_DISCARD_LEN: Final = len(_DISCARD_TOPIC)
_TX_MASK: Final = 0xC
_TX_COMMIT: Final = 0x8
_MAGIC_CODE: Final = MAGIC_CODE
_BLANK_MAGIC_CODE: Final = BLANK_MAGIC_CODE
_BLANK_HEADER_SIZE: Final = BLANK_HEADER_SIZE
_HEAD_TO_SYS_FLAG: Final = HEAD_TO_SYS_FLAG.size
_MIN_RECORD_SIZE: Final = MIN_RECORD_SIZE
_MAX_TOPIC_BYTES: Final = MAX_TOPIC_BYTES
_PHYSICAL_OFFSET_POS: Final = PHYSICAL_OFFSET_POS
_HEAD: Final = HEAD  # TOTALSIZE .. BORNTIMESTAMP in one call, once the whole record is at hand
_TAIL_AFTER_HOSTS: Final = TAIL_AFTER_HOSTS.size  # RECONSUMETIMES PREPARED_TX_OFFSET BODYLEN
# A null in an int column: no offset, timestamp or int32 is this (a delivery's PREPARED_TX_OFFSET of -2^63, which
# points nowhere, reads as null).
NULL: Final = -(2**63)
_NULL: Final = NULL
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
# The properties the rows take, each looked up by "key\x01" (txmq.protocol.record.properties.marker_value)
_UNIQ: Final = Prop.UNIQ_KEY + NAME_VALUE_SEPARATOR
_TX_ID: Final = Prop.TX_ID + NAME_VALUE_SEPARATOR
_TX_SEQ: Final = Prop.TX_SEQ + NAME_VALUE_SEPARATOR
_PGROUP: Final = Prop.PGROUP + NAME_VALUE_SEPARATOR
_REAL_TOPIC: Final = Prop.REAL_TOPIC + NAME_VALUE_SEPARATOR
_REAL_QID: Final = Prop.REAL_QID + NAME_VALUE_SEPARATOR
_TRANSACTION_ID: Final = Prop.TRANSACTION_ID + NAME_VALUE_SEPARATOR
_CHECK_TIMES: Final = Prop.TRANSACTION_CHECK_TIMES + NAME_VALUE_SEPARATOR
_TAGS: Final = Prop.TAGS + NAME_VALUE_SEPARATOR
_KEYS: Final = Prop.KEYS + NAME_VALUE_SEPARATOR
_HALF_PHYS: Final = PROP_HALF_PHYS + NAME_VALUE_SEPARATOR
_DECISION: Final = PROP_DECISION + NAME_VALUE_SEPARATOR


def int32_property(text: str | None) -> int | None:
    """A property holding an int32 (REAL_QID, TRANSACTION_CHECK_TIMES, TXMQ_TX_SEQ) as ``int()`` reads it; None
    when absent, not an integer, or out of range."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if _INT32_MIN <= value <= _INT32_MAX else None


def _int32_or_null(text: str | None) -> int:
    """:func:`int32_property`, with :data:`NULL` for None."""
    value = int32_property(text)
    return _NULL if value is None else value


class TxColumns:
    """The ``transactions`` view's columns (``txmq.spark.store_source.TX_COLUMNS``) as lists, row by row.

    The int columns hold :data:`NULL` for a null. ``kinds`` holds indices into :data:`KINDS`; ``groups``,
    ``topics`` and ``decisions`` indices into ``names`` (-1: null); ``host_ids`` indices into ``hosts`` (the store
    hosts' bytes), whose upper-case hex followed by the row's ``offsets`` as 16 hex digits is its offsetMsgId.
    ``damaged`` says where and why a walk stopped at a record whose topic or properties are not UTF-8 (the rows
    before it stay)."""

    def __init__(self) -> None:
        self.kinds: list[int] = []
        self.offsets: list[int] = []
        self.halves: list[int] = []
        self.half_qos: list[int] = []
        self.groups: list[int] = []
        self.topics: list[int] = []
        self.qids: list[int] = []
        self.qos: list[int] = []
        self.tx_ids: list[str | None] = []
        self.uniqs: list[str | None] = []
        self.host_ids: list[int] = []
        self.decisions: list[int] = []
        self.checks: list[int] = []
        self.borns: list[int] = []
        self.storeds: list[int] = []
        self.seqs: list[int] = []
        self.names: list[str] = []
        self.hosts: list[bytes] = []
        self.damaged: tuple[int, str] | None = None  # (commit-log offset, why) of a record that ended the walk
        self.skipped: list[tuple[int, str]] = []  # (commit-log offset, why) of records skipped for their CRC
        self.need = 0
        self.end = 0
        self.reason: str | None = None  # why the walk is over; None while it is not
        self.clean = True
        self._name_ids: dict[str, int] = {}
        self._host_ids: dict[bytes, int] = {}
        self._topic_ids: dict[bytes, int] = {}  # a delivery's topic bytes -> names index (decoded once)

    def __len__(self) -> int:
        return len(self.kinds)

    def clear(self) -> None:
        """Empties the rows; the dictionaries (names, hosts) stay, so indices keep their meaning."""
        for col in (self.kinds, self.offsets, self.groups, self.topics, self.host_ids, self.decisions, self.borns):
            col.clear()
        for opt in (self.halves, self.half_qos, self.qids, self.qos, self.checks, self.seqs):
            opt.clear()
        self.tx_ids.clear()
        self.uniqs.clear()
        self.storeds.clear()

    def _name(self, value: str | None) -> int:
        if value is None:
            return -1
        found = self._name_ids.get(value)
        if found is None:
            found = self._name_ids[value] = len(self.names)
            self.names.append(value)
        return found

    def _host(self, host: bytes) -> int:
        found = self._host_ids.get(host)
        if found is None:
            found = self._host_ids[host] = len(self.hosts)
            self.hosts.append(host)
        return found

    def _topic(self, raw: bytes) -> int:
        found = self._topic_ids.get(raw)
        if found is None:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RecordDecodeError("topic is not UTF-8") from exc
            found = self._topic_ids[raw] = self._name(text)
        return found

    def walk(self, data: bytes, at: int, pos: int, base: int, limit: int, stop: int, max_rows: int) -> int:
        """Walk the records of a segment from position ``pos``, in ``data`` (its bytes from ``at`` on), the way
        :func:`txmq.protocol.record.walk.walk_segment` walks them with ``tail_room=0, skip_bad_crc=True`` (same
        checks, same reasons), and add the rows of its transaction records. ``base`` is the segment's first
        commit-log offset, ``limit`` its size, ``stop`` the position before which records start (``min(limit,
        stop_at - base)``). Returns the position it stopped at. When the walk is over, ``reason`` says why (and
        ``clean``, ``end``); when it is not (None), call again from the returned position: with the same ``data``
        after ``max_rows`` rows, or with bytes from there on of at least ``need`` (the chunk ended mid-record).
        Records skipped for their body CRC land in ``skipped``; a record whose topic or properties are not UTF-8
        ends the walk (``damaged``)."""
        self.need = 0
        end_data = at + len(data)
        while True:
            if pos >= stop:
                self._over(pos, "end of the range" if stop < limit else "end of the buffer", True)
                return pos
            remaining = limit - pos
            if remaining < _BLANK_HEADER_SIZE:
                self._over(pos, f"only {remaining} bytes left in the segment at {base + pos}", False)
                return pos
            head = _HEAD_TO_SYS_FLAG if remaining >= _HEAD_TO_SYS_FLAG else _BLANK_HEADER_SIZE
            if end_data - pos < head:
                self.need = _HEAD_TO_SYS_FLAG
                return pos
            q = pos - at
            phys = base + pos
            size = _i32(data, q)
            magic = _u32(data, q + 4)
            if magic != _MAGIC_CODE:
                if magic == _BLANK_MAGIC_CODE:
                    if size != remaining:
                        why = f"end-of-file blank at {phys} says {size} bytes but {remaining} are left"
                        self._over(pos, why, False)
                    else:
                        self._over(pos, f"end-of-file blank at {phys}", True)
                elif size != 0 or magic != 0:
                    self._over(pos, f"garbage header at {phys} (size {size}, magic 0x{magic:08X})", False)
                else:
                    self._over(pos, "end of data", True)
                return pos
            if size < _MIN_RECORD_SIZE or size > remaining:
                why = f"impossible record size {size} at {phys} ({remaining} bytes left in the segment)"
                self._over(pos, why, False)
                return pos
            if end_data - pos < size:
                rec_phys = _i64(data, q + _PHYSICAL_OFFSET_POS)
                if rec_phys != phys:
                    self._over(pos, f"record at {phys} says its PHYSICALOFFSET is {rec_phys}", False)
                else:
                    self.need = size
                return pos
            fixed = _HEAD.unpack_from(data, q)  # the whole record is here: its fixed fields in one call
            rec_phys = fixed[6]
            if rec_phys != phys:
                self._over(pos, f"record at {phys} says its PHYSICALOFFSET is {rec_phys}", False)
                return pos
            end = q + size
            sys_flag: int = fixed[7]
            body_len_at = q + body_len_pos(sys_flag)
            if body_len_at + 4 > end:
                self._over(pos, f"record at {phys}: hosts do not fit in TOTALSIZE {size}", False)
                return pos
            body_len = _i32(data, body_len_at)
            body_start = body_len_at + 4
            topic_len_at = body_start + body_len
            if body_len < 0 or topic_len_at + 1 > end:
                why = f"record at {phys}: body length {body_len} does not fit in TOTALSIZE {size}"
                self._over(pos, why, False)
                return pos
            topic_len = data[topic_len_at]
            props_len_at = topic_len_at + 1 + topic_len
            if topic_len == 0 or topic_len > _MAX_TOPIC_BYTES or props_len_at + 2 > end:
                self._over(pos, f"record at {phys}: topic length {topic_len} is invalid", False)
                return pos
            props_len = (data[props_len_at] << 8) | data[props_len_at + 1]
            if props_len_at + 2 + props_len != end:
                self._over(pos, f"record at {phys}: field lengths do not add up to TOTALSIZE {size}", False)
                return pos
            body_crc: int = fixed[2]
            if crc32(data[body_start:topic_len_at]) & 0x7FFFFFFF != body_crc:
                self.skipped.append((phys, f"body CRC mismatch in record at {phys}"))
                pos += size
                continue
            kind = _kind(data, topic_len_at + 1, topic_len, sys_flag)
            if kind >= 0:
                try:
                    self._record(kind, data, q, fixed, body_start, topic_len_at, props_len_at + 2, end)
                except RecordDecodeError as exc:  # topic or properties that are not UTF-8
                    self.damaged = (phys, str(exc))
                    self._over(pos, f"damaged record at {phys}", False)
                    return pos
            pos += size
            if len(self.kinds) >= max_rows:
                return pos

    def _over(self, pos: int, reason: str, clean: bool) -> None:
        self.end = pos
        self.reason = reason
        self.clean = clean

    def _record(
        self, kind: int, data: bytes, q: int, head: tuple[int, ...], body_start: int, topic_end: int, props_at: int,
        end: int
    ) -> None:  # fmt: skip
        """The row(s) of the transaction record at ``data[q:end]``, whose structure :meth:`walk` has checked;
        ``head``: its fields TOTALSIZE .. BORNTIMESTAMP (layout.HEAD)."""
        queue_id: int = head[3]
        queue_offset: int = head[5]
        phys: int = head[6]
        sys_flag: int = head[7]
        born: int = head[8]
        ts_at = q + store_timestamp_pos(sys_flag)
        stored = _i64(data, ts_at)
        try:
            text = data[props_at:end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordDecodeError(f"properties at {q} are not UTF-8") from exc
        host = self._host(data[ts_at + 8 : body_start - _TAIL_AFTER_HOSTS])
        uniq = marker_value(text, _UNIQ)
        if kind == OP:
            self._add_marker(data[body_start:topic_end], text, phys, queue_offset, host, born, stored, uniq)
            return
        several = marker_value(text, _TX_ID)
        group = self._name(marker_value(text, _PGROUP))
        if kind == HALF:
            half = phys
            half_qo = queue_offset
            topic_id = self._name(marker_value(text, _REAL_TOPIC))
            qid = _int32_or_null(marker_value(text, _REAL_QID))
            qo = _NULL
            tx_id = several or marker_value(text, _TRANSACTION_ID) or uniq
            checks = _NULL
        elif kind == DISCARD_COPY:
            half = half_qo = _NULL
            topic_id = self._name(marker_value(text, _REAL_TOPIC))
            qid = _int32_or_null(marker_value(text, _REAL_QID))
            qo = queue_offset
            tx_id = marker_value(text, _TRANSACTION_ID) or uniq
            checks = _int32_or_null(marker_value(text, _CHECK_TIMES))
        else:  # DELIVERY: a committed copy in the real topic, pointing at its half message
            half = _i64(data, body_start - 12)  # PREPARED_TX_OFFSET, before BODYLEN
            half_qo = _NULL
            topic_id = self._topic(data[topic_end + 1 : props_at - 2])
            qid = queue_id
            qo = queue_offset
            tx_id = several or marker_value(text, _TRANSACTION_ID) or uniq
            checks = _NULL
        self.kinds.append(kind)
        self.offsets.append(phys)
        self.halves.append(half)
        self.half_qos.append(half_qo)
        self.groups.append(group)
        self.topics.append(topic_id)
        self.qids.append(qid)
        self.qos.append(qo)
        self.tx_ids.append(tx_id)
        self.uniqs.append(uniq)
        self.host_ids.append(host)
        self.decisions.append(-1)
        self.checks.append(checks)
        self.borns.append(born)
        self.storeds.append(stored)
        self.seqs.append(_int32_or_null(marker_value(text, _TX_SEQ)) if several else _NULL)

    def _add_marker(
        self,
        body: bytes,
        text: str,
        phys: int,
        queue_offset: int,
        host: int,
        born: int,
        stored: int,
        uniq: str | None,
    ) -> None:
        """One row per decision of an op marker (tag ``d``) or resume record, whose properties are ``text``; a
        malformed marker is ignored, as the broker does."""
        tag = marker_value(text, _TAGS)
        if tag != OP_TAG and tag != RESUME_TAG:
            return
        marked = _marker_decisions(body, text)
        if marked is None:
            return
        keys_text = marker_value(text, _KEYS) or ""
        keys = keys_text.split(" ")
        if len(keys) != len(marked):  # txmq markers list the transactions' UNIQ_KEYs in KEYS, in order
            keys = [uniq or ""] * len(marked)
        is_op = tag == OP_TAG
        kind = OP if is_op else RESUME
        for i in range(len(marked)):
            half_qo, half_phys, decision = marked[i]
            key = keys[i]
            self.kinds.append(kind)
            self.offsets.append(phys)
            self.halves.append(_NULL if half_phys is None else half_phys)
            self.half_qos.append(half_qo)
            self.groups.append(-1)
            self.topics.append(-1)
            self.qids.append(_NULL)
            self.qos.append(queue_offset)
            self.tx_ids.append(None)
            self.uniqs.append(key or None)
            self.host_ids.append(host)
            self.decisions.append(self._name(decision) if is_op else -1)
            self.checks.append(_NULL)
            self.borns.append(born)
            self.storeds.append(stored)
            self.seqs.append(_NULL)


def _u32(data: bytes, at: int) -> int:
    return (data[at] << 24) | (data[at + 1] << 16) | (data[at + 2] << 8) | data[at + 3]


def _i32(data: bytes, at: int) -> int:
    value = _u32(data, at)
    return value - 0x100000000 if value & 0x80000000 else value


def _i64(data: bytes, at: int) -> int:
    high = _u32(data, at)
    low = _u32(data, at + 4)
    if high & 0x80000000:
        return ((high - 0x100000000) << 32) | low
    return (high << 32) | low


def _kind(data: bytes, topic_at: int, topic_len: int, sys_flag: int) -> int:
    """The row kind of a record from its topic and sysFlag, or -1 for a record that is not a transaction record
    (most of a broker's records: one length comparison, and the sysFlag)."""
    if topic_len == _HALF_LEN and data[topic_at : topic_at + topic_len] == _HALF_TOPIC:
        return HALF
    if topic_len == _OP_LEN and data[topic_at : topic_at + topic_len] == _OP_TOPIC:
        return OP
    if topic_len == _DISCARD_LEN and data[topic_at : topic_at + topic_len] == _DISCARD_TOPIC:
        return DISCARD_COPY
    if sys_flag & _TX_MASK == _TX_COMMIT:
        return DELIVERY
    return -1


def _decimal(body: bytes) -> int:
    """``int(body)`` when ``body`` is ASCII digits only (``bytes.isdigit``), else -1."""
    if not body:
        return -1
    value = 0
    for b in body:
        if b < 48 or b > 57:
            return -1
        value = value * 10 + (b - 48)
    return value


def _marker_decisions(body: bytes, text: str) -> list[tuple[int, int | None, str]] | None:
    """(half queue offset, half phys, decision) per decision of a marker whose properties are ``text``, as
    :func:`parse_marker` reads them; None for a malformed one. The common marker (one decimal offset, no comma in
    txmq's properties) is read here directly; anything else goes through ``parse_marker``."""
    try:
        half_qo = _decimal(body)
        if half_qo >= 0:
            raw_phys = marker_value(text, _HALF_PHYS)
            raw_decision = marker_value(text, _DECISION)
            if (raw_phys is None or "," not in raw_phys) and (raw_decision is None or "," not in raw_decision):
                half_phys = int(raw_phys) if raw_phys is not None and raw_phys.isdigit() else None
                return [(half_qo, half_phys, raw_decision or UNKNOWN)]
        props = decode_properties(text)
        return [(m.half_queue_offset, m.half_phys, m.decision) for m in parse_marker(body, props)]
    except ValueError:
        return None
