"""The commit-log record layout (wire reference §3.1): the only place that knows its byte offsets.

Every field up to BORNHOST sits at a fixed offset. The two hosts are 8 bytes (IPv4 + port) or 20 bytes (IPv6 +
port) as the BORNHOST_V6 / STOREHOST_V6 sysFlag bits say, so every later field moves by 12 bytes per IPv6 host.
Readers take positions from the helpers here instead of spelling numbers. All integers are big-endian.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

MAGIC_CODE: Final = 0xDAA320A7  # stored as the signed int -626843481
BLANK_MAGIC_CODE = 0xCBD43194  # end-of-file filler, signed -875286124

MAX_TOPIC_BYTES: Final = 127  # the topic length is a signed byte
MAX_PROPERTIES_BYTES: Final = 32767  # the properties length is a signed short
BLANK_HEADER_SIZE = 8  # TOTALSIZE + BLANK_MAGIC_CODE


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


TRANSACTION_MASK: Final = 0xC
# Plain ints for hot paths: IntFlag arithmetic costs about a microsecond per operation.
BORN_V6: Final = 0x10
STORE_V6: Final = 0x20
V6_HOSTS: Final = BORN_V6 | STORE_V6
V6_EXTRA: Final = 12  # an IPv6 host takes 20 bytes instead of 8

# -- fixed offsets (both hosts IPv4 for the fields after BORNHOST) ---------------------------------------------------
TOTAL_SIZE_POS = 0
MAGIC_POS = 4
BODY_CRC_POS: Final = 8
QUEUE_ID_POS = 12
FLAG_POS = 16
QUEUE_OFFSET_POS: Final = 20
PHYSICAL_OFFSET_POS: Final = 28  # right after QUEUEOFFSET: both are written with one QO_PO pack
SYS_FLAG_POS: Final = 36
BORN_TIMESTAMP_POS = 40
BORN_HOST_POS = 48
_STORE_TIMESTAMP_POS = 56  # + V6_EXTRA with an IPv6 born host
_BODY_LEN_POS = 84  # + V6_EXTRA per IPv6 host

# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTIMESTAMP: everything before the hosts
HEAD: Final = struct.Struct(">iIiiiqqiq")
HEAD_SIZE = HEAD.size  # 48 == BORN_HOST_POS
HEAD_TO_SYS_FLAG: Final = struct.Struct(">iIiiiqqi")  # HEAD without BORNTIMESTAMP: what a verification scan needs
SIZE_MAGIC: Final = struct.Struct(">iI")
QO_PO: Final = struct.Struct(">qq")  # QUEUEOFFSET then PHYSICALOFFSET
# RECONSUMETIMES PREPARED_TX_OFFSET BODYLEN, right after the store host
TAIL_AFTER_HOSTS: Final = struct.Struct(">iqi")
I32: Final = struct.Struct(">i")
I64: Final = struct.Struct(">q")
U16: Final = struct.Struct(">H")

# The whole fixed part, TOTALSIZE .. BODYLEN, for each (born v6, store v6): the encoder packs it in one call.
FIXED: Final = {
    (b, s): struct.Struct(f">iIiiiqqiq{20 if b else 8}sq{20 if s else 8}siqi")
    for b in (False, True)
    for s in (False, True)
}
FIXED_SIZE_V4 = FIXED[False, False].size  # 88: TOTALSIZE .. BODYLEN with IPv4 hosts

# Smallest record: IPv4 hosts, empty body, a 0-byte topic and no properties (the topic length byte and the
# properties length short still count). A record for a real topic is at least 92 bytes.
MIN_RECORD_SIZE: Final = 91  # FIXED_SIZE_V4 + 1 + 2 (a literal, so that compiled modules inline it)
assert MIN_RECORD_SIZE == FIXED_SIZE_V4 + 1 + 2


def store_timestamp_pos(sys_flag: int) -> int:
    """Offset of STORETIMESTAMP, which follows the 8- or 20-byte born host."""
    return _STORE_TIMESTAMP_POS + V6_EXTRA if sys_flag & BORN_V6 else _STORE_TIMESTAMP_POS


def store_host_pos(sys_flag: int) -> int:
    return store_timestamp_pos(sys_flag) + 8


def body_len_pos(sys_flag: int) -> int:
    """Offset of BODYLEN (the body follows it); RECONSUMETIMES and PREPARED_TX_OFFSET are the 12 bytes before."""
    pos = _BODY_LEN_POS
    if sys_flag & BORN_V6:
        pos += V6_EXTRA
    if sys_flag & STORE_V6:
        pos += V6_EXTRA
    return pos


def host_size(sys_flag: int, v6_bit: int) -> int:
    """Bytes of the host whose v6 bit is ``v6_bit`` (ip + int32 port)."""
    return 20 if sys_flag & v6_bit else 8


# STORETIMESTAMP's offset by the born-v6 bit (index ``(sys_flag >> 4) & 1``), for the append loop.
STORE_TIMESTAMP_POS_BY_BORN_V6 = (_STORE_TIMESTAMP_POS, _STORE_TIMESTAMP_POS + V6_EXTRA)
