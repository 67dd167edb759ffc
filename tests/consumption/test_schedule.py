"""Delay levels, retries and the DLQ on an in-process broker driven by a FakeClock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from txmq.broker.schedule import PROP_DELAY_FROM, PROP_DLQ_REASON, PROP_LAST_FAILURE
from txmq.broker.topics import SCHEDULE_TOPIC
from txmq.protocol.codes import ResponseCode
from txmq.protocol.record import MessageRecord, tags_code

from .helpers import Harness

DEFAULT_DELAYS_S = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path)
    await harness.start()
    yield harness
    await harness.stop()


def bodies(records: list[MessageRecord]) -> list[bytes]:
    return [r.body for r in records]


# -- the delay table ---------------------------------------------------------------------------------------------------


async def test_default_table_is_rocketmqs(h: Harness) -> None:
    assert h.svc.levels_ms == [s * 1000 for s in DEFAULT_DELAYS_S]


@pytest.mark.parametrize("level", [1, 3, 5, 17, 18])
async def test_each_level_delivers_after_its_delay_and_not_before(h: Harness, level: int) -> None:
    delay = DEFAULT_DELAYS_S[level - 1]
    resp = await h.send("DelayT", b"later", queue_id=2, DELAY=str(level), TAGS="TagA", KEYS="k1")
    assert resp.code == ResponseCode.SUCCESS
    scheduled = h.messages(SCHEDULE_TOPIC, level - 1)
    assert bodies(scheduled) == [b"later"]
    assert scheduled[0].properties["REAL_TOPIC"] == "DelayT" and scheduled[0].properties["REAL_QID"] == "2"
    await h.advance(delay - 0.5)
    assert h.messages("DelayT", 2) == []
    await h.advance(1)
    delivered = h.messages("DelayT", 2)
    assert bodies(delivered) == [b"later"]
    msg = delivered[0]
    assert "DELAY" not in msg.properties
    assert msg.properties["REAL_TOPIC"] == "DelayT" and msg.properties["REAL_QID"] == "2"
    assert msg.properties["TAGS"] == "TagA" and msg.properties["KEYS"] == "k1"
    assert msg.properties["UNIQ_KEY"] == scheduled[0].properties["UNIQ_KEY"]
    assert msg.born_timestamp == scheduled[0].born_timestamp
    # The consume-queue tagsCode is the tag hash again, not the delivery time.
    store = h.broker.store  # type: ignore[union-attr]
    assert store.read_consume_queue("DelayT", 2, 0, 1)[0][2] == tags_code("TagA")
    await h.advance(3 * 3600)
    assert len(h.messages("DelayT", 2)) == 1


async def test_levels_above_the_table_are_clamped(h: Harness) -> None:
    assert (await h.send("DelayT", b"x", DELAY="40")).code == ResponseCode.SUCCESS
    assert bodies(h.messages(SCHEDULE_TOPIC, 17)) == [b"x"]
    await h.advance(7199)
    assert h.messages("DelayT") == []
    await h.advance(2)
    assert bodies(h.messages("DelayT")) == [b"x"]


async def test_invalid_level_is_refused_clearly(h: Harness) -> None:
    resp = await h.send("DelayT", b"x", DELAY="soon")
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL
    assert "DELAY" in (resp.remark or "") and "soon" in (resp.remark or "")
    assert (await h.send("DelayT", b"y")).code == ResponseCode.SUCCESS  # the broker keeps serving


async def test_configured_table_with_units(tmp_path: Path) -> None:
    h = Harness(tmp_path, message_delay_level="2s 3m 1h 2d")
    await h.start()
    try:
        assert h.svc.levels_ms == [2000, 180_000, 3_600_000, 2 * 86_400_000]
        for level in (1, 2, 3, 4):
            await h.send("Units", f"l{level}".encode(), DELAY=str(level))
        await h.advance(2)
        assert bodies(h.messages("Units")) == [b"l1"]
        await h.advance(180)
        assert bodies(h.messages("Units")) == [b"l1", b"l2"]
        await h.advance(3600)
        assert bodies(h.messages("Units")) == [b"l1", b"l2", b"l3"]
        # Two days of fake time would fire every broker timer ~35k times: check the due time it is waiting for.
        store = h.broker.store  # type: ignore[union-attr]
        ((phys, size, due_ms),) = store.read_consume_queue(SCHEDULE_TOPIC, 3, 0, 10)
        assert due_ms == store.read_message(phys, size).store_timestamp + 2 * 86_400_000  # type: ignore[union-attr]
        assert len(h.messages("Units")) == 3
    finally:
        await h.stop()


# -- retries and the DLQ -----------------------------------------------------------------------------------------------


async def _consume_and_fail(h: Harness, group: str, times: int, **kwargs: object) -> list[MessageRecord]:
    """Deliver, fail, send back, wait the level's delay; return every delivery seen (original first)."""
    original = h.messages("OrderT")[0]
    deliveries = [original]
    current = original
    retry = f"%RETRY%{group}"
    for attempt in range(times):
        resp = await h.send_back(current, group, reason=f"boom {attempt}", **kwargs)  # type: ignore[arg-type]
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        seen = len(h.all_messages(retry))
        if h.all_messages(f"%DLQ%{group}"):
            break
        delay = DEFAULT_DELAYS_S[2 + current.reconsume_times]
        await h.advance(delay - 1)
        assert len(h.all_messages(retry)) == seen, "a retry came before its delay"
        await h.advance(1.5)
        retried = h.all_messages(retry)
        assert len(retried) == seen + 1
        current = retried[-1]
        deliveries.append(current)
    return deliveries


async def test_retry_escalates_to_dlq_after_exactly_max_reconsume_times(h: Harness) -> None:
    first = await h.send("OrderT", b"pay", TAGS="T")
    offset_msg_id = first.ext_fields["msgId"]
    deliveries = await _consume_and_fail(h, "CG", 10, max_reconsume_times=3)
    # The original plus 3 retries (10 s, 30 s, 1 m later), then the 4th failure sends it to the DLQ.
    assert [d.reconsume_times for d in deliveries] == [0, 1, 2, 3]
    for d in deliveries[1:]:
        assert d.body == b"pay"
        assert d.properties["RETRY_TOPIC"] == "OrderT"
        assert d.properties["ORIGIN_MESSAGE_ID"] == offset_msg_id
        assert "DELAY" not in d.properties
    dlq = h.all_messages("%DLQ%CG")
    assert len(dlq) == 1
    dead = dlq[0]
    assert dead.reconsume_times == 4 and dead.queue_id == 0 and dead.body == b"pay"
    assert dead.properties["RETRY_TOPIC"] == "OrderT"
    assert dead.properties["ORIGIN_MESSAGE_ID"] == offset_msg_id
    assert "limit is 3" in dead.properties[PROP_DLQ_REASON]
    assert dead.properties[PROP_LAST_FAILURE] == "boom 3"
    assert PROP_DELAY_FROM not in dead.properties
    topics = h.broker.topics  # type: ignore[union-attr]
    assert topics.get("%DLQ%CG").queue_count == 1 and topics.get("%DLQ%CG").perm == 6  # type: ignore[union-attr]
    assert topics.get("%RETRY%CG").perm == 6  # type: ignore[union-attr]


async def test_group_retry_max_times_applies_without_a_header_limit(h: Harness) -> None:
    await h.create_group("CG2", retry_max_times=2)
    await h.send("OrderT", b"x")
    deliveries = await _consume_and_fail(h, "CG2", 10)
    assert [d.reconsume_times for d in deliveries] == [0, 1, 2]
    assert [r.reconsume_times for r in h.all_messages("%DLQ%CG2")] == [3]


async def test_old_clients_header_limit_is_ignored(h: Harness) -> None:
    # Below request version 121 RocketMQ ignores maxReconsumeTimes and uses the group's retryMaxTimes.
    await h.create_group("CG3", retry_max_times=1)
    await h.send("OrderT", b"x")
    deliveries = await _consume_and_fail(h, "CG3", 10, max_reconsume_times=5, version=63)
    assert [d.reconsume_times for d in deliveries] == [0, 1]
    assert len(h.all_messages("%DLQ%CG3")) == 1


async def test_explicit_delay_level_and_negative_level(h: Harness) -> None:
    await h.send("OrderT", b"x")
    original = h.messages("OrderT")[0]
    assert (await h.send_back(original, "CG4", delay_level=1)).code == ResponseCode.SUCCESS
    await h.advance(1.5)
    assert len(h.all_messages("%RETRY%CG4")) == 1
    assert (await h.send_back(original, "CG4", delay_level=-1)).code == ResponseCode.SUCCESS
    dead = h.all_messages("%DLQ%CG4")
    assert len(dead) == 1 and "delayLevel -1" in dead[0].properties[PROP_DLQ_REASON]


async def test_send_back_errors(tmp_path: Path) -> None:
    h = Harness(tmp_path, auto_create_subscription_group=False)
    await h.start()
    try:
        await h.send("OrderT", b"x")
        original = h.messages("OrderT")[0]
        resp = await h.send_back(original, "NoSuchGroup")
        assert resp.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        await h.create_group("G", retry_max_times=3)
        bogus = MessageRecord("OrderT", physical_offset=original.physical_offset + 7)
        resp = await h.send_back(bogus, "G")
        assert resp.code == ResponseCode.SYSTEM_ERROR and "look message by offset failed" in (resp.remark or "")
        resp = await h.send_back(MessageRecord("OrderT", physical_offset=10**12), "G")
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert (await h.send_back(original, "G")).code == ResponseCode.SUCCESS
    finally:
        await h.stop()


async def test_direct_send_to_retry_topic_over_the_limit_goes_to_dlq_without_delay(h: Harness) -> None:
    await h.create_group("CG5", retry_max_times=3)
    resp = await h.send("%RETRY%CG5", b"a", reconsume_times=2, DELAY="5", RETRY_TOPIC="OrderT")
    assert resp.code == ResponseCode.SUCCESS
    assert bodies(h.messages(SCHEDULE_TOPIC, 4)) == [b"a"]
    resp = await h.send("%RETRY%CG5", b"b", reconsume_times=3, DELAY="6", RETRY_TOPIC="OrderT")
    assert resp.code == ResponseCode.SUCCESS
    dead = h.all_messages("%DLQ%CG5")
    assert bodies(dead) == [b"b"] and "DELAY" not in dead[0].properties
    assert dead[0].properties[PROP_DLQ_REASON]
    # The same limit as CONSUMER_SEND_MSG_BACK: a header limit counts from request version 121 on.
    resp = await h.send("%RETRY%CG5", b"c", reconsume_times=4, max_reconsume_times=8, DELAY="5")
    assert resp.code == ResponseCode.SUCCESS
    assert len(h.all_messages("%DLQ%CG5")) == 1


# -- restarts ----------------------------------------------------------------------------------------------------------


async def test_restart_mid_schedule_loses_and_duplicates_nothing(h: Harness) -> None:
    sent = []
    for i in range(40):
        level = (1, 2, 3, 4)[i % 4]  # 1 s, 5 s, 10 s, 30 s
        body = f"m{i}".encode()
        assert (await h.send("RestartT", body, queue_id=i % 3, DELAY=str(level))).code == 0
        sent.append(body)
        await h.advance(0.25)
    # Some are delivered, others still waiting, when the broker stops.
    await h.advance(3)
    before = h.all_messages("RestartT")
    assert 0 < len(before) < len(sent)
    await h.restart()
    assert sorted(bodies(h.all_messages("RestartT"))) == sorted(bodies(before))
    await h.advance(60)
    after = h.all_messages("RestartT")
    assert sorted(bodies(after)) == sorted(sent)  # every message once: none lost, none twice
    await h.restart()
    await h.advance(120)
    assert sorted(bodies(h.all_messages("RestartT"))) == sorted(sent)


async def test_crash_after_delivery_before_offset_persist_does_not_duplicate(h: Harness) -> None:
    for i in range(5):
        await h.send("CrashT", f"c{i}".encode(), queue_id=i % 2, DELAY="2")
    snapshots: list[bytes] = []
    svc = h.svc
    real_persist = svc._persist

    async def spying_persist() -> None:
        await real_persist()
        snapshots.append(svc.path.read_bytes())

    svc._persist = spying_persist
    await h.advance(6)
    assert len(h.all_messages("CrashT")) == 5
    in_flight = [s for s in snapshots if orjson.loads(s)["inFlight"]]
    assert in_flight, "the batch was not recorded as in flight before its put"
    path = svc.path
    await h.stop()
    path.write_bytes(in_flight[-1])  # as if the process died right after the put, before the offset was saved
    await h.start()
    await h.advance(10)
    assert sorted(bodies(h.all_messages("CrashT"))) == [f"c{i}".encode() for i in range(5)]


async def test_crash_after_in_flight_mark_before_put_still_delivers(h: Harness) -> None:
    for i in range(3):
        await h.send("CrashT2", f"d{i}".encode(), DELAY="1")
    path = h.svc.path
    await h.stop()
    # As if the process died after writing the in-flight mark but before the copies were stored.
    path.write_bytes(
        orjson.dumps({"offsetTable": {}, "inFlight": {"1": {"begin": 0, "end": 3, "sinceMs": h.clock.now_ms()}}})
    )
    await h.start()
    await h.advance(2)
    assert bodies(h.all_messages("CrashT2")) == [b"d0", b"d1", b"d2"]
    assert all(r.properties[PROP_DELAY_FROM].isdigit() for r in h.all_messages("CrashT2"))


async def test_unreadable_delay_offsets_refuse_to_start(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.start()
    path = h.svc.path
    await h.send("X", b"x", DELAY="1")
    await h.advance(2)
    await h.stop()
    path.write_text("{not json")
    with pytest.raises(RuntimeError, match="delay offsets"):
        await h.start()
    if h.broker is not None:
        await h.broker.close()
