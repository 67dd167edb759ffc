"""The frames of the HA port (``haListenPort``), encoded and decoded without IO.

RocketMQ 4.x's HA link is a slave sending its 8-byte commit-log offset and a master answering with (8-byte offset,
4-byte size, bytes). txmq keeps that shape and adds a type byte and a greeting, so that a stranger (a port scanner, a
Java slave, garbage) is told apart from a txmq slave at its first bytes and refused with a reason:

slave -> master
  ``H`` magic ``TXHA`` u8 version, u64 segment size, u16 name length, brokerName (UTF-8),
      u16 address length, the slave's broker address host:port (UTF-8; version 2)               the greeting
  ``R`` u64 offset                                                                       durable commit-log end
master -> slave
  ``A`` u64 min offset, u64 max offset                                                  greeting accepted
  ``X`` u16 length, reason (UTF-8)                                                      refused (then closed)
  ``D`` u64 offset, u32 size, bytes                                                     commit-log bytes (size 0: alive)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from txmq.errors import ProtocolError

MAGIC = b"TXHA"
VERSION = 2  # 2: the greeting names the slave (its broker address), the controller's in-sync set lists it
MAX_DATA = 64 * 1024 * 1024  # larger than any chunk a master ships (a chunk holds whole records of <= 4 MiB + headers)
MAX_NAME = 255
MAX_REASON = 4096

_HELLO = struct.Struct(">4sBQH")  # after the type byte
_U64 = struct.Struct(">Q")
_ACCEPT = struct.Struct(">QQ")
_U16 = struct.Struct(">H")
_DATA = struct.Struct(">QI")


class HaProtocolError(ProtocolError):
    """Bytes on the HA port that are not a frame the other end may send."""


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    segment_size: int
    broker_name: str
    replica_addr: str = ""


@dataclass(frozen=True, slots=True)
class Report:
    offset: int


@dataclass(frozen=True, slots=True)
class Accept:
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str


@dataclass(frozen=True, slots=True)
class Data:
    offset: int
    data: bytes  # empty: a heartbeat


SlaveFrame = Hello | Report
MasterFrame = Accept | Refuse | Data


def encode_hello(broker_name: str, segment_size: int, version: int = VERSION, replica_addr: str = "") -> bytes:
    name = broker_name.encode()
    addr = replica_addr.encode()
    if len(name) > MAX_NAME or len(addr) > MAX_NAME:
        raise ValueError(f"brokerName or the address is longer than {MAX_NAME} bytes")
    tail = _U16.pack(len(addr)) + addr if version >= 2 else b""
    return b"H" + _HELLO.pack(MAGIC, version, segment_size, len(name)) + name + tail


def encode_report(offset: int) -> bytes:
    return b"R" + _U64.pack(offset)


def encode_accept(min_offset: int, max_offset: int) -> bytes:
    return b"A" + _ACCEPT.pack(min_offset, max_offset)


def encode_refuse(reason: str) -> bytes:
    raw = reason.encode()[:MAX_REASON]
    return b"X" + _U16.pack(len(raw)) + raw


def encode_data_header(offset: int, size: int) -> bytes:
    return b"D" + _DATA.pack(offset, size)


class _Decoder:
    """Accumulates bytes and cuts frames; raises :class:`HaProtocolError` on the first byte that cannot start one."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[object]:
        self._buf += data
        out: list[object] = []
        while self._buf:
            frame = self._next()
            if frame is None:
                break
            out.append(frame)
        return out

    def _next(self) -> object | None:
        raise NotImplementedError


class SlaveFrameDecoder(_Decoder):
    """What a master reads: the greeting, then offset reports."""

    def _next(self) -> object | None:
        buf = self._buf
        kind = buf[0]
        if kind == ord("H"):
            if len(buf) < 1 + _HELLO.size:
                # Check the magic as soon as its bytes are here: a stranger is refused at once, not after a wait.
                got = bytes(buf[1:5])
                if got and not MAGIC.startswith(got):
                    raise HaProtocolError(f"not a txmq slave greeting (magic {got!r})")
                return None
            magic, version, segment_size, name_len = _HELLO.unpack_from(buf, 1)
            if magic != MAGIC:
                raise HaProtocolError(f"not a txmq slave greeting (magic {magic!r})")
            if name_len > MAX_NAME:
                raise HaProtocolError(f"greeting names a broker of {name_len} bytes (at most {MAX_NAME})")
            end = 1 + _HELLO.size + name_len
            if len(buf) < end:
                return None
            addr_raw = b""
            if version >= 2:
                if len(buf) < end + 2:
                    return None
                (addr_len,) = _U16.unpack_from(buf, end)
                if addr_len > MAX_NAME:
                    raise HaProtocolError(f"greeting names an address of {addr_len} bytes (at most {MAX_NAME})")
                if len(buf) < end + 2 + addr_len:
                    return None
                addr_raw = bytes(buf[end + 2 : end + 2 + addr_len])
            try:
                name = bytes(buf[1 + _HELLO.size : end]).decode()
                addr = addr_raw.decode()
            except UnicodeDecodeError:
                raise HaProtocolError("greeting's brokerName or address is not UTF-8") from None
            del buf[: end + (2 + len(addr_raw) if version >= 2 else 0)]
            return Hello(version, segment_size, name, addr)
        if kind == ord("R"):
            if len(buf) < 1 + _U64.size:
                return None
            (offset,) = _U64.unpack_from(buf, 1)
            del buf[: 1 + _U64.size]
            if offset >= 1 << 62:
                raise HaProtocolError(f"offset report {offset} is not a commit-log offset")
            return Report(offset)
        raise HaProtocolError(f"unknown frame type 0x{kind:02X} from the slave side (first bytes {bytes(buf[:8])!r})")


class MasterFrameDecoder(_Decoder):
    """What a slave reads: accept or refuse, then data frames."""

    def _next(self) -> object | None:
        buf = self._buf
        kind = buf[0]
        if kind == ord("A"):
            if len(buf) < 1 + _ACCEPT.size:
                return None
            lo, hi = _ACCEPT.unpack_from(buf, 1)
            del buf[: 1 + _ACCEPT.size]
            return Accept(lo, hi)
        if kind == ord("X"):
            if len(buf) < 3:
                return None
            (n,) = _U16.unpack_from(buf, 1)
            if len(buf) < 3 + n:
                return None
            reason = bytes(buf[3 : 3 + n]).decode(errors="replace")
            del buf[: 3 + n]
            return Refuse(reason)
        if kind == ord("D"):
            if len(buf) < 1 + _DATA.size:
                return None
            offset, size = _DATA.unpack_from(buf, 1)
            if size > MAX_DATA:
                raise HaProtocolError(f"data frame of {size} bytes (at most {MAX_DATA})")
            end = 1 + _DATA.size + size
            if len(buf) < end:
                return None
            data = bytes(buf[1 + _DATA.size : end])
            del buf[:end]
            return Data(offset, data)
        raise HaProtocolError(f"unknown frame type 0x{kind:02X} from the master side")
