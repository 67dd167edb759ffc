"""The checkpoint file (``<root>/checkpoint``) and the abort marker (``<root>/abort``).

The first 24 bytes keep RocketMQ's layout (physic/logics/index message timestamps). txmq's own recovery points live in
two CRC-protected slots that are written alternately, so a torn checkpoint write always leaves the previous one intact.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass

from txmq.store.commit_log import fsync_dir

log = logging.getLogger("txmq.store")

PAGE_SIZE = 4096
_TIMESTAMPS = struct.Struct(">qqq")
_SLOT_MAGIC = 0x54584350  # "TXCP"
_SLOT_VERSION = 1
# magic version seq flushed cq_dispatched index_dispatched cq_max_phys cq_offset_sum index_max_phys clean
_SLOT = struct.Struct(">IIqqqqqqqB")
_CRC = struct.Struct(">I")
_SLOT_POSITIONS = (512, 1024)  # separate sectors, so writing one cannot tear the other


@dataclass(slots=True)
class CheckpointState:
    """What the store knew to be durable when it last wrote the checkpoint."""

    physic_msg_timestamp: int = 0  # RocketMQ: store time of the last flushed commit-log record
    logics_msg_timestamp: int = 0  # RocketMQ: ... of the last flushed consume-queue entry
    index_msg_timestamp: int = 0  # RocketMQ: ... of the last flushed index entry
    seq: int = 0
    commit_flushed: int = 0  # commit-log bytes below this were fdatasync'ed (a record boundary)
    cq_dispatched: int = 0  # every record below this is in the flushed consume queues
    index_dispatched: int = 0  # every record below this is in the flushed key index
    cq_max_phys: int = -1  # ConsumeQueueStore.max_physical_offset() when written (detects lost CQ files)
    cq_offset_sum: int = -1  # sum of max offsets over all queues when written
    index_max_phys: int = -1  # KeyIndex.max_physical_offset() when written
    clean: bool = False  # written by a clean close: the files match these figures exactly


class Checkpoint:
    """Reads and writes ``<root>/checkpoint``. Not thread-safe: one owner (the append pipeline) writes it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self.state: CheckpointState | None = None  # None when no valid slot was found

    def load(self) -> CheckpointState | None:
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(PAGE_SIZE)
        except FileNotFoundError:
            self.state = None
            return None
        best: CheckpointState | None = None
        for pos in _SLOT_POSITIONS:
            state = _decode_slot(data, pos)
            if state is not None and (best is None or state.seq > best.seq):
                best = state
        if best is None:
            log.warning("checkpoint %s has no valid slot; recovery will verify more of the commit log", self.path)
        elif len(data) >= _TIMESTAMPS.size:
            best.physic_msg_timestamp, best.logics_msg_timestamp, best.index_msg_timestamp = _TIMESTAMPS.unpack_from(
                data, 0
            )
        self.state = best
        return best

    def write(self, state: CheckpointState) -> None:
        """Persist ``state`` (fdatasync'ed) in the slot the previous write did not use."""
        if self._fd is None:
            existed = os.path.exists(self.path)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size < PAGE_SIZE:
                os.ftruncate(self._fd, PAGE_SIZE)
            if not existed:
                os.fsync(self._fd)
                fsync_dir(os.path.dirname(self.path) or ".")
        prev = self.state.seq if self.state is not None else 0
        state.seq = max(state.seq, prev) + 1
        slot = _SLOT.pack(
            _SLOT_MAGIC,
            _SLOT_VERSION,
            state.seq,
            state.commit_flushed,
            state.cq_dispatched,
            state.index_dispatched,
            state.cq_max_phys,
            state.cq_offset_sum,
            state.index_max_phys,
            1 if state.clean else 0,
        )
        os.pwrite(self._fd, slot + _CRC.pack(zlib.crc32(slot)), _SLOT_POSITIONS[state.seq % 2])
        stamps = (state.physic_msg_timestamp, state.logics_msg_timestamp, state.index_msg_timestamp)
        os.pwrite(self._fd, _TIMESTAMPS.pack(*stamps), 0)
        os.fdatasync(self._fd)
        self.state = state

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _decode_slot(data: bytes, pos: int) -> CheckpointState | None:
    end = pos + _SLOT.size
    if len(data) < end + _CRC.size:
        return None
    (crc,) = _CRC.unpack_from(data, end)
    if zlib.crc32(data[pos:end]) != crc:
        return None
    magic, version, seq, flushed, cq_disp, idx_disp, cq_max, cq_sum, idx_max, clean = _SLOT.unpack_from(data, pos)
    if magic != _SLOT_MAGIC or version != _SLOT_VERSION or min(flushed, cq_disp, idx_disp) < 0:
        return None
    return CheckpointState(
        seq=seq,
        commit_flushed=flushed,
        cq_dispatched=cq_disp,
        index_dispatched=idx_disp,
        cq_max_phys=cq_max,
        cq_offset_sum=cq_sum,
        index_max_phys=idx_max,
        clean=bool(clean),
    )


class AbortMarker:
    """``<root>/abort``: present while the store is open, so its presence at start means the last run crashed."""

    def __init__(self, path: str) -> None:
        self.path = path

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def create(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        fsync_dir(os.path.dirname(self.path) or ".")

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        fsync_dir(os.path.dirname(self.path) or ".")
