"""Restart and recovery: clean restarts, crash images, torn tails, random truncation and bit flips, rebuilding the
consume queues and the index from the commit log, and the cases that must refuse to start."""

from __future__ import annotations

import logging
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_store import (
    SEGMENT,
    assert_consistent,
    crash_image,
    last_segment,
    make_record,
    queue_contents,
    segment_names,
)

from txmq.errors import CorruptStoreError
from txmq.protocol.record import TransactionType, decode_record, encode_record, stamp_record
from txmq.store.checkpoint import Checkpoint, CheckpointState
from txmq.store.entry import SCHEDULE_TOPIC
from txmq.store.message_store import MessageStore, PutResult

MakeStore = Callable[..., MessageStore]


def fill(store: MessageStore, count: int, seed: int = 1) -> list[tuple[PutResult, bytes]]:
    """Mixed traffic: three topics, several queues, half messages, keys, odd body sizes."""
    rnd = random.Random(seed)
    out = []
    for i in range(count):
        body = rnd.randbytes(rnd.randint(1, 2500))
        topic = rnd.choice(["A", "B", "C"])
        sys_flag = TransactionType.PREPARED if i % 7 == 3 else 0
        rec = make_record(topic, rnd.randint(0, 3), body, tags=rnd.choice(["x", "y"]), keys=f"k{i}", uniq=f"U{i:08d}")
        rec.sys_flag = sys_flag
        out.append((store.put_sync(rec), body))
    return out


def check_acked(store: MessageStore, acked: list[tuple[PutResult, bytes]], upto: int | None = None) -> None:
    """Every acknowledged record (ending at or before ``upto``) is readable through its queue, byte for byte."""
    for result, body in acked:
        if upto is not None and result.physical_offset + result.size > upto:
            continue
        data = store.read_record(result.physical_offset, result.size)
        assert data is not None, f"record at {result.physical_offset} lost"
        rec = decode_record(data)
        assert rec.body == body
        if rec.transaction_type is TransactionType.PREPARED:
            continue
        entries = store.read_consume_queue(rec.topic, rec.queue_id, result.queue_offset, 1)
        assert entries and entries[0][:2] == (result.physical_offset, result.size)


def test_clean_restart_does_not_scan(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    acked = fill(store, 120)
    maxima = {q: store.max_offset(*q) for q in store.queues()}
    store.shutdown()
    assert not (tmp_path / "store" / "abort").exists()
    again = make_store()
    info = again.recovery
    assert info.mode == "clean" and info.scanned_bytes == 0 and info.cq_replayed == info.index_replayed == 0
    assert info.log_end == acked[-1][0].physical_offset + acked[-1][0].size
    assert (tmp_path / "store" / "abort").exists()
    check_acked(again, acked)
    assert {q: again.max_offset(*q) for q in again.queues()} == maxima
    nxt = again.put_sync(make_record("A", 0, b"next"))
    assert nxt.queue_offset == maxima[("A", 0)] and nxt.physical_offset == info.log_end


def test_crash_image_recovers_every_acknowledged_record(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    acked = fill(store, 60)
    store.flush()  # a checkpoint in the middle: the rest must come from the scan
    acked += fill(store, 60, seed=2)
    image = crash_image(store, tmp_path / "image")
    recovered = make_store(root=image)
    info = recovered.recovery
    assert info.mode == "crash" and info.truncated_at == -1 and info.stop_reason == "end of data"
    assert info.scan_start <= int(last_segment(image).name)  # at least the whole last segment is verified
    check_acked(recovered, acked)
    assert_consistent(recovered)
    assert queue_contents(recovered) == queue_contents(store)
    more = recovered.put_sync(make_record("B", 1, b"after"))
    assert more.queue_offset == store.max_offset("B", 1)


def test_torn_tail_is_cut_zeroed_and_logged(
    make_store: MakeStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    acked = fill(store, 40)
    end = store.max_physical_offset()
    image = crash_image(store, tmp_path / "image")
    # What a crash in the middle of a write leaves: the first 300 bytes of a record that was never acknowledged.
    torn = encode_record(make_record("A", 0, b"t" * 2000))
    stamp_record(torn, 0, store.max_offset("A", 0), end, 1)
    seg = last_segment(image)
    with open(seg, "r+b") as fh:
        fh.seek(end - int(seg.name))
        fh.write(torn[:300])
    caplog.set_level(logging.WARNING, logger="txmq.store")
    recovered = make_store(root=image)
    info = recovered.recovery
    assert info.log_end == end and info.truncated_at == end and info.truncated_bytes == 300
    assert info.stop_reason.startswith(f"record at {end}")  # the partial record itself is what is rejected
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"cut the torn tail at {end}" in m and "zeroed 300 bytes" in m for m in messages)
    assert seg.read_bytes()[end - int(seg.name) :] == bytes(SEGMENT - (end - int(seg.name)))
    check_acked(recovered, acked)
    assert_consistent(recovered)
    assert recovered.max_physical_offset() == end


def test_segment_filled_after_a_torn_blank_is_dropped(make_store: MakeStore, tmp_path: Path) -> None:
    """Bytes in a new segment while the previous one has no end-of-file blank cannot have been acknowledged."""
    store = make_store()
    acked = fill(store, 20)
    end = store.max_physical_offset()
    image = crash_image(store, tmp_path / "image")
    seg_start = (end // SEGMENT + 1) * SEGMENT
    stray = encode_record(make_record("A", 0, b"stray"))
    stamp_record(stray, 0, 99, seg_start, 1)
    nxt = image / "commitlog" / f"{seg_start:020d}"
    nxt.write_bytes(bytes(stray) + bytes(SEGMENT - len(stray)))
    recovered = make_store(root=image)
    assert recovered.recovery.log_end == end and recovered.recovery.deleted_segments == [str(nxt)]
    assert not nxt.exists()
    check_acked(recovered, acked)
    assert_consistent(recovered)


def _base_image(make_store: MakeStore, tmp_path: Path) -> tuple[Path, list[tuple[PutResult, bytes]]]:
    store = make_store()
    acked = fill(store, 70)
    store.flush()
    acked += fill(store, 40, seed=5)
    image = crash_image(store, tmp_path / "base")
    store.shutdown()
    return image, acked


def assert_nothing_after_end(store: MessageStore, root: Path) -> None:
    """The recovered end is the end of the data: zeros after it in its segment, and no later segment."""
    end = store.max_physical_offset()
    for name in segment_names(root):
        start = int(name)
        data = (root / "commitlog" / name).read_bytes()
        if start >= end:
            assert data == bytes(len(data)), f"segment {name} holds data past the recovered end {end}"
        elif end < start + len(data):
            assert data[end - start :] == bytes(start + len(data) - end), "non-zero bytes after the recovered end"


def test_random_truncation_of_the_last_segment_never_breaks_recovery(make_store: MakeStore, tmp_path: Path) -> None:
    image, acked = _base_image(make_store, tmp_path)
    seg = last_segment(image)
    data_end = max(r.physical_offset + r.size for r, _ in acked) - int(seg.name)
    rnd = random.Random(7)
    for case in range(25):
        work = tmp_path / f"cut{case}"
        shutil.copytree(image, work)
        cut = rnd.randint(0, data_end + 50)
        os.truncate(last_segment(work), cut)
        store = make_store(root=work)
        damage = int(seg.name) + cut
        check_acked(store, acked, upto=damage)
        assert store.max_physical_offset() <= max(damage, int(seg.name))
        assert_consistent(store)
        assert_nothing_after_end(store, work)
        assert store.put_sync(make_record("A", 0, b"still writable")).ok
        store.shutdown()
        shutil.rmtree(work)


def test_random_bit_flips_in_the_last_segment_never_break_recovery(make_store: MakeStore, tmp_path: Path) -> None:
    image, acked = _base_image(make_store, tmp_path)
    base = int(last_segment(image).name)
    data_end = max(r.physical_offset + r.size for r, _ in acked) - base
    rnd = random.Random(11)
    for case in range(30):
        work = tmp_path / f"flip{case}"
        shutil.copytree(image, work)
        path = last_segment(work)
        raw = bytearray(path.read_bytes())
        flips = sorted(rnd.randrange(0, data_end) for _ in range(rnd.randint(1, 4)))
        for pos in flips:
            raw[pos] ^= 1 << rnd.randrange(8)
        path.write_bytes(raw)
        store = make_store(root=work)
        check_acked(store, acked, upto=base + flips[0])
        end = store.max_physical_offset()
        assert end <= base + data_end
        # Whatever is still served is structurally sound (CRC, layout), a damaged record is refused (None), and
        # nothing past the recovered end is visible.
        for entries in queue_contents(store).values():
            for phys, size, _code in entries:
                assert phys + size <= end
                data = store.read_record(phys, size)
                if data is not None:
                    decode_record(data)
        assert_nothing_after_end(store, work)
        store.shutdown()
        shutil.rmtree(work)


def _entries(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    return {q: e for q, e in queue_contents(store).items() if e}


def test_consume_queues_rebuilt_from_the_log_equal_the_live_ones(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    fill(store, 150)
    for i in range(5):  # delivery-time tags codes must be rebuilt too
        store.put_sync(make_record(SCHEDULE_TOPIC, 1, f"d{i}".encode(), DELAY="2", REAL_TOPIC="A"))
    live = _entries(store)
    minima = {q: store.min_offset(*q) for q in live}
    store.shutdown()
    shutil.rmtree(tmp_path / "store" / "consumequeue")
    rebuilt = make_store()
    assert rebuilt.recovery.mode == "clean" and rebuilt.recovery.cq_replay_from == 0
    assert rebuilt.recovery.cq_replayed == sum(len(e) for e in live.values())
    assert _entries(rebuilt) == live
    assert {q: rebuilt.min_offset(*q) for q in live} == minima


def test_consume_queues_and_index_rebuilt_after_a_crash(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    acked = fill(store, 100)
    live = _entries(store)
    image = crash_image(store, tmp_path / "image")
    shutil.rmtree(image / "consumequeue")
    shutil.rmtree(image / "index")
    rebuilt = make_store(root=image)
    assert rebuilt.recovery.mode == "crash"
    assert _entries(rebuilt) == live
    check_acked(rebuilt, acked)
    hit = acked[42][0]
    assert rebuilt.query_by_key(decode_record(rebuilt.read_record(hit.physical_offset)).topic, "U00000042", 5) == [
        hit.physical_offset
    ]


def test_index_rebuilt_after_a_clean_close(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    acked = fill(store, 30)
    store.shutdown()
    shutil.rmtree(tmp_path / "store" / "index")
    again = make_store()
    assert again.recovery.index_replay_from == 0 and again.recovery.cq_replayed == 0
    rec = decode_record(again.read_record(acked[7][0].physical_offset))
    assert again.query_by_key(rec.topic, "k7", 5) == [acked[7][0].physical_offset]


def test_refuses_an_empty_log_that_queues_refer_to(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    fill(store, 10)
    store.shutdown()
    shutil.rmtree(tmp_path / "store" / "commitlog")
    with pytest.raises(CorruptStoreError, match="holds no segment"):
        make_store()


def test_refuses_a_log_with_a_missing_middle_segment(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    fill(store, 120)
    store.shutdown()
    names = segment_names(tmp_path / "store")
    assert len(names) >= 3
    os.unlink(tmp_path / "store" / "commitlog" / names[1])
    with pytest.raises(CorruptStoreError, match="not contiguous"):
        make_store()


def test_a_lost_checkpoint_means_a_verifying_scan(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    acked = fill(store, 50)
    store.shutdown()
    os.unlink(tmp_path / "store" / "checkpoint")
    again = make_store()
    assert again.recovery.mode == "crash" and again.recovery.scanned_records > 0
    check_acked(again, acked)


def test_checkpoint_survives_a_torn_write_of_one_slot(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path / "checkpoint"))
    cp.write(CheckpointState(commit_flushed=100, cq_dispatched=90, index_dispatched=80, physic_msg_timestamp=5))
    cp.write(CheckpointState(commit_flushed=200, cq_dispatched=190, index_dispatched=180, clean=True))
    cp.close()
    assert Checkpoint(str(tmp_path / "checkpoint")).load().commit_flushed == 200
    raw = bytearray((tmp_path / "checkpoint").read_bytes())
    assert len(raw) == 4096
    slot = 512 if raw[512:1024] != bytes(512) and Checkpoint(str(tmp_path / "checkpoint")).load().seq % 2 == 0 else 1024
    raw[slot + 20] ^= 0xFF  # tear the newest slot
    (tmp_path / "checkpoint").write_bytes(raw)
    state = Checkpoint(str(tmp_path / "checkpoint")).load()
    assert state is not None and state.commit_flushed == 100 and not state.clean
    (tmp_path / "checkpoint").write_bytes(bytes(4096))
    assert Checkpoint(str(tmp_path / "checkpoint")).load() is None
