"""A slave's store: the master's bytes appended verbatim and dispatched as recovery would (txmq.store.replica)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_store import SEGMENT, make_record

from txmq.errors import StoreClosedError
from txmq.protocol.record import SysFlag
from txmq.store.message_store import MessageStore, PutStatus
from txmq.store.replica import ReplicaError


def ship_all(master: MessageStore, slave: MessageStore, chunk: int = 5000) -> int:
    """What the HA driver does: whole-record chunks from the slave's end to the master's end."""
    pos = slave.max_physical_offset()
    while pos < master.max_physical_offset():
        data = master.read_replica_chunk(pos, pos + chunk)
        assert data, f"nothing to ship at {pos}"
        pos = slave.append_replicated(pos, data)
    return pos


def fill(master: MessageStore, n: int) -> None:
    for i in range(n):
        # Three topics, tags and keys, some half messages (no consume-queue entry) and bodies of varied sizes.
        sys_flag = int(SysFlag.TRANSACTION_PREPARED) if i % 7 == 0 else 0
        record = make_record(f"T{i % 3}", i % 2, b"x" * (100 + 37 * (i % 50)), tags=f"tag{i % 4}", keys=f"k{i}")
        record.sys_flag = sys_flag
        assert master.put_sync(record).ok


def master_and_replica(
    make_store: Callable[..., MessageStore], tmp_path: Path, records: int
) -> tuple[MessageStore, MessageStore]:
    """A master store holding ``records`` records (see fill) and an empty replica store."""
    master = make_store(tmp_path / "master")
    slave = make_store(tmp_path / "slave")
    slave.replica = True
    fill(master, records)
    return master, slave


def test_a_replica_is_byte_for_byte_and_serves_the_same_queues(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    # Several 64 KiB segments: blanks at segment ends are shipped too.
    master, slave = master_and_replica(make_store, tmp_path, 400)
    end = ship_all(master, slave)
    assert end == master.max_physical_offset() > 3 * SEGMENT
    for start in range(0, end, SEGMENT):
        size = min(SEGMENT, end - start)
        assert slave.read_bytes(start, size) == master.read_bytes(start, size)
    assert sorted(slave.queues()) == sorted(master.queues())
    for topic, qid in master.queues():
        assert slave.max_offset(topic, qid) == master.max_offset(topic, qid)
        n = master.max_offset(topic, qid)
        assert slave.read_consume_queue(topic, qid, 0, n) == master.read_consume_queue(topic, qid, 0, n)
    assert slave.query_by_key("T1", "k1", 10) == master.query_by_key("T1", "k1", 10)


def test_a_replica_refuses_its_own_puts_and_bad_bytes_and_keeps_its_log(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    master, slave = master_and_replica(make_store, tmp_path, 20)
    assert slave.put_sync(make_record()).status is PutStatus.SERVICE_NOT_AVAILABLE
    data = master.read_replica_chunk(0, 100_000)
    # Not at the slave's end.
    with pytest.raises(ReplicaError, match="ends at 0"):
        slave.append_replicated(100, data)
    # A flipped body byte (CRC), a cut record, garbage.
    corrupt = bytearray(data)
    corrupt[300] ^= 0xFF
    for bad in (bytes(corrupt), data[:-10], b"\x00\x00\x01\x00garbage" * 40):
        with pytest.raises(ReplicaError):
            slave.append_replicated(0, bad)
    assert slave.max_physical_offset() == 0
    # The good bytes still apply afterwards.
    assert slave.append_replicated(0, data) == len(data)


def test_a_replica_reopens_and_continues(make_store: Callable[..., MessageStore], tmp_path: Path) -> None:
    master, slave = master_and_replica(make_store, tmp_path, 100)
    ship_all(master, slave)
    slave.shutdown()
    again = make_store(tmp_path / "slave")
    again.replica = True
    assert again.max_physical_offset() == master.max_physical_offset()
    fill(master, 50)
    ship_all(master, again)
    for topic, qid in master.queues():
        assert again.max_offset(topic, qid) == master.max_offset(topic, qid)


def test_the_durable_callback_comes_once_with_the_end_and_a_closing_replica_refuses(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    master, slave = master_and_replica(make_store, tmp_path, 30)
    data = master.read_replica_chunk(0, 100_000)
    seen: list[int] = []
    end = slave.append_replicated(0, data, seen.append)  # on this thread, once the bytes are durable
    assert end == len(data)
    assert seen == [end]
    # Bad bytes: nothing durable, no call.
    with pytest.raises(ReplicaError):
        slave.append_replicated(end, b"\x00\x00\x01\x00garbage" * 40, seen.append)
    assert seen == [end]
    slave.shutdown()
    with pytest.raises(StoreClosedError):
        slave.append_replicated(end, master.read_replica_chunk(end, end + 100_000))
