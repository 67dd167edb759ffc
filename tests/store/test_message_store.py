"""The append pipeline: results, offsets, group commit, SYNC/ASYNC visibility, hooks, validation, stats, reads."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers_store import SEGMENT, make_record, small_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txmq.errors import StoreClosedError, StoreError
from txmq.protocol.record import (
    MAX_PROPERTIES_BYTES,
    MessageRecord,
    TransactionType,
    decode_properties,
    decode_record,
    decode_records,
    encode_offset_msg_id,
    encode_record,
    tags_code,
)
from txmq.store.config import FlushDiskType, StoreConfig
from txmq.store.entry import SCHEDULE_TOPIC, encode_entry, property_value
from txmq.store.message_store import GetStatus, MessageStore, PutStatus
from txmq.testing import FakeClock, aeventually

MakeStore = Callable[..., MessageStore]


class GatedFlush:
    """Stands in for the write that makes a group durable (``CommitLog.write(..., durable=True)``: pwritev2 with
    RWF_DSYNC, or pwritev and fdatasync), so a test can hold the writer inside it; still really writes and syncs."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self._write = store.commit_log.write
        store.commit_log.write = self  # type: ignore[method-assign]

    def __call__(self, seg: Any, seg_pos: int, buffers: Any, durable: bool = False) -> None:
        if durable:
            self.calls += 1
            self.entered.set()
            self.release.wait(30)
        self._write(seg, seg_pos, buffers, durable)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 30)


# ---------------------------------------------------------------------------------------------------------------
# encoding


records = st.builds(
    make_record,
    topic=st.text(alphabet="abcXYZ_-%|09", min_size=1, max_size=127),
    queue_id=st.integers(0, 1023),
    body=st.binary(max_size=600),
    tags=st.one_of(st.none(), st.text(min_size=1, max_size=10)),
    keys=st.one_of(st.none(), st.text(alphabet="abc 12", min_size=1, max_size=20)),
    uniq=st.one_of(st.none(), st.text(alphabet="0123456789ABCDEF", min_size=32, max_size=32)),
    sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC, 0x1, 0x2]),
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(records, st.sampled_from([("10.0.0.1", 1), ("::1", 2), ("::ffff:1.2.3.4", 3)]))
def test_fast_encoder_writes_exactly_the_record_layer_bytes(rec: MessageRecord, born: tuple[str, int]) -> None:
    rec.born_host = born
    entry = encode_entry(rec, 4 << 20, [])
    buf, topic, qid, key, sys_flag, needs_cq, code, keys, uniq, delay, _ts_pos, host = entry
    assert bytes(buf) == bytes(encode_record(rec))
    assert (topic, qid, key, host, delay) == (rec.topic, rec.queue_id, (rec.topic, rec.queue_id), rec.store_host, 0)
    assert needs_cq == (rec.transaction_type in (TransactionType.NOT_TYPE, TransactionType.COMMIT))
    assert code == tags_code(rec.tags)
    assert (keys, uniq) == (rec.properties.get("KEYS"), rec.properties.get("UNIQ_KEY"))
    assert decode_record(buf).sys_flag == sys_flag


prop_items = st.lists(
    st.tuples(
        st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "XTAGS", "", "T"]),
        st.text(alphabet="ab\x01 ", max_size=4),
    ),
    max_size=6,
)


@settings(max_examples=300)
@given(prop_items, st.booleans())
def test_property_value_agrees_with_decode_properties(items: list[tuple[str, str]], trailing: bool) -> None:
    text = "\x02".join(f"{k}\x01{v}" for k, v in items) + ("\x02" if trailing else "")
    for key in ("TAGS", "KEYS", "UNIQ_KEY"):
        assert property_value(text, key) == decode_properties(text).get(key)


# ---------------------------------------------------------------------------------------------------------------
# puts


async def test_put_assigns_dense_queue_offsets_and_increasing_physical_offsets(
    store: MessageStore, clock: FakeClock
) -> None:
    results = [await store.put(make_record("T", i % 3, b"x" * (10 + i))) for i in range(30)]
    assert all(r.status is PutStatus.PUT_OK for r in results)
    for qid in range(3):
        assert [r.queue_offset for r in results[qid::3]] == list(range(10))
    assert [r.physical_offset for r in results] == sorted(r.physical_offset for r in results)
    for r in results:
        rec = decode_record(store.read_record(r.physical_offset))
        assert (rec.physical_offset, rec.queue_offset, rec.store_timestamp) == (
            r.physical_offset,
            r.queue_offset,
            clock.now_ms(),
        )
        assert r.size == rec.store_size
        assert r.msg_id == encode_offset_msg_id(("10.9.8.7", 10911), r.physical_offset)
    assert [store.max_offset("T", q) for q in range(3)] == [10, 10, 10]


async def test_store_time_comes_from_the_injected_clock(store: MessageStore, clock: FakeClock) -> None:
    first = await store.put(make_record())
    await clock.advance(3600)
    second = await store.put(make_record())
    assert second.store_timestamp - first.store_timestamp == 3_600_000
    assert decode_record(store.read_record(second.physical_offset)).store_timestamp == second.store_timestamp


async def test_prepared_and_rollback_records_get_no_queue_entry_commit_records_do(store: MessageStore) -> None:
    half = await store.put(make_record("T", 0, b"half", sys_flag=TransactionType.PREPARED))
    rollback = await store.put(make_record("T", 0, b"rb", sys_flag=TransactionType.ROLLBACK))
    commit = await store.put(make_record("T", 0, b"commit", sys_flag=TransactionType.COMMIT))
    plain = await store.put(make_record("T", 0, b"plain"))
    assert (half.queue_offset, rollback.queue_offset) == (0, 0)
    assert (commit.queue_offset, plain.queue_offset) == (0, 1)
    assert store.max_offset("T", 0) == 2
    assert [e[0] for e in store.read_consume_queue("T", 0, 0, 10)] == [commit.physical_offset, plain.physical_offset]
    assert decode_record(store.read_record(half.physical_offset)).body == b"half"


async def test_put_many_is_one_request_with_consecutive_offsets(store: MessageStore) -> None:
    await store.put(make_record("B", 1))
    results = await store.put_many([make_record("B", 1, f"m{i}".encode()) for i in range(20)])
    assert [r.queue_offset for r in results] == list(range(1, 21))
    assert all(b.physical_offset == a.physical_offset + a.size for a, b in itertools.pairwise(results))
    assert store.statistics.put_requests == 2 and store.statistics.put_messages == 21


async def test_put_many_is_refused_as_a_whole_when_one_record_is_invalid(store: MessageStore) -> None:
    good = [make_record("B", 0, b"ok") for _ in range(3)]
    bad = make_record("B", 0, b"x" * (store.config.max_message_size + 1))
    results = await store.put_many([*good, bad, *good])
    assert {r.status for r in results} == {PutStatus.MESSAGE_ILLEGAL}
    assert "record 3 of 7" in (results[0].remark or "")
    assert store.max_offset("B", 0) == 0 and store.max_physical_offset() == 0


@pytest.mark.parametrize("host", [("10.9.8.7", 10911), ("fe80::1", 10911)])
async def test_put_many_link_writes_the_offset_of_the_record_before(store: MessageStore, host: Any) -> None:
    def pair(body_size: int) -> list[MessageRecord]:
        marker = make_record("Op", 0, b"7", REF=encode_offset_msg_id(host, 0), AFTER="x")
        return [make_record("Real", 0, os.urandom(body_size)), marker]

    links = [await store.put_many(pair(100 + 50 * i), link="REF") for i in range(3)]
    # The copy fills its segment up to the end-of-file blank, so the linking record starts the next segment.
    overhead = len(encode_record(pair(0)[0]))
    room = SEGMENT - store.max_physical_offset() % SEGMENT - 8
    links.append(await store.put_many(pair(room - overhead), link="REF"))
    assert links[-1][0].physical_offset // SEGMENT != links[-1][1].physical_offset // SEGMENT
    for stored, marked in links:
        assert stored.ok and marked.ok
        on_disk = store.read_message(marked.physical_offset)
        assert on_disk is not None and on_disk.properties["AFTER"] == "x"
        assert on_disk.properties["REF"] == encode_offset_msg_id(host, stored.physical_offset)


async def test_put_many_link_lists_the_offsets_of_every_record_before(store: MessageStore) -> None:
    host = ("10.9.8.7", 10911)
    ph = encode_offset_msg_id(host, 0)
    marker = make_record("Op", 0, b"7", REF=f"{ph},,{ph},{ph},")  # empty items take no record
    results = await store.put_many(
        [make_record("Real", 0, b"a"), make_record("Real", 1, b"b"), make_record("X"), marker], link="REF"
    )
    on_disk = store.read_message(results[-1].physical_offset)
    assert on_disk is not None
    assert on_disk.properties["REF"] == ",".join(
        [encode_offset_msg_id(host, results[0].physical_offset), ""]
        + [encode_offset_msg_id(host, r.physical_offset) for r in results[1:3]]
        + [""]
    )
    with pytest.raises(ValueError, match="2 placeholders for 1 records"):
        await store.put_many([make_record("Real"), make_record("Op", REF=f"{ph},{ph}")], link="REF")


async def test_put_many_link_needs_a_placeholder_and_a_record_before(store: MessageStore) -> None:
    with pytest.raises(ValueError, match="record before"):
        await store.put_many([make_record("Op", REF="0" * 32)], link="REF")
    with pytest.raises(ValueError, match="no property"):
        await store.put_many([make_record("Real"), make_record("Op")], link="REF")
    with pytest.raises(ValueError, match="placeholder"):
        await store.put_many([make_record("Real"), make_record("Op", REF="abc")], link="REF")
    assert store.max_physical_offset() == 0


@pytest.mark.parametrize(
    ("record", "status", "remark"),
    [
        (make_record("T" * 128), PutStatus.MESSAGE_ILLEGAL, "topic"),
        (make_record("T", body=b"x" * (4 * 1024 * 1024 + 1)), PutStatus.MESSAGE_ILLEGAL, "maxMessageSize"),
        (make_record("T", big="v" * MAX_PROPERTIES_BYTES), PutStatus.PROPERTIES_SIZE_EXCEEDED, "properties"),
        (make_record("T", body=b"x" * SEGMENT), PutStatus.MESSAGE_ILLEGAL, "segment"),
    ],
)
async def test_invalid_records_are_refused_before_the_pipeline(
    store: MessageStore, record: MessageRecord, status: PutStatus, remark: str
) -> None:
    result = await store.put(record)
    assert result.status is status and not result.ok
    assert remark in (result.remark or "")
    assert store.max_physical_offset() == 0 and store.statistics.put_messages == 0
    with pytest.raises(Exception, match="no offsetMsgId"):
        _ = result.msg_id


async def test_records_roll_over_segments_with_an_end_of_file_blank(store: MessageStore) -> None:
    bodies = [os.urandom(3000 + i * 7) for i in range(60)]  # ~190 KiB: three 64 KiB segments
    results = [await store.put(make_record("R", 0, b)) for b in bodies]
    segs = store.commit_log.segments
    assert len(segs) >= 3
    assert [os.path.basename(s.path) for s in segs] == [f"{i * SEGMENT:020d}" for i in range(len(segs))]
    assert all(os.path.getsize(s.path) == SEGMENT for s in segs)
    for r in results:  # no record straddles a segment end, and each leaves room for the 8-byte blank
        assert r.physical_offset // SEGMENT == (r.physical_offset + r.size + 7) // SEGMENT
    for a, b in itertools.pairwise(results):
        if b.physical_offset // SEGMENT != a.physical_offset // SEGMENT:
            end = a.physical_offset + a.size
            blank = store.commit_log.read(end, 8)
            assert int.from_bytes(blank[:4], "big") == b.physical_offset - end
            assert blank[4:] == bytes.fromhex("CBD43194")
            assert b.physical_offset % SEGMENT == 0
    got = store.get_messages("R", 0, 0, max_count=100, max_bytes=1 << 30)
    assert [r.body for r in decode_records(got.body)] == bodies


# ---------------------------------------------------------------------------------------------------------------
# group commit and visibility


async def test_sync_put_is_acknowledged_and_visible_only_after_fdatasync(store: MessageStore) -> None:
    gate = GatedFlush(store)
    seen: list[tuple[str, int, int]] = []
    store.on_new_messages(lambda t, q, m: seen.append((t, q, m)))
    task = asyncio.create_task(store.put(make_record("V", 0, b"first")))
    await gate.wait_entered()
    # The writer is inside the durable write: the entry is not dispatched to the consume queue, nor visible.
    assert store.consume_queue.max_offset("V", 0) == 0
    assert store.max_offset("V", 0) == 0
    assert store.read_consume_queue("V", 0, 0, 10) == []
    assert store.get_messages("V", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert store.max_physical_offset() == 0
    assert not task.done() and seen == []
    gate.release.set()
    result = await task
    assert result.ok and store.max_offset("V", 0) == 1
    assert seen == [("V", 0, 1)]


async def test_everything_waiting_during_a_flush_shares_the_next_fdatasync(store: MessageStore) -> None:
    gate = GatedFlush(store)
    first = asyncio.create_task(store.put(make_record("G", 0)))
    await gate.wait_entered()
    waiting = [asyncio.create_task(store.put(make_record("G", i % 4, f"{i}".encode()))) for i in range(50)]
    for _ in range(5):
        await asyncio.sleep(0)  # let every task hand its record over (one hand-over per loop turn)
    gate.release.set()
    results = await asyncio.gather(first, *waiting)
    assert all(r.ok for r in results)
    assert gate.calls == 2  # one fdatasync for the first put, one for the fifty that waited
    stats = store.statistics
    assert stats.flushes == 2 and stats.groups == 2 and stats.put_messages == 51
    assert stats.group_messages.max == 50


async def _put_pair(store: MessageStore, topic: str) -> None:
    """Two puts in one event-loop turn: one hand-over, one group of two requests."""
    results = await asyncio.gather(store.put(make_record(topic, 0, b"a")), store.put(make_record(topic, 1, b"b")))
    assert all(r.ok for r in results)


async def test_the_group_commit_wait_lets_a_late_request_share_the_next_fdatasync(make_store: MakeStore) -> None:
    store = make_store()
    store._writer._gather_s = 30.0  # far longer than the test: only the request count can end the wait
    await _put_pair(store, "W")
    first = asyncio.create_task(store.put(make_record("W", 0, b"first")))
    # The last group held two requests and only one came: the writer waits for a second before it writes.
    await aeventually(lambda: store._writer._wanted is not None, "the writer waits for a second request")
    assert not first.done() and store.statistics.groups == 1
    started = time.monotonic()
    second = await store.put(make_record("W", 1, b"second"))
    assert (await first).ok and second.ok
    assert time.monotonic() - started < 10  # ended by the count, not by the 30 s
    stats = store.statistics
    assert stats.groups == 2 and stats.group_waits == 1 and stats.group_messages.max == 2 and stats.flushes == 2


async def test_the_group_commit_wait_ends_at_its_limit(make_store: MakeStore) -> None:
    store = make_store(group_commit_wait_us=20_000)
    await _put_pair(store, "E")
    alone = await store.put(make_record("E", 0, b"alone"))  # nobody else comes: written once the 20 ms are up
    assert alone.ok and store.statistics.groups == 2 and store.statistics.group_waits == 1


async def test_a_lone_client_never_waits(make_store: MakeStore) -> None:
    store = make_store()
    store._writer._gather_s = 30.0
    results = [await store.put(make_record("L", 0, f"{i}".encode())) for i in range(20)]
    assert all(r.ok for r in results)
    assert store.statistics.groups == 20 and store.statistics.group_waits == 0


@pytest.mark.parametrize(
    ("overrides", "wait_s"),
    [({}, 0.0003), ({"group_commit_wait_us": 0}, 0.0), ({"flush_disk_type": FlushDiskType.ASYNC_FLUSH}, 0.0)],
)
def test_only_a_sync_flush_store_waits_for_a_group(
    make_store: MakeStore, overrides: dict[str, Any], wait_s: float
) -> None:
    assert make_store(**overrides)._writer._gather_s == wait_s


async def test_async_flush_acknowledges_after_the_write_and_syncs_later(make_store: MakeStore) -> None:
    store = make_store(flush_disk_type=FlushDiskType.ASYNC_FLUSH, flush_interval_commit_log=3_600_000)
    results = [await store.put(make_record("A", 0, b"x" * 100)) for _ in range(5)]
    assert all(r.ok for r in results)
    end = results[-1].physical_offset + results[-1].size
    assert store.max_offset("A", 0) == 5 and store.max_physical_offset() == end
    assert store.flushed_physical_offset() == 0  # acknowledged, visible, not yet synced
    assert store.statistics.flushes == 0
    store.flush()
    assert store.flushed_physical_offset() == end and store.statistics.flushes == 1


async def test_async_flusher_runs_on_its_interval(make_store: MakeStore) -> None:
    store = make_store(flush_disk_type=FlushDiskType.ASYNC_FLUSH, flush_interval_commit_log=5)
    r = await store.put(make_record())
    await aeventually(
        lambda: store.flushed_physical_offset() == r.physical_offset + r.size, "the flusher flushes the record"
    )


async def test_new_message_hook_gets_one_call_per_queue_per_group_with_the_max(store: MessageStore) -> None:
    calls: list[tuple[str, int, int]] = []
    store.on_new_messages(lambda t, q, m: calls.append((t, q, m)))
    await store.put_many([make_record("H", 0), make_record("H", 0), make_record("H", 2)])
    assert sorted(calls) == [("H", 0, 2), ("H", 2, 1)]
    calls.clear()
    await store.put(make_record("H", 0, sys_flag=TransactionType.PREPARED))
    assert calls == []  # a half message makes nothing visible


async def test_put_sync_from_threads_and_puts_from_two_event_loops(store: MessageStore) -> None:
    def blocking(n: int) -> list[int]:
        return [store.put_sync(make_record("S", 0, f"t{n}-{i}".encode())).queue_offset for i in range(20)]

    def other_loop() -> list[int]:
        async def run() -> list[int]:
            rs = await asyncio.gather(*(store.put(make_record("S", 0, b"loop2")) for _ in range(20)))
            return [r.queue_offset for r in rs]

        return asyncio.run(run())

    here = asyncio.gather(*(store.put(make_record("S", 0, b"loop1")) for _ in range(20)))
    threads = await asyncio.gather(
        asyncio.to_thread(blocking, 1), asyncio.to_thread(blocking, 2), asyncio.to_thread(other_loop)
    )
    mine = [r.queue_offset for r in await here]
    offsets = sorted(mine + [o for t in threads for o in t])
    assert offsets == list(range(80))
    assert store.max_offset("S", 0) == 80


async def test_schedule_topic_tags_code_is_the_delivery_time(store: MessageStore, clock: FakeClock) -> None:
    rec = make_record(SCHEDULE_TOPIC, 2, DELAY="3", REAL_TOPIC="T")
    r = await store.put(rec)
    [(phys, size, code)] = store.read_consume_queue(SCHEDULE_TOPIC, 2, 0, 1)
    assert (phys, size) == (r.physical_offset, r.size)
    assert code == clock.now_ms() + 10_000  # level 3 is 10s in the default messageDelayLevel


async def test_put_raw_stores_a_pre_encoded_record_with_new_offsets(store: MessageStore) -> None:
    await store.put(make_record("W", 0))
    raw = encode_record(make_record("W", 0, b"raw body", tags="TagA"))
    r = await store.put_raw(raw, store_host=("1.2.3.4", 9))
    assert r.ok and r.queue_offset == 1 and r.msg_id.startswith("01020304")
    rec = decode_record(store.read_record(r.physical_offset))
    assert (rec.body, rec.queue_offset, rec.physical_offset) == (b"raw body", 1, r.physical_offset)
    assert store.read_consume_queue("W", 0, 1, 1)[0][2] == tags_code("TagA")
    assert (await store.put_raw(b"garbage" * 20)).status is PutStatus.MESSAGE_ILLEGAL


async def test_stats_count_puts_bytes_flushes_and_topics(store: MessageStore) -> None:
    sizes = [(await store.put(make_record("X" if i % 2 else "Y", 0, b"b" * i))).size for i in range(10)]
    snap = store.stats()
    assert snap["put_messages"] == 10 and snap["put_bytes"] == sum(sizes)
    assert snap["flushes"] == 10 and snap["groups"] == 10
    assert snap["topic_puts"] == {"X": 5, "Y": 5}
    latency = snap["flush_latency_us"]
    assert latency["count"] == 10 and latency["p99"] >= latency["p50"] >= 0 and latency["max"] >= latency["p99"]
    assert snap["commit_log_max_offset"] == snap["commit_log_flushed_offset"] == sum(sizes)


async def test_a_failed_fdatasync_stops_the_pipeline_until_reopen(make_store: MakeStore, tmp_path: Any) -> None:
    store = make_store()
    ok = await store.put(make_record("F", 0, b"before"))

    write = store.commit_log.write

    def broken(seg: Any, seg_pos: int, buffers: Any, durable: bool = False) -> None:
        if durable:
            raise OSError(5, "Input/output error")  # what fdatasync (or a write with RWF_DSYNC) reports
        write(seg, seg_pos, buffers, durable)

    store.commit_log.write = broken  # type: ignore[method-assign]
    failed = await store.put(make_record("F", 0, b"lost"))
    assert failed.status is PutStatus.SERVICE_NOT_AVAILABLE and "Input/output error" in (failed.remark or "")
    later = await store.put(make_record("F", 0, b"refused"))
    assert later.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.max_offset("F", 0) == 1  # the failed group never became visible
    await store.close()
    reopened = make_store()
    assert reopened.recovery.mode == "crash"  # the abort marker stayed: the next open verifies the log
    assert decode_record(reopened.read_record(ok.physical_offset)).body == b"before"
    assert (await reopened.put(make_record("F", 0, b"after"))).ok


async def test_a_closed_store_refuses_puts_and_reads(make_store: MakeStore) -> None:
    store = make_store()
    r = await store.put(make_record())
    await store.close()
    assert (await store.put(make_record())).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.put_sync(make_record()).status is PutStatus.SERVICE_NOT_AVAILABLE
    with pytest.raises(StoreClosedError):
        store.read_record(r.physical_offset)
    await store.close()  # idempotent


# ---------------------------------------------------------------------------------------------------------------
# reads


async def test_get_messages_statuses_and_next_offsets(store: MessageStore) -> None:
    assert store.get_messages("Q", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    records = [make_record("Q", 0, f"m{i}".encode(), tags="a" if i % 2 else "b") for i in range(10)]
    results = await store.put_many(records)
    got = store.get_messages("Q", 0, 2, max_count=3)
    assert (got.status, got.message_count, got.next_begin_offset) == (GetStatus.FOUND, 3, 5)
    assert (got.min_offset, got.max_offset) == (0, 10)
    expected = b"".join(store.read_record(r.physical_offset) for r in results[2:5])
    assert got.body == expected and len(got.buffers) == 1  # neighbours are read as one run of stored bytes
    assert store.get_messages("Q", 0, 10).status is GetStatus.OFFSET_OVERFLOW_ONE
    overflow = store.get_messages("Q", 0, 15)
    assert (overflow.status, overflow.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)
    only_a = store.get_messages("Q", 0, 0, max_count=32, tags_codes={tags_code("a")})
    assert [r.body for r in decode_records(only_a.body)] == [f"m{i}".encode() for i in range(1, 10, 2)]
    assert only_a.next_begin_offset == 10
    none = store.get_messages("Q", 0, 0, tags_codes={tags_code("zzz")})
    assert (none.status, none.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 10)
    size = results[0].size
    capped = store.get_messages("Q", 0, 0, max_count=32, max_bytes=size * 3 + 1)
    assert capped.message_count == 3 and capped.total_size == 3 * size


async def test_reads_by_physical_offset(store: MessageStore) -> None:
    r = await store.put(make_record("P", 0, b"payload", tags="t", keys="k1 k2"))
    raw = store.read_record(r.physical_offset)
    assert raw == store.read_bytes(r.physical_offset, r.size) and len(raw) == r.size
    msg = store.read_message(r.physical_offset)
    assert (msg.body, msg.tags, msg.keys) == (b"payload", "t", ["k1", "k2"])
    assert store.read_record(r.physical_offset + r.size) is None  # past the end
    assert store.read_record(r.physical_offset + 3) is None  # not a record boundary
    assert store.read_bytes(r.physical_offset, r.size + 1) is None


async def test_search_by_timestamp_and_store_times(store: MessageStore, clock: FakeClock) -> None:
    times = []
    for i in range(10):
        r = await store.put(make_record("TS", 0, f"{i}".encode()))
        times.append(r.store_timestamp)
        await clock.advance(10)
    assert store.earliest_store_time("TS", 0) == times[0]
    assert store.last_store_time("TS", 0) == times[-1]
    assert store.store_time_at("TS", 0, 4) == times[4]
    assert store.search_offset_by_timestamp("TS", 0, times[6]) == 6
    assert store.search_offset_by_timestamp("TS", 0, times[6] + 4000) == 6
    assert store.search_offset_by_timestamp("TS", 0, times[0] - 99_000) == 0
    assert store.search_offset_by_timestamp("TS", 0, times[-1] + 99_000) == 9
    assert store.earliest_message_time() == times[0]


async def test_query_by_key_checks_topic_and_key(store: MessageStore) -> None:
    a = await store.put(make_record("K", 0, b"a", keys="order-1 order-2", uniq="U1"))
    b = await store.put(make_record("K", 1, b"b", keys="order-2", uniq="U2"))
    await store.put(make_record("Other", 0, b"c", keys="order-2", uniq="U3"))
    assert sorted(store.query_by_key("K", "order-2", 10)) == sorted([a.physical_offset, b.physical_offset])
    assert store.query_by_key("K", "U1", 10) == [a.physical_offset]
    assert store.query_by_key("K", "order-1", 10) == [a.physical_offset]
    assert store.query_by_key("K", "U3", 10) == []
    assert len(store.query_by_key("K", "order-2", 1)) == 1
    assert store.query_by_key("K", "order-2", 10, a.store_timestamp + 1, a.store_timestamp + 2) == []
    assert store.index_last_update_timestamp() == b.store_timestamp


async def test_async_context_manager_and_config_keys(tmp_path: Any) -> None:
    cfg = StoreConfig.from_properties(
        {
            "storePathRootDir": str(tmp_path / "s"),
            "mappedFileSizeCommitLog": str(SEGMENT),
            "flushDiskType": "ASYNC_FLUSH",
            "brokerName": "ignored",
            "maxHashSlotNum": "64",
            "maxIndexNum": "256",
        }
    )
    async with MessageStore(cfg) as store:
        assert (await store.put(make_record())).ok
        assert not store.config.sync_flush
    assert not store.is_open
    assert os.path.exists(tmp_path / "s" / "checkpoint") and not os.path.exists(tmp_path / "s" / "abort")


def test_blocking_context_manager(tmp_path: Any) -> None:
    with MessageStore(small_config(tmp_path / "s")) as store:
        assert os.path.exists(tmp_path / "s" / "abort")
        r = store.put_many_sync([make_record("C", 0), make_record("C", 0)])
        assert [x.queue_offset for x in r] == [0, 1]
    assert not os.path.exists(tmp_path / "s" / "abort")


def test_a_store_directory_can_be_open_only_once(tmp_path: Any) -> None:
    first = MessageStore(small_config(tmp_path / "s")).open()
    with pytest.raises(StoreError, match="already open"):
        MessageStore(small_config(tmp_path / "s")).open()
    first.shutdown()
    MessageStore(small_config(tmp_path / "s")).open().shutdown()


async def test_a_dead_writer_thread_never_leaves_puts_hanging(make_store: MakeStore) -> None:
    store = make_store()
    first = await store.put(make_record("D", 0, b"written"))
    assert first.ok
    # A bug in the writer loop itself (not in a group, whose IO errors are handled there): an item it cannot handle.
    # (Not by replacing a method: the writer may be compiled, and a compiled instance's methods cannot be replaced.)
    store._writer._queue.put(object())
    later = [await store.put(make_record("D", 0, b"after")) for _ in range(3)]
    assert {r.status for r in later} == {PutStatus.SERVICE_NOT_AVAILABLE}
    assert "writer thread died" in (later[-1].remark or "")
    with pytest.raises(StoreError, match="writer thread died"):
        store.flush()
    await store.close()


async def test_appends_do_not_wait_for_a_slow_checkpoint(make_store: MakeStore) -> None:
    # The consume-queue and index fdatasyncs of a checkpoint take tens of milliseconds under load; they run on their
    # own thread, so a checkpoint stuck in the index flush holds up no append.
    store = make_store(flush_interval_consume_queue=10, flush_interval_index=10)
    entered, release = threading.Event(), threading.Event()
    index_flush = store.key_index.flush

    def slow_flush() -> None:
        entered.set()
        release.wait(30)
        index_flush()

    store.key_index.flush = slow_flush  # type: ignore[method-assign]
    try:
        first = await store.put(make_record("C", 0, b"first"))
        assert first.ok
        assert await asyncio.to_thread(entered.wait, 30)  # a periodic checkpoint is now inside the index flush

        async def appends() -> list[Any]:
            return [await store.put(make_record("C", 0, f"m{i}".encode(), uniq=f"{i:032X}")) for i in range(20)]

        later = await asyncio.wait_for(appends(), 10)  # the checkpoint stays stuck for up to 30 s
        assert all(r.ok for r in later) and not release.is_set()
        assert store.max_offset("C", 0) == 21 and store.query_by_key("C", f"{7:032X}", 10)
    finally:
        release.set()
    await asyncio.to_thread(store.flush)  # a forced checkpoint waits for the periodic one, then writes its own
    assert store.statistics.checkpoint_latency_us.count >= 1


def test_a_blocking_appender_writes_its_own_group_when_the_writer_is_idle(make_store: MakeStore) -> None:
    store = make_store()
    writers: list[str] = []
    write = store.commit_log.write

    def recording_write(*args: Any) -> Any:
        writers.append(threading.current_thread().name)
        return write(*args)

    store.commit_log.write = recording_write  # type: ignore[method-assign]
    results: list[Any] = []
    appender = threading.Thread(
        target=lambda: results.extend(store.put_sync(make_record("L", 0, f"m{i}".encode())) for i in range(50)),
        name="blocking-appender",
    )
    appender.start()
    appender.join(30)
    assert [r.queue_offset for r in results] == list(range(50)) and all(r.ok for r in results)
    assert set(writers) == {"blocking-appender"}  # no hand-over to txmq-store-writer
    assert store.flushed_physical_offset() == store.max_physical_offset()  # each put was fdatasync'ed (SYNC)
    got = store.get_messages("L", 0, 0, max_count=100, max_bytes=1 << 30)
    assert [r.body for r in decode_records(got.body)] == [f"m{i}".encode() for i in range(50)]


async def test_the_key_index_is_flushed_less_often_than_the_consume_queues(make_store: MakeStore) -> None:
    store = make_store(flush_interval_consume_queue=10, flush_interval_index=60_000)
    flushes = {"cq": 0, "index": 0}
    cq_flush, index_flush = store.consume_queue.flush, store.key_index.flush

    def count(name: str, flush: Any) -> Any:
        def counted() -> None:
            flushes[name] += 1
            flush()

        return counted

    store.consume_queue.flush = count("cq", cq_flush)  # type: ignore[method-assign]
    store.key_index.flush = count("index", index_flush)  # type: ignore[method-assign]
    for i in range(5):
        assert (await store.put(make_record("F", 0, b"x", uniq=f"{i:032X}"))).ok
        await asyncio.sleep(0.05)
    assert flushes["cq"] >= 3 and flushes["index"] == 0  # periodic checkpoints: queues only
    await asyncio.to_thread(store.flush)  # an explicit flush makes everything durable, the index included
    assert flushes["index"] == 1
    assert store.query_by_key("F", f"{3:032X}", 10)  # queries never depended on the index being flushed


def test_the_writer_indexes_itself_when_the_indexer_falls_behind(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txmq.store import background

    monkeypatch.setattr(background, "_INDEX_WAKE_AT", 4)
    monkeypatch.setattr(background, "_INDEX_BACKLOG_MAX", 8)
    monkeypatch.setattr(background.KeyIndexer, "_run", lambda self: None)  # an indexer that never gets to run
    store = make_store()
    for i in range(40):
        assert store.put_sync(make_record("B", 0, b"x", uniq=f"{i:032X}")).ok
        assert len(store._indexer._backlog) < 8  # bounded: memory, and the catch-up a query or checkpoint must do
    assert store.key_index.max_physical_offset() > 0  # indexed by the writer, not by the (absent) indexer
    assert len(store.query_by_key("B", f"{39:032X}", 10)) == 1
