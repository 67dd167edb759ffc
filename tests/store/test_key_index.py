"""Key index: lookups by UNIQ_KEY and KEYS tokens, time ranges, segments, truncation, retention, crash reopen."""

from __future__ import annotations

import os
import tempfile
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.errors import StoreClosedError, StoreError
from txmq.store.dispatch import DispatchRequest
from txmq.store.key_index import KeyIndex, _Segment

SIZE = 100
FOREVER = (0, 2**62)


def rec(
    n: int,
    *,
    uniq: str | None = None,
    keys: str | None = None,
    topic: str = "T",
    ts: int | None = None,
    sys_flag: int = 0,
) -> DispatchRequest:
    """The n-th record: commit-log offset n * SIZE, store time 1000 + n unless given."""
    return DispatchRequest(
        topic=topic,
        queue_id=0,
        queue_offset=n,
        physical_offset=n * SIZE,
        size=SIZE,
        tags_code=0,
        store_timestamp=1000 + n if ts is None else ts,
        sys_flag=sys_flag,
        keys=keys,
        uniq_key=uniq,
    )


def offsets(*ns: int) -> list[int]:
    return [n * SIZE for n in ns]


def segment_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.isdigit())


def test_query_by_uniq_key_and_each_keys_token(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=64, max_entries=100)
    index.put(
        [
            rec(0, uniq="U0", keys="order-1 customer-7"),
            rec(1, uniq="U1", keys="order-2"),
            rec(2, uniq="U2", keys="customer-7  order-3"),  # a double space is not a key
            rec(3, uniq="U3", keys="order-1", topic="Other"),
        ]
    )
    assert index.query("T", "U1", 10, *FOREVER) == offsets(1)
    assert index.query("T", "order-1", 10, *FOREVER) == offsets(0)
    assert index.query("T", "customer-7", 10, *FOREVER) == offsets(2, 0)  # newest first
    assert index.query("T", "order-3", 10, *FOREVER) == offsets(2)
    assert index.query("Other", "order-1", 10, *FOREVER) == offsets(3)
    assert index.query("Other", "U0", 10, *FOREVER) == []
    assert index.query("T", "", 10, *FOREVER) == []
    assert index.query("T", "nope", 10, *FOREVER) == []


def test_time_range_and_max_num(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=8, max_entries=1000)
    index.put([rec(n, keys="hot", ts=10 * n) for n in range(50)])
    assert index.query("T", "hot", 5, *FOREVER) == offsets(49, 48, 47, 46, 45)
    assert index.query("T", "hot", 100, 100, 140) == offsets(14, 13, 12, 11, 10)
    assert index.query("T", "hot", 2, 100, 140) == offsets(14, 13)
    assert index.query("T", "hot", 10, 101, 109) == []
    assert index.query("T", "hot", 0, *FOREVER) == []
    assert index.query("T", "hot", 10, 200, 100) == []


def test_record_types_and_duplicate_keys(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=16, max_entries=100)
    index.put(
        [
            rec(0, uniq="A", keys="A A", sys_flag=0x0),  # the same key three times: one entry
            rec(1, uniq="P", sys_flag=0x4),  # prepared (half) messages are indexed
            rec(2, uniq="R", sys_flag=0xC),  # rolled back: not indexed
            rec(3, sys_flag=0x8),  # no keys at all
        ]
    )
    assert index.query("T", "A", 10, *FOREVER) == offsets(0)
    assert index.query("T", "P", 10, *FOREVER) == offsets(1)
    assert index.query("T", "R", 10, *FOREVER) == []
    assert index.max_physical_offset() == 4 * SIZE


def test_segments_roll_and_survive_reopen(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=4, max_entries=5)
    for n in range(23):
        index.put([rec(n, uniq=f"U{n}", keys="all")])
    assert len(segment_files(tmp_path)) == 10  # 46 entries, 5 per segment
    assert index.query("T", "all", 100, *FOREVER) == offsets(*range(22, -1, -1))
    index.close()

    reopened = KeyIndex(tmp_path, slot_count=4, max_entries=5)
    assert reopened.max_physical_offset() == 23 * SIZE
    assert reopened.query("T", "U7", 10, *FOREVER) == offsets(7)
    assert reopened.query("T", "all", 100, *FOREVER) == offsets(*range(22, -1, -1))
    reopened.put([rec(23, uniq="U23", keys="all")])
    assert reopened.query("T", "all", 3, *FOREVER) == offsets(23, 22, 21)
    reopened.close()


def test_replay_below_the_durable_point_is_skipped(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=8, max_entries=11)
    batch = [rec(n, keys="k") for n in range(10)]
    index.put(batch)
    index.put([*batch[5:], rec(10, keys="k")])
    assert index.query("T", "k", 100, *FOREVER) == offsets(*range(10, -1, -1))
    assert len(segment_files(tmp_path)) == 1  # 11 entries: the replayed five took no room


def test_unflushed_entries_are_dropped_after_a_crash_and_replayed(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=8, max_entries=6)
    index.put([rec(n, uniq=f"U{n}", keys="k") for n in range(4)])  # 8 entries: two segments
    index.flush()
    index.put([rec(n, uniq=f"U{n}", keys="k") for n in range(4, 9)])  # never flushed
    # A second instance stands in for the broker after kill -9.
    after_crash = KeyIndex(tmp_path, slot_count=8, max_entries=6)
    assert after_crash.max_physical_offset() == 4 * SIZE
    assert after_crash.query("T", "k", 100, *FOREVER) == offsets(3, 2, 1, 0)
    assert after_crash.query("T", "U6", 10, *FOREVER) == []
    # Recovery replays from the durable point; nothing ends up twice.
    after_crash.put([rec(n, uniq=f"U{n}", keys="k") for n in range(2, 9)])
    assert after_crash.query("T", "k", 100, *FOREVER) == offsets(*range(8, -1, -1))
    assert after_crash.query("T", "U6", 10, *FOREVER) == offsets(6)
    after_crash.close()
    index.close()


def test_lost_pages_past_the_durable_point_force_a_relink(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=4, max_entries=100)
    index.put([rec(n, uniq=f"U{n}") for n in range(10)])
    index.flush()
    index.put([rec(n, uniq=f"U{n}") for n in range(10, 20)])
    index.close()  # flushed, but we now pretend the OS lost the tail and the durable marker was older
    seg = _Segment(tmp_path / segment_files(tmp_path)[0], 0, 4, 100)
    with open(seg.path, "r+b") as fh:
        for start, width in ((seg._hash_at, 8), (seg._prev_at, 4)):
            fh.seek(start + 11 * width)
            fh.write(bytes(10 * width))  # entries 11..20 (records 10..19) became zeros
    marker = tmp_path / ".durable"
    head = (10 * SIZE).to_bytes(8, "little")
    marker.write_bytes(head + zlib.crc32(head).to_bytes(4, "little"))
    reopened = KeyIndex(tmp_path, slot_count=4, max_entries=100)
    assert reopened.max_physical_offset() == 10 * SIZE
    for n in range(10):
        assert reopened.query("T", f"U{n}", 10, *FOREVER) == offsets(n)
    assert reopened.query("T", "U15", 10, *FOREVER) == []
    reopened.put([rec(n, uniq=f"U{n}") for n in range(10, 20)])
    assert all(reopened.query("T", f"U{n}", 10, *FOREVER) == offsets(n) for n in range(20))


def test_damaged_last_segment_header_is_dropped(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=4, max_entries=3)
    index.put([rec(n, uniq=f"U{n}") for n in range(3)])
    index.flush()
    index.put([rec(3, uniq="U3")])  # rolls to a second segment, never flushed
    index.close()
    last = tmp_path / segment_files(tmp_path)[-1]
    with open(last, "r+b") as fh:
        fh.write(bytes(64))
    reopened = KeyIndex(tmp_path, slot_count=4, max_entries=3)
    assert segment_files(tmp_path) == segment_files(tmp_path)[:1]
    assert reopened.query("T", "U2", 10, *FOREVER) == offsets(2)


def test_truncate_after(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=4, max_entries=4)
    index.put([rec(n, uniq=f"U{n}", keys="k") for n in range(10)])  # 20 entries, 5 segments
    index.flush()
    index.truncate_after(5 * SIZE)
    assert index.max_physical_offset() == 5 * SIZE
    assert index.query("T", "k", 100, *FOREVER) == offsets(4, 3, 2, 1, 0)
    assert index.query("T", "U7", 10, *FOREVER) == []
    assert len(segment_files(tmp_path)) == 3
    index.put([rec(n, uniq=f"V{n}", keys="k") for n in range(5, 7)])
    assert index.query("T", "k", 3, *FOREVER) == offsets(6, 5, 4)
    index.close()
    reopened = KeyIndex(tmp_path, slot_count=4, max_entries=4)
    assert reopened.query("T", "k", 100, *FOREVER) == offsets(6, 5, 4, 3, 2, 1, 0)
    assert reopened.query("T", "V6", 10, *FOREVER) == offsets(6)
    reopened.truncate_after(0)
    assert reopened.query("T", "k", 100, *FOREVER) == []
    assert reopened.max_physical_offset() == 0
    assert segment_files(tmp_path) == []


def test_truncate_is_durable_without_flush(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=4, max_entries=100)
    index.put([rec(n, uniq=f"U{n}") for n in range(10)])
    index.flush()
    index.truncate_after(3 * SIZE)
    reopened = KeyIndex(tmp_path, slot_count=4, max_entries=100)
    assert reopened.max_physical_offset() == 3 * SIZE
    assert reopened.query("T", "U5", 10, *FOREVER) == []
    assert reopened.query("T", "U2", 10, *FOREVER) == offsets(2)


def test_delete_before_drops_whole_segments(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=4, max_entries=4)
    index.put([rec(n, uniq=f"U{n}") for n in range(10)])  # segments: 0-3, 4-7, 8-9
    index.delete_before(6 * SIZE)  # only the first segment lies wholly below
    assert len(segment_files(tmp_path)) == 2
    assert index.query("T", "U3", 10, *FOREVER) == []
    assert index.query("T", "U4", 10, *FOREVER) == offsets(4)  # still in a kept segment
    index.delete_before(100 * SIZE)
    assert segment_files(tmp_path) == []
    assert index.query("T", "U9", 10, *FOREVER) == []
    index.put([rec(10, uniq="U10")])
    assert index.query("T", "U10", 10, *FOREVER) == offsets(10)
    index.close()
    assert KeyIndex(tmp_path, slot_count=4, max_entries=4).query("T", "U10", 10, *FOREVER) == offsets(10)


def test_queries_while_writing_see_every_completed_put(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=64, max_entries=300)
    done = threading.Event()
    problems: list[str] = []
    written = 0  # records whose put() has returned

    def reader() -> None:
        while not done.is_set():
            n = written - 1
            if n < 0:
                continue
            if index.query("T", f"U{n}", 5, *FOREVER) != offsets(n):
                problems.append(f"U{n} missing")
            got = index.query("T", "k", 3, *FOREVER)
            if got and got != sorted(got, reverse=True):
                problems.append(f"not newest first: {got}")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for lo in range(0, 2_000, 7):
            index.put([rec(n, uniq=f"U{n}", keys="k") for n in range(lo, lo + 7)])
            written = lo + 7
    finally:
        done.set()
        thread.join()
    assert problems == []


def test_closed_index_refuses_work(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slot_count=4, max_entries=4)
    index.close()
    index.close()
    with pytest.raises(StoreClosedError):
        index.put([rec(0, uniq="U")])
    with pytest.raises(StoreClosedError):
        index.query("T", "U", 1, *FOREVER)


def test_fresh_index_is_empty(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path)
    assert index.max_physical_offset() == 0
    assert index.query("T", "x", 10, *FOREVER) == []
    index.close()
    assert os.listdir(tmp_path) == [".durable"]


# --------------------------------------------------------------------------------------- model-based check

KEYS = ["a", "b", "c", "d"]
record_strategy = st.tuples(
    st.sampled_from(["T", "U"]),
    st.lists(st.sampled_from(KEYS), max_size=3),
    st.sampled_from([0x0, 0x4, 0x8, 0xC]),
    st.integers(min_value=0, max_value=3),  # store-time step
)


@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(record_strategy, max_size=30),
    queries=st.lists(
        st.tuples(
            st.sampled_from(["T", "U"]),
            st.sampled_from(KEYS),
            st.integers(min_value=1, max_value=8),
            st.integers(min_value=0, max_value=60),
            st.integers(min_value=0, max_value=60),
        ),
        max_size=8,
    ),
    reopen_at=st.integers(min_value=0, max_value=30),
    cut=st.integers(min_value=0, max_value=35),
)
def test_matches_a_brute_force_model(
    records: list[tuple[str, list[str], int, int]],
    queries: list[tuple[str, str, int, int, int]],
    reopen_at: int,
    cut: int,
) -> None:
    model: list[tuple[str, set[str], int, int]] = []  # (topic, keys, phys, ts) of indexed records
    with tempfile.TemporaryDirectory() as root:
        # Two slots and three entries per segment: collisions and segment rolls on every example.
        index = KeyIndex(root, slot_count=2, max_entries=3)
        ts = 0
        for n, (topic, keys, sys_flag, step) in enumerate(records):
            ts += step
            index.put([rec(n, keys=" ".join(keys) or None, topic=topic, ts=ts, sys_flag=sys_flag)])
            if sys_flag != 0xC and keys:
                model.append((topic, set(keys), n * SIZE, ts))
            if n == reopen_at:
                index.close()
                index = KeyIndex(root, slot_count=2, max_entries=3)
        index.truncate_after(cut * SIZE)
        model = [m for m in model if m[2] < cut * SIZE]
        for topic, key, max_num, begin, end in queries:
            want = [p for t, ks, p, s in reversed(model) if t == topic and key in ks and begin <= s <= end]
            assert index.query(topic, key, max_num, begin, end) == want[:max_num]
        index.close()


def test_entries_get_disk_blocks_before_they_are_written(tmp_path: Path) -> None:
    # The segment file is sparse; blocks are reserved (fallocate) ahead of the entries, so a full disk fails a put
    # with ENOSPC instead of killing the process with SIGBUS on a store into a hole of the mapping.
    index = KeyIndex(tmp_path, slot_count=1000, max_entries=1_000_000)
    index.put([rec(n, uniq=f"U{n}") for n in range(10)])
    [name] = segment_files(tmp_path)
    seg = _Segment(tmp_path / name, 0, 1000, 1_000_000)
    reserved_bytes = seg._hash_at + 28 * 65_536  # header and slots, then 64 Ki entries of 8+8+8+4 bytes
    allocated = os.stat(tmp_path / name).st_blocks * 512
    assert reserved_bytes <= allocated < seg.file_size // 4
    index.close()


def test_a_full_disk_fails_the_put_and_the_index_stays_usable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = KeyIndex(tmp_path, slot_count=64, max_entries=200_000)
    index.put([rec(0, uniq="U0")])
    calls: list[tuple[int, int, int]] = []

    def no_space(fd: int, offset: int, length: int) -> None:
        calls.append((fd, offset, length))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(StoreError, match="cannot grow"):
        index.put([rec(n, uniq=f"U{n}") for n in range(1, 70_000)])  # past the first reservation
    assert calls
    monkeypatch.undo()
    assert index.query("T", "U0", 10, *FOREVER) == offsets(0)
    index.put([rec(n, uniq=f"U{n}") for n in range(70_000, 70_010)])
    assert index.query("T", "U70009", 10, *FOREVER) == offsets(70_009)
    index.close()
