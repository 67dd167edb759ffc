"""Consume-queue store: layout, recovery on reopen, concurrent reads, truncation, retention, time search."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.errors import StoreClosedError, StoreError
from txmq.store.consume_queue import ENTRY_SIZE, ConsumeQueueStore
from txmq.store.dispatch import DispatchRequest

SIZE = 100  # every test record is 100 bytes long


def phys_of(n: int) -> int:
    """Commit-log offset of the n-th record written by these tests (all records are SIZE bytes)."""
    return n * SIZE


def dispatch(
    queue_offset: int,
    n: int,
    *,
    topic: str = "T",
    queue_id: int = 0,
    tags: int = 7,
    sys_flag: int = 0,
    size: int = SIZE,
) -> DispatchRequest:
    return DispatchRequest(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=phys_of(n),
        size=size,
        tags_code=tags,
        store_timestamp=1_000 + n,
        sys_flag=sys_flag,
    )


def fill(store: ConsumeQueueStore, count: int, *, batch: int = 10, queue_id: int = 0, start: int = 0) -> None:
    """Append `count` entries to T/queue_id; entry k points at record k (tags = k)."""
    for lo in range(start, start + count, batch):
        hi = min(lo + batch, start + count)
        store.put([dispatch(k, k, queue_id=queue_id, tags=k) for k in range(lo, hi)])


def expected(k: int) -> tuple[int, int, int]:
    return (phys_of(k), SIZE, k)


def cq_files(root: Path, topic: str = "T", queue_id: int = 0) -> list[str]:
    return sorted(p.name for p in (root / topic / str(queue_id)).iterdir())


def test_round_trip_across_files_and_reopen(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=8)
    fill(store, 30, batch=7)
    assert store.max_offset("T", 0) == 30
    assert store.min_offset("T", 0) == 0
    assert store.read("T", 0, 0, 100) == [expected(k) for k in range(30)]
    assert store.read("T", 0, 5, 10) == [expected(k) for k in range(5, 15)]  # spans files 0 and 1
    assert cq_files(tmp_path) == [f"{8 * i * ENTRY_SIZE:020d}" for i in range(4)]
    assert store.max_physical_offset() == phys_of(30)
    store.close()

    reopened = ConsumeQueueStore(tmp_path, entries_per_file=8)
    assert reopened.queues() == [("T", 0)]
    assert reopened.max_offset("T", 0) == 30
    assert reopened.read("T", 0, 0, 100) == [expected(k) for k in range(30)]
    assert reopened.max_physical_offset() == phys_of(30)
    fill(reopened, 5, start=30)
    assert reopened.read("T", 0, 28, 10) == [expected(k) for k in range(28, 35)]
    reopened.close()


def test_entry_bytes_follow_rocketmq_layout(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path)
    store.put([dispatch(0, 3, tags=-2)])
    store.close()
    raw = (tmp_path / "T" / "0" / ("0" * 20)).read_bytes()
    assert raw == (300).to_bytes(8, "big") + SIZE.to_bytes(4, "big") + (-2).to_bytes(8, "big", signed=True)


def test_out_of_range_and_unknown_queues(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 6)
    assert store.read("T", 0, 6, 10) == []
    assert store.read("T", 0, -1, 10) == []
    assert store.read("T", 0, 0, 0) == []
    assert store.read("nope", 0, 0, 10) == []
    assert store.max_offset("nope", 3) == 0
    assert store.min_offset("nope", 3) == 0
    assert store.earliest_entry("nope", 3) is None
    assert store.earliest_entry("T", 0) == expected(0)
    assert store.search_by_timestamp("nope", 0, 5, lambda p, s: 0) == 0


def test_only_not_and_commit_types_get_entries(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path)
    store.put(
        [
            dispatch(0, 0, sys_flag=0x0),
            dispatch(0, 1, sys_flag=0x4),  # prepared: no entry
            dispatch(1, 2, sys_flag=0x8),
            dispatch(0, 3, sys_flag=0xC),  # rollback: no entry
        ]
    )
    assert [e[0] for e in store.read("T", 0, 0, 10)] == [phys_of(0), phys_of(2)]
    # Records without an entry still count as handled, so recovery does not redo them.
    assert store.max_physical_offset() == phys_of(4)


def test_queues_are_independent(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    store.put([dispatch(i // 2, i, queue_id=i % 2) for i in range(10)] + [dispatch(0, 10, topic="U", queue_id=3)])
    assert sorted(store.queues()) == [("T", 0), ("T", 1), ("U", 3)]
    assert [e[0] for e in store.read("T", 1, 0, 10)] == [phys_of(i) for i in range(1, 10, 2)]
    assert store.max_offset("U", 3) == 1


def test_redispatch_of_identical_entries_is_skipped(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 10)
    # Recovery replays from somewhere before the end: old entries match, new ones append.
    store.put([dispatch(k, k, tags=k) for k in range(6, 13)])
    assert store.max_offset("T", 0) == 13
    assert store.read("T", 0, 0, 20) == [expected(k) for k in range(13)]


def test_redispatch_that_disagrees_cuts_the_queue(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 10)
    # The commit log says offset 5 is a different record: it wins, and what followed is gone.
    store.put([dispatch(5, 50, tags=99)])
    assert store.max_offset("T", 0) == 6
    assert store.read("T", 0, 4, 10) == [expected(4), (phys_of(50), SIZE, 99)]
    store.close()
    reopened = ConsumeQueueStore(tmp_path, entries_per_file=4)
    assert reopened.max_offset("T", 0) == 6
    assert reopened.read("T", 0, 5, 10) == [(phys_of(50), SIZE, 99)]


def test_gap_raises_before_anything_is_written(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path)
    fill(store, 3)
    with pytest.raises(StoreError, match="gap"):
        store.put([dispatch(0, 10, queue_id=1), dispatch(3, 11), dispatch(5, 12)])
    assert store.max_offset("T", 0) == 3
    assert store.max_offset("T", 1) == 0
    assert store.max_physical_offset() == phys_of(3)


def test_empty_queue_may_start_at_any_offset(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    store.put([dispatch(6, 0), dispatch(7, 1)])
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (6, 8)
    assert store.read("T", 0, 5, 10) == []
    assert [e[0] for e in store.read("T", 0, 6, 10)] == [phys_of(0), phys_of(1)]
    store.close()
    reopened = ConsumeQueueStore(tmp_path, entries_per_file=4)
    assert (reopened.min_offset("T", 0), reopened.max_offset("T", 0)) == (6, 8)


def test_concurrent_reader_never_sees_a_torn_entry(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=50)
    total = 5_000
    done = threading.Event()
    problems: list[str] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not done.is_set() or reads == 0:
            high = store.max_offset("T", 0)
            start = max(0, high - 40)
            got = store.read("T", 0, start, 64)
            reads += 1
            if len(got) < high - start:
                problems.append(f"read {len(got)} entries at {start} below published max {high}")
            for k, entry in enumerate(got, start):
                if entry != expected(k):
                    problems.append(f"offset {k}: {entry}")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        fill(store, total, batch=13)
    finally:
        done.set()
        thread.join()
    assert problems == []
    assert reads > 0
    assert store.read("T", 0, total - 1, 5) == [expected(total - 1)]


def test_reads_racing_with_retention_return_only_true_entries(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=10)
    fill(store, 200)
    done = threading.Event()
    problems: list[str] = []

    def reader() -> None:
        offset = 0
        while not done.is_set():
            # Lagging consumer: re-reads from wherever the queue now starts, across files being deleted.
            got = store.read("T", 0, offset, 25)
            problems.extend(f"offset {k}: {e}" for k, e in enumerate(got, offset) if e != expected(k))
            offset = store.min_offset("T", 0) if not got else offset + 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for k in range(200, 400, 5):
            fill(store, 5, start=k)
            store.correct_min_offset(phys_of(k - 150))
    finally:
        done.set()
        thread.join()
    assert problems == []
    assert store.min_offset("T", 0) == 245
    store.flush()  # the newest entries may still wait in memory
    assert len(cq_files(tmp_path)) == 16  # files from offset 240 on


def test_truncate_after_drops_entries_at_and_beyond_phys(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    # Queue 0 holds even records, queue 1 odd ones.
    store.put([dispatch(i // 2, i, queue_id=i % 2) for i in range(20)])
    store.flush()
    store.truncate_after(phys_of(9))
    assert store.max_offset("T", 0) == 5  # records 0,2,4,6,8
    assert store.max_offset("T", 1) == 4  # records 1,3,5,7
    assert store.max_physical_offset() == phys_of(9)
    assert cq_files(tmp_path, "T", 0) == [f"{0:020d}", f"{4 * ENTRY_SIZE:020d}"]
    # Appending carries on from the cut.
    store.put([dispatch(5, 9, queue_id=0), dispatch(4, 10, queue_id=1)])
    assert store.read("T", 0, 4, 10) == [(phys_of(8), SIZE, 7), (phys_of(9), SIZE, 7)]
    store.close()
    reopened = ConsumeQueueStore(tmp_path, entries_per_file=4)
    assert reopened.max_offset("T", 0) == 6
    assert reopened.max_offset("T", 1) == 5


def test_truncate_at_a_file_boundary_keeps_an_empty_file(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 10)
    store.truncate_after(phys_of(8))
    assert store.max_offset("T", 0) == 8
    store.truncate_after(phys_of(4))
    assert store.max_offset("T", 0) == 4
    assert cq_files(tmp_path) == [f"{0:020d}", f"{4 * ENTRY_SIZE:020d}"]
    assert (tmp_path / "T" / "0" / f"{4 * ENTRY_SIZE:020d}").stat().st_size == 0
    store.truncate_after(0)
    assert store.max_offset("T", 0) == 0
    assert store.max_physical_offset() == 0
    store.close()
    assert ConsumeQueueStore(tmp_path, entries_per_file=4).max_offset("T", 0) == 0


def test_correct_min_offset_retires_entries_and_whole_files(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 14)
    store.correct_min_offset(phys_of(9) + 1)  # first surviving entry: record 10
    assert store.min_offset("T", 0) == 10
    assert store.max_offset("T", 0) == 14
    assert store.earliest_entry("T", 0) == expected(10)
    assert store.read("T", 0, 9, 5) == []
    assert store.read("T", 0, 10, 2) == [expected(10), expected(11)]
    # Files 0 and 1 lie wholly below offset 10; file 2 holds it.
    assert cq_files(tmp_path) == [f"{8 * ENTRY_SIZE:020d}", f"{12 * ENTRY_SIZE:020d}"]
    store.correct_min_offset(phys_of(3))  # never moves backwards
    assert store.min_offset("T", 0) == 10
    store.close()

    reopened = ConsumeQueueStore(tmp_path, entries_per_file=4)
    assert reopened.min_offset("T", 0) == 8  # file granularity until retention runs again
    reopened.correct_min_offset(phys_of(10))
    assert reopened.min_offset("T", 0) == 10


def test_correct_min_offset_past_everything_keeps_max(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 10)
    store.correct_min_offset(phys_of(100))
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (10, 10)
    assert store.read("T", 0, 9, 5) == []
    assert store.earliest_entry("T", 0) is None
    assert cq_files(tmp_path) == [f"{8 * ENTRY_SIZE:020d}"]
    fill(store, 2, start=10)
    assert store.read("T", 0, 10, 5) == [expected(10), expected(11)]
    store.close()
    reopened = ConsumeQueueStore(tmp_path, entries_per_file=4)
    assert reopened.max_offset("T", 0) == 12


def test_partial_trailing_entry_is_dropped_on_reopen(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=8)
    fill(store, 11)
    store.close()
    tail = tmp_path / "T" / "0" / f"{8 * ENTRY_SIZE:020d}"
    with open(tail, "ab") as fh:
        fh.write(b"\x00\x00\x00\x00\x00\x00\x04\x4c\x00\x00")  # half an entry
    reopened = ConsumeQueueStore(tmp_path, entries_per_file=8)
    assert reopened.max_offset("T", 0) == 11
    assert tail.stat().st_size == 3 * ENTRY_SIZE
    fill(reopened, 1, start=11)
    assert reopened.read("T", 0, 10, 5) == [expected(10), expected(11)]


def test_unwritten_tail_is_cut_at_the_first_invalid_entry(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=8)
    fill(store, 14)
    store.close()
    path = tmp_path / "T" / "0" / f"{8 * ENTRY_SIZE:020d}"
    data = bytearray(path.read_bytes())
    # Entry 11 never reached the disk (zeros) but entries 12 and 13 did; the file also grew by two zero slots.
    data[3 * ENTRY_SIZE : 4 * ENTRY_SIZE] = bytes(ENTRY_SIZE)
    path.write_bytes(bytes(data) + bytes(2 * ENTRY_SIZE))
    reopened = ConsumeQueueStore(tmp_path, entries_per_file=8)
    assert reopened.max_offset("T", 0) == 11
    assert reopened.read("T", 0, 0, 100) == [expected(k) for k in range(11)]


def test_hole_in_the_second_to_last_file_ends_the_queue(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 10)  # files at 0, 4, 8
    store.close()
    path = tmp_path / "T" / "0" / f"{4 * ENTRY_SIZE:020d}"
    data = bytearray(path.read_bytes())
    data[2 * ENTRY_SIZE : 3 * ENTRY_SIZE] = bytes(ENTRY_SIZE)  # entry 6 was never written back
    path.write_bytes(bytes(data))
    reopened = ConsumeQueueStore(tmp_path, entries_per_file=4)
    assert reopened.max_offset("T", 0) == 6
    assert cq_files(tmp_path) == [f"{0:020d}", f"{4 * ENTRY_SIZE:020d}"]
    fill(reopened, 4, start=6)
    assert reopened.read("T", 0, 0, 20) == [expected(k) for k in range(10)]


def test_redispatch_below_min_offset_is_ignored(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 10)
    store.correct_min_offset(phys_of(6))
    # Replay of retired records (their files may be gone) neither fails nor cuts the queue.
    store.put([dispatch(k, k, tags=k) for k in range(2, 11)])
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (6, 11)
    assert store.read("T", 0, 6, 10) == [expected(k) for k in range(6, 11)]


def test_negative_size_marks_the_end(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=8)
    fill(store, 5)
    store.close()
    path = tmp_path / "T" / "0" / f"{0:020d}"
    data = bytearray(path.read_bytes())
    data[3 * ENTRY_SIZE + 8 : 3 * ENTRY_SIZE + 12] = (-5).to_bytes(4, "big", signed=True)
    path.write_bytes(bytes(data))
    assert ConsumeQueueStore(tmp_path, entries_per_file=8).max_offset("T", 0) == 3


def test_short_middle_file_ends_the_queue(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 14)
    store.close()
    os.truncate(tmp_path / "T" / "0" / f"{0:020d}", 2 * ENTRY_SIZE)
    reopened = ConsumeQueueStore(tmp_path, entries_per_file=4)
    assert reopened.max_offset("T", 0) == 2
    assert cq_files(tmp_path) == [f"{0:020d}"]


def test_durable_point_survives_only_flushed_puts(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=4)
    fill(store, 6)
    store.flush()
    fill(store, 4, start=6)
    assert store.max_physical_offset() == phys_of(10)
    # A second instance stands in for the broker after kill -9: the last put was never flushed.
    after_crash = ConsumeQueueStore(tmp_path, entries_per_file=4)
    assert after_crash.max_physical_offset() == phys_of(6)
    assert after_crash.max_offset("T", 0) == 6  # entries appended after the flush still waited in memory
    # Recovery replays from the durable point; the replay is idempotent.
    fill(after_crash, 4, start=6)
    assert after_crash.read("T", 0, 0, 20) == [expected(k) for k in range(10)]
    store.close()
    after_crash.close()


def test_truncate_lowers_the_durable_point_at_once(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path)
    fill(store, 10)
    store.flush()
    store.truncate_after(phys_of(4))
    assert ConsumeQueueStore(tmp_path).max_physical_offset() == phys_of(4)


def test_empty_store(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path)
    assert store.max_physical_offset() == 0
    assert store.queues() == []
    store.truncate_after(0)
    store.correct_min_offset(0)
    store.close()
    assert ConsumeQueueStore(tmp_path).max_physical_offset() == 0


def test_closed_store_refuses_work(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosedError):
        store.put([dispatch(0, 0)])
    with pytest.raises(StoreClosedError):
        store.read("T", 0, 0, 1)


# --------------------------------------------------------------------------------------- search_by_timestamp


def nearest_by_brute_force(times: list[int], base: int, timestamp: int) -> int:
    if not times:
        return 0
    for i, t in enumerate(times):
        if t == timestamp:
            return base + i
    older = [i for i, t in enumerate(times) if t < timestamp]
    newer = [i for i, t in enumerate(times) if t > timestamp]
    if not older:
        return base + newer[0]
    if not newer:
        return base + older[-1]
    left, right = older[-1], newer[0]
    return base + (right if timestamp - times[left] > times[right] - timestamp else left)


@settings(max_examples=150, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=0, max_value=5), max_size=25),
    retired=st.integers(min_value=0, max_value=30),
    timestamp=st.integers(min_value=-2, max_value=80),
)
def test_search_by_timestamp_matches_brute_force(gaps: list[int], retired: int, timestamp: int) -> None:
    times = []
    now = 0
    for gap in gaps:
        now += gap
        times.append(now)
    retired = min(retired, len(times))
    with tempfile.TemporaryDirectory() as root:
        store = ConsumeQueueStore(root, entries_per_file=3)
        if times:
            store.put([dispatch(k, k) for k in range(len(times))])
            store.correct_min_offset(phys_of(retired))
        store_time = {phys_of(k): t for k, t in enumerate(times)}
        found = store.search_by_timestamp("T", 0, timestamp, lambda phys, size: store_time[phys])
        live = times[retired:]
        want = nearest_by_brute_force(live, retired, timestamp) if live else 0
        store.close()
    assert found == want


def test_search_by_timestamp_examples(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=3)
    times = [10, 20, 20, 20, 30, 45]
    store.put([dispatch(k, k) for k in range(len(times))])
    calls: list[int] = []

    def store_time_of(phys: int, size: int) -> int:
        assert size == SIZE
        calls.append(phys)
        return times[phys // SIZE]

    search = lambda ts: store.search_by_timestamp("T", 0, ts, store_time_of)  # noqa: E731
    assert search(20) == 1  # first of the equal store times
    assert search(5) == 0
    assert search(99) == 5
    assert search(24) == 3  # nearer to 20 than to 30
    assert search(26) == 4
    assert search(25) == 3  # a tie goes to the earlier entry
    assert search(40) == 5
    assert len(calls) < 6 * 7  # a binary search, not a scan per call


# ------------------------------------------------------------------------------------------ model-based check

operation = st.one_of(
    st.tuples(st.just("put"), st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=9)),
    st.tuples(st.just("truncate"), st.integers(min_value=0, max_value=60)),
    st.tuples(st.just("retain"), st.integers(min_value=0, max_value=60)),
    st.tuples(st.just("flush"), st.just(0)),
    st.tuples(st.just("reopen"), st.just(0)),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(operation, max_size=25))
def test_matches_a_model_through_truncation_retention_and_reopen(ops: list[tuple[str, object]]) -> None:
    queues: dict[int, list[int]] = {}  # queue id -> record numbers of its entries, by logical offset
    mins: dict[int, int] = {}
    next_record = 0  # record n sits at commit-log offset n * SIZE
    retained_from = 0  # highest commit-log min passed to correct_min_offset
    progress = 0
    with tempfile.TemporaryDirectory() as root:
        store = ConsumeQueueStore(root, entries_per_file=3)
        for op, arg in ops:
            if op == "put":
                batch = []
                for queue_id in arg:  # type: ignore[union-attr]
                    entries = queues.setdefault(queue_id, [])
                    mins.setdefault(queue_id, 0)
                    batch.append(dispatch(len(entries), next_record, queue_id=queue_id, tags=next_record))
                    entries.append(next_record)
                    next_record += 1
                store.put(batch)
                progress = phys_of(next_record)
            elif op == "truncate":
                # The commit log is cut somewhere between its retained start and its end.
                cut = max(retained_from // SIZE, min(arg, next_record))  # type: ignore[type-var]
                store.truncate_after(phys_of(cut))
                for queue_id, entries in queues.items():
                    keep = max(mins[queue_id], sum(1 for n in entries if n < cut))
                    del entries[keep:]
                next_record, progress = cut, min(progress, phys_of(cut))
            elif op == "retain":
                new_min = phys_of(min(arg, next_record))  # type: ignore[type-var]
                retained_from = max(retained_from, new_min)
                store.correct_min_offset(new_min)
                for queue_id, entries in queues.items():
                    live = [k for k in range(mins[queue_id], len(entries)) if phys_of(entries[k]) >= retained_from]
                    mins[queue_id] = live[0] if live else len(entries)
            elif op == "flush":
                store.flush()
            else:
                store.close()
                store = ConsumeQueueStore(root, entries_per_file=3)
                # The broker re-applies the commit log's min after loading (min is file-grained on disk).
                store.correct_min_offset(retained_from)

            assert store.max_physical_offset() == progress
            for queue_id, entries in queues.items():
                assert store.max_offset("T", queue_id) == len(entries)
                assert store.min_offset("T", queue_id) == mins[queue_id]
                got = store.read("T", queue_id, mins[queue_id], 100)
                assert got == [expected(n) for n in entries[mins[queue_id] :]]
        store.close()


def test_search_by_timestamp_skips_records_already_deleted(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path)
    times = [-1, -1, 30, 40]  # the first two records were removed from the commit log
    store.put([dispatch(k, k) for k in range(len(times))])

    def search(ts: int) -> int:
        return store.search_by_timestamp("T", 0, ts, lambda phys, size: times[phys // SIZE])

    assert search(5) == 2
    assert search(29) == 2
    assert search(35) == 2
    assert search(36) == 3
    assert search(99) == 3
    times[:] = [-1, -1, -1, -1]
    assert search(5) == 4  # nothing readable is left: the next message
    assert search(99) == 4


def test_appended_entries_wait_in_memory_until_read_or_flushed(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=8)
    fill(store, 5)
    assert store.max_offset("T", 0) == 5
    assert not (tmp_path / "T").exists()  # nothing written yet: one pwrite per many groups, not one per group
    # A read that reaches pending entries writes them out first, so it sees the same bytes a flush would write.
    assert store.read("T", 0, 3, 10) == [expected(3), expected(4)]
    assert (tmp_path / "T" / "0" / f"{0:020d}").stat().st_size == 5 * ENTRY_SIZE
    fill(store, 6, start=5)  # crosses into the second file
    store.flush()
    sizes = [(tmp_path / "T" / "0" / name).stat().st_size for name in cq_files(tmp_path)]
    assert sizes == [8 * ENTRY_SIZE, 3 * ENTRY_SIZE]
    reopened = ConsumeQueueStore(tmp_path, entries_per_file=8)
    assert reopened.read("T", 0, 0, 20) == [expected(k) for k in range(11)]
    reopened.close()
    store.close()


def test_many_appended_entries_are_written_without_a_read(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, entries_per_file=100_000)
    fill(store, 2000)  # 40 000 bytes: more than the in-memory limit
    size = (tmp_path / "T" / "0" / f"{0:020d}").stat().st_size
    assert 0 < size <= 2000 * ENTRY_SIZE and size % ENTRY_SIZE == 0
    store.close()
