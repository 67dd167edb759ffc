"""A lazy, checked view of one record inside a buffer: fields are read on access, properties parsed on demand.

Building a view checks the record's structure (magic, TOTALSIZE, field lengths); the body CRC is checked only when
asked (:meth:`RecordView.crc_ok`, or ``check_crc=True``). The view holds the buffer, so it must not outlive a map
that can be closed under it; :meth:`RecordView.to_record` copies everything out.
"""

from __future__ import annotations

from typing import Any

from txmq.errors import RecordDecodeError
from txmq.protocol.record.codec import (
    Host,
    Located,
    MessageRecord,
    TransactionType,
    _decode_host,
    body_crc,
    encode_offset_msg_id,
    locate,
)
from txmq.protocol.record.layout import (
    BODY_CRC_POS,
    BORN_HOST_POS,
    BORN_TIMESTAMP_POS,
    FLAG_POS,
    HEAD,
    I32,
    I64,
    PHYSICAL_OFFSET_POS,
    QUEUE_ID_POS,
    QUEUE_OFFSET_POS,
    TAIL_AFTER_HOSTS,
    TRANSACTION_MASK,
    store_timestamp_pos,
)
from txmq.protocol.record.properties import Prop, decode_properties, property_value

_TAIL = TAIL_AFTER_HOSTS.size


class RecordView:
    """The record at ``buf[offset:]``. Raises :class:`RecordDecodeError` when its structure is broken."""

    __slots__ = (
        "_body_len",
        "_body_pos",
        "_buf",
        "_pos",
        "_properties",
        "_props_len",
        "_props_pos",
        "_text",
        "_topic_len",
        "_topic_pos",
        "store_size",
        "sys_flag",
    )

    def __init__(self, buf: Any, offset: int = 0, *, check_crc: bool = False, located: Located | None = None) -> None:
        if located is None:
            located = locate(buf, offset)
        self._buf = buf
        self._pos = offset
        (
            self.store_size,
            self.sys_flag,
            self._body_pos,
            self._body_len,
            self._topic_pos,
            self._topic_len,
            self._props_pos,
            self._props_len,
        ) = located
        self._properties: dict[str, str] | None = None
        self._text: str | None = None
        if check_crc and not self.crc_ok():
            raise RecordDecodeError(f"body CRC mismatch at {offset}")

    @classmethod
    def trusted(cls, buf: Any, offset: int, located: Located) -> RecordView:
        """A view of a record whose structure the caller has just checked (the segment walker)."""
        return cls(buf, offset, located=located)

    # -- fixed fields ---------------------------------------------------------------------------------------------

    def _i32(self, at: int) -> int:
        return I32.unpack_from(self._buf, self._pos + at)[0]  # type: ignore[no-any-return]

    def _i64(self, at: int) -> int:
        return I64.unpack_from(self._buf, self._pos + at)[0]  # type: ignore[no-any-return]

    @property
    def offset(self) -> int:
        """Where the record starts in the buffer."""
        return self._pos

    @property
    def body_crc(self) -> int:
        return self._i32(BODY_CRC_POS)

    @property
    def queue_id(self) -> int:
        return self._i32(QUEUE_ID_POS)

    @property
    def flag(self) -> int:
        return self._i32(FLAG_POS)

    @property
    def queue_offset(self) -> int:
        return self._i64(QUEUE_OFFSET_POS)

    @property
    def physical_offset(self) -> int:
        return self._i64(PHYSICAL_OFFSET_POS)

    @property
    def born_timestamp(self) -> int:
        return self._i64(BORN_TIMESTAMP_POS)

    @property
    def born_host(self) -> Host:
        return _decode_host(self._slice(BORN_HOST_POS, store_timestamp_pos(self.sys_flag)))

    @property
    def store_timestamp(self) -> int:
        return self._i64(store_timestamp_pos(self.sys_flag))

    @property
    def store_host(self) -> Host:
        return _decode_host(self.store_host_bytes)

    @property
    def store_host_bytes(self) -> bytes:
        """STOREHOST as stored (IP then port, 8 or 20 bytes): the first part of the offsetMsgId."""
        return self._slice(store_timestamp_pos(self.sys_flag) + 8, self._body_pos - _TAIL)

    def head(self) -> tuple[int, int, int, int, int, int, int, int, int]:
        """TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BORNTIMESTAMP in one read
        (for loops over many records)."""
        return HEAD.unpack_from(self._buf, self._pos)  # type: ignore[no-any-return]

    @property
    def reconsume_times(self) -> int:
        return self._i32(self._body_pos - _TAIL)

    @property
    def prepared_transaction_offset(self) -> int:
        return self._i64(self._body_pos - _TAIL + 4)

    @property
    def transaction_type(self) -> TransactionType:
        return TransactionType(self.sys_flag & TRANSACTION_MASK)

    @property
    def needs_consume_queue(self) -> bool:
        return self.sys_flag & TRANSACTION_MASK in (0x0, 0x8)

    # -- variable fields ------------------------------------------------------------------------------------------

    def _slice(self, lo: int, hi: int) -> bytes:
        return bytes(self._buf[self._pos + lo : self._pos + hi])

    @property
    def body(self) -> bytes:
        return self._slice(self._body_pos, self._body_pos + self._body_len)

    @property
    def body_view(self) -> memoryview:
        start = self._pos + self._body_pos
        return memoryview(self._buf)[start : start + self._body_len]

    @property
    def body_len(self) -> int:
        return self._body_len

    @property
    def topic_bytes(self) -> bytes:
        return self._slice(self._topic_pos, self._topic_pos + self._topic_len)

    @property
    def topic(self) -> str:
        try:
            return self.topic_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordDecodeError(f"topic at {self._pos} is not UTF-8") from exc

    @property
    def properties_bytes(self) -> bytes:
        return self._slice(self._props_pos, self._props_pos + self._props_len)

    @property
    def properties_text(self) -> str:
        if self._text is None:
            try:
                self._text = self.properties_bytes.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RecordDecodeError(f"properties at {self._pos} are not UTF-8") from exc
        return self._text

    @property
    def properties(self) -> dict[str, str]:
        """The decoded map, parsed on first access."""
        if self._properties is None:
            self._properties = decode_properties(self.properties_text)
        return self._properties

    def get(self, key: str) -> str | None:
        """One property's value, without building the map when it was not built yet."""
        if self._properties is not None:
            return self._properties.get(key)
        return property_value(self.properties_text, key)

    @property
    def tags(self) -> str | None:
        return self.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in (self.get(Prop.KEYS) or "").split(" ") if k]

    @property
    def uniq_key(self) -> str | None:
        return self.get(Prop.UNIQ_KEY)

    @property
    def offset_msg_id(self) -> str:
        return encode_offset_msg_id(self.store_host, self.physical_offset)

    # -- whole record ---------------------------------------------------------------------------------------------

    def crc_ok(self) -> bool:
        return body_crc(self.body_view) == self.body_crc

    def raw(self) -> bytes:
        """The record's bytes."""
        return self._slice(0, self.store_size)

    def to_record(self, *, with_body: bool = True) -> MessageRecord:
        """The eager decode: what :func:`txmq.protocol.record.decode_record` returns for the same bytes."""
        return MessageRecord(
            topic=self.topic,
            body=self.body if with_body else b"",
            queue_id=self.queue_id,
            flag=self.flag,
            queue_offset=self.queue_offset,
            physical_offset=self.physical_offset,
            sys_flag=self.sys_flag,
            born_timestamp=self.born_timestamp,
            born_host=self.born_host,
            store_timestamp=self.store_timestamp,
            store_host=self.store_host,
            reconsume_times=self.reconsume_times,
            prepared_transaction_offset=self.prepared_transaction_offset,
            properties=dict(self.properties),
            body_crc=self.body_crc,
            store_size=self.store_size,
        )

    def __repr__(self) -> str:
        return f"RecordView(at={self._pos}, size={self.store_size}, topic={self.topic_bytes!r})"
