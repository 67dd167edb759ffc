"""Retention on the fake clock: reserve time, deleteWhen, disk pressure, forced cleaning, guards, and the consume
queues and index following the commit log."""

from __future__ import annotations

import time
from collections.abc import Callable

from helpers_store import SEGMENT, make_record

from txmq.store.message_store import GetStatus, MessageStore, PutResult
from txmq.testing import FakeClock

MakeStore = Callable[..., MessageStore]
HOUR = 3600.0


def local_hour(clock: FakeClock, plus_hours: float = 0) -> int:
    return time.localtime(clock.now_ms() / 1000 + plus_hours * HOUR).tm_hour


def other_hour(clock: FakeClock) -> str:
    """A deleteWhen hour that is not the clock's current local hour."""
    return f"{(local_hour(clock) + 12) % 24:02d}"


async def fill_segment(store: MessageStore, tag: str) -> list[PutResult]:
    """Append until the log moves into a new segment; returns what went into the segment that filled up."""
    start_seg = store.max_physical_offset() // SEGMENT
    out = []
    while True:
        r = await store.put(make_record("R", 0, tag.encode() * 1000, keys=tag))
        if r.physical_offset // SEGMENT != start_seg:
            return out
        out.append(r)


async def aged_store(make_store: MakeStore, clock: FakeClock, usage: list[float], **cfg: object) -> MessageStore:
    """Four full segments whose last records were written 100 h, 90 h, 50 h and 10 h before 'now', plus the active
    one (each fill ends with the record that opens the next segment)."""
    store = make_store(disk_usage=lambda: usage[0], delete_when=other_hour(clock), **cfg)
    for tag, hours_later in (("a", 10), ("b", 40), ("c", 40), ("d", 10)):
        await fill_segment(store, tag)
        await clock.advance(hours_later * HOUR)
    return store


async def test_nothing_is_deleted_outside_delete_when_on_a_roomy_disk(make_store: MakeStore, clock: FakeClock) -> None:
    usage = [0.10]
    store = await aged_store(make_store, clock, usage)
    assert store.retention.plan()[0] == 0
    assert store.retention.run_once() == []
    assert store.min_physical_offset() == 0


async def test_disk_pressure_deletes_segments_past_the_reserve_time(make_store: MakeStore, clock: FakeClock) -> None:
    usage = [0.80]
    store = await aged_store(make_store, clock, usage)
    segs_before = len(store.commit_log.segments)
    deleted = store.retention.run_once()
    # A segment's age is that of the next segment's first record: 100 h, 90 h, 50 h and 10 h for segments 0..3.
    # With the 72 h reserve, segments 0 and 1 go and segment 2 stays.
    assert [int(p.rsplit("/", 1)[1]) for p in deleted] == [0, SEGMENT]
    assert store.min_physical_offset() == 2 * SEGMENT and len(store.commit_log.segments) == segs_before - 2
    assert store.retention.run_once() == []  # nothing else is old enough


async def test_consume_queue_and_index_follow_deleted_segments(make_store: MakeStore, clock: FakeClock) -> None:
    usage = [0.80]
    store = await aged_store(make_store, clock, usage)
    old_max = store.max_offset("R", 0)
    store.retention.run_once()
    min_off = store.min_offset("R", 0)
    assert 0 < min_off < old_max
    first_kept = store.read_consume_queue("R", 0, min_off, 1)[0][0]
    assert first_kept >= store.min_physical_offset()
    got = store.get_messages("R", 0, 0)
    assert (got.status, got.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, min_off)
    assert store.get_messages("R", 0, min_off).status is GetStatus.FOUND
    assert store.query_by_key("R", "a", 10) == []  # the index no longer returns deleted records
    assert store.query_by_key("R", "d", 10) != []
    assert store.earliest_store_time("R", 0) == store.store_time_at("R", 0, min_off)


async def test_delete_when_hour_deletes_expired_segments(make_store: MakeStore, clock: FakeClock) -> None:
    usage = [0.10]
    store = await aged_store(make_store, clock, usage)
    store.config.delete_when = f"{local_hour(clock):02d}"
    count, reason = store.retention.plan()
    assert (count, reason) == (2, "deleteWhen")
    assert len(store.retention.run_once()) == 2


async def test_forced_cleaning_ignores_age_but_not_the_active_segment(make_store: MakeStore, clock: FakeClock) -> None:
    usage = [0.90]
    store = await aged_store(make_store, clock, usage, delete_commit_log_files_batch_max=3)
    assert store.retention.plan()[1].startswith("forced")
    assert len(store.retention.run_once()) == 3  # batch limit
    deleted = store.retention.run_once()
    assert len(deleted) == 1 and len(store.commit_log.segments) == 1  # the active segment always stays
    assert store.retention.run_once() == []
    assert (await store.put(make_record("R", 0, b"still writable"))).ok


async def test_a_guard_keeps_its_segment_and_everything_after(make_store: MakeStore, clock: FakeClock) -> None:
    usage = [0.90]
    store = await aged_store(make_store, clock, usage)
    protected = SEGMENT + 100  # e.g. an in-doubt half message inside segment 1
    store.add_retention_guard(lambda: protected)
    store.add_retention_guard(lambda: 10 * SEGMENT)
    deleted = store.retention.run_once()
    assert [int(p.rsplit("/", 1)[1]) for p in deleted] == [0]
    assert store.retention.run_once() == []
    assert store.min_physical_offset() == SEGMENT


async def test_a_failing_guard_protects_everything(make_store: MakeStore, clock: FakeClock) -> None:
    usage = [0.90]
    store = await aged_store(make_store, clock, usage)

    def broken() -> int:
        raise RuntimeError("pending table not loaded")

    store.add_retention_guard(broken)
    assert store.retention.run_once() == []


async def test_the_periodic_check_runs_on_the_clock(make_store: MakeStore, clock: FakeClock) -> None:
    usage = [0.10]
    store = await aged_store(make_store, clock, usage)
    store.retention.start()
    try:
        await clock.advance(10)  # cleanResourceInterval
        assert store.retention.last_run is not None and await store.retention.last_run == []
        usage[0] = 0.80
        await clock.advance(10)
        assert len(await store.retention.last_run) == 2
        assert store.retention.deleted_total == 2
    finally:
        store.retention.stop()
    assert clock.pending_timers() == 0
