"""PushConsumer against a real name server and scripted fake brokers: rebalance, start offsets, pulls, retries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
import pytest
from client_fakes import FakeBroker, stored

from txmq.client import (
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageExt,
    MessageModel,
    MessageQueue,
    PushConsumer,
)
from txmq.errors import MQClientError
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from txmq.protocol.record import Prop, decode_properties
from txmq.testing import FakeClock, aeventually

MakeBroker = Callable[..., Awaitable[FakeBroker]]
RW = 6
RETRY = "%RETRY%G"


def pulls(broker: FakeBroker, topic: str | None = None) -> list[PullMessageRequestHeader]:
    out = [PullMessageRequestHeader.from_ext(c.ext_fields) for c in broker.of_code(RequestCode.PULL_MESSAGE)]
    return [h for h in out if topic is None or h.topic == topic]


def ok(_msgs: list[MessageExt]) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


async def test_rebalance_takes_its_share_and_follows_notifications(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (4, 4, RW), RETRY: (1, 1, RW)})
    broker.stored_offsets = {("T", 0): 5, ("T", 1): 6, ("T", 2): 0, ("T", 3): 0}
    consumer = PushConsumer("G", namesrv, instance_name="me")
    consumer.subscribe("T")
    consumer.register_listener(ok)
    me = f"{consumer.config.resolved_ip()}@me"
    broker.consumer_ids = [me, "zzz@other"]
    await consumer.start()
    try:
        assert consumer.assigned_queues() == [MessageQueue(RETRY, "broker-a", 0)] + [
            MessageQueue("T", "broker-a", i) for i in (0, 1)
        ]
        await aeventually(lambda: {h.queueId for h in pulls(broker, "T")} == {0, 1}, "pulls on both queues")
        assert {h.queueId: h.queueOffset for h in pulls(broker, "T")} == {0: 5, 1: 6}  # committed offsets

        broker.consumer_ids = ["0.0.0.0@other", me]  # now we sort second
        await broker.notify_consumer_ids_changed("G")
        want = [MessageQueue("T", "broker-a", i) for i in (2, 3)]
        await aeventually(lambda: consumer.assigned_queues() == want, "the new allocation")
        # Queues handed away get their offsets committed (two-way) for the next owner.
        commits = {
            (c.ext_fields["topic"], c.ext_fields["queueId"]): c.ext_fields["commitOffset"]
            for c in broker.of_code(RequestCode.UPDATE_CONSUMER_OFFSET)
        }
        assert commits[("T", "0")] == "5" and commits[("T", "1")] == "6"
    finally:
        await consumer.shutdown()
    assert broker.of_code(RequestCode.UNREGISTER_CLIENT)[-1].ext_fields["consumerGroup"] == "G"


async def test_heartbeat_carries_the_subscriptions(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW), RETRY: (1, 1, RW)})
    broker.consumer_ids = ["x"]
    consumer = PushConsumer("G", namesrv, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("T", "TagA || TagB")
    consumer.register_listener(ok)
    async with consumer:
        body = orjson.loads(broker.of_code(RequestCode.HEART_BEAT)[0].body)
    (data,) = body["consumerDataSet"]
    assert data["groupName"] == "G"
    assert (data["consumeType"], data["messageModel"], data["consumeFromWhere"]) == (
        "CONSUME_PASSIVELY",
        "CLUSTERING",
        "CONSUME_FROM_FIRST_OFFSET",
    )
    subs = {s["topic"]: s for s in data["subscriptionDataSet"]}
    assert subs["T"]["subString"] == "TagA || TagB" and subs["T"]["tagsSet"] == ["TagA", "TagB"]
    assert subs[RETRY]["subString"] == "*"
    assert {"groupName": "CLIENT_INNER_PRODUCER"} in body["producerDataSet"]


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, 7),
        (ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, 0),
        (ConsumeFromWhere.CONSUME_FROM_TIMESTAMP, 3),
    ],
)
async def test_start_offset_follows_consume_from_where(
    namesrv: str, make_broker: MakeBroker, where: ConsumeFromWhere, expected: int
) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW), RETRY: (1, 1, RW)})
    broker.handlers[RequestCode.SEARCH_OFFSET_BY_TIMESTAMP] = lambda _c, cmd: cmd.response(ext_fields={"offset": "3"})
    broker.consumer_ids = ["only"]
    consumer = PushConsumer("G", namesrv, instance_name="only", client_ip="", consume_from_where=where)
    consumer.config.client_ip = None
    consumer.subscribe("T")
    consumer.register_listener(ok)
    broker.consumer_ids = [consumer.config.client_id]
    async with consumer:
        await aeventually(lambda: pulls(broker, "T") and pulls(broker, RETRY), "first pulls")
        (first,) = pulls(broker, "T")
        assert first.queueOffset == expected
        # The retry topic starts at 0 (LAST/FIRST) or at its max (TIMESTAMP), never by searching.
        assert pulls(broker, RETRY)[0].queueOffset == (7 if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP else 0)
        assert first.sysFlag & 0x2 and first.sysFlag & 0x4  # SUSPEND | SUBSCRIPTION
        assert first.suspendTimeoutMillis == 15000 and first.subscription == "*"
    if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
        assert broker.of_code(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)


async def test_messages_are_filtered_by_tag_and_offsets_committed(namesrv: str, make_broker: MakeBroker) -> None:
    clock = FakeClock()
    broker = await make_broker("broker-a", {"T": (1, 1, RW), RETRY: (1, 1, RW)})
    broker.stored_offsets = {("T", 0): 0}
    gate = asyncio.Event()
    broker.pull_script[("T", 0)] = [
        (0, [stored("T", 0, 0, b"a", "TagA"), stored("T", 0, 1, b"b", "TagB"), stored("T", 0, 2, b"c", "TagA")], 3),
        gate,
        (ResponseCode.PULL_RETRY_IMMEDIATELY, [], 5),  # filtered out broker-side: move on
    ]
    got: list[MessageExt] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("G", namesrv, instance_name="c1", clock=clock)
    consumer.subscribe("T", "TagA")
    consumer.register_listener(listener)
    broker.consumer_ids = [consumer.config.client_id]
    async with consumer:
        mq = MessageQueue("T", "broker-a", 0)
        await aeventually(lambda: len(got) == 2, "two TagA messages")
        # TagB at offset 1 never reaches the listener, and does not hold the offset back.
        await aeventually(lambda: consumer._offset_store.get(mq) == 3, "offset 3")  # type: ignore[union-attr]
        gate.set()
        await aeventually(lambda: [h.queueOffset for h in pulls(broker, "T")] == [0, 3, 5], "pull offsets")
        assert [m.body for m in got] == [b"a", b"c"]
        assert got[0].properties[Prop.MAX_OFFSET] == "3" and got[0].topic == "T"
        third = pulls(broker, "T")[2]
        # The consumed offset rides on the pull; the broker-filtered range 3..4 counts as consumed too.
        assert third.sysFlag & 0x1 and third.commitOffset == 5
        await clock.advance(5)  # the periodic (oneway) offset commit
        await aeventually(
            lambda: any(
                c.ext_fields["topic"] == "T" and c.ext_fields["commitOffset"] == "5"
                for c in broker.of_code(RequestCode.UPDATE_CONSUMER_OFFSET)
            ),
            "offset 5 committed (the filtered tail counts as consumed)",
        )


async def test_failed_messages_go_back_to_the_broker_or_the_retry_topic(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW), RETRY: (1, 1, RW)})
    broker.stored_offsets = {("T", 0): 0}
    broker.pull_script[("T", 0)] = [(0, [stored("T", 0, 0, b"first"), stored("T", 0, 1, b"second")], 2)]
    back_calls: list[RemotingCommand] = []

    def send_back(_conn: object, cmd: RemotingCommand) -> RemotingCommand:
        back_calls.append(cmd)
        if len(back_calls) == 1:
            return cmd.response()
        return cmd.response(ResponseCode.SYSTEM_ERROR, "look message by offset failed")

    broker.handlers[RequestCode.CONSUMER_SEND_MSG_BACK] = send_back

    def reject(_msgs: list[MessageExt]) -> ConsumeStatus:
        raise RuntimeError("boom")  # raising counts as RECONSUME_LATER

    consumer = PushConsumer("G", namesrv, instance_name="c2")
    consumer.subscribe("T")
    consumer.register_listener(reject)
    broker.consumer_ids = [consumer.config.client_id]
    async with consumer:
        await aeventually(lambda: broker.of_code(RequestCode.SEND_MESSAGE_V2), "the fallback send")
        await aeventually(lambda: consumer._offset_store.get(MessageQueue("T", "broker-a", 0)) == 2, "offset 2")  # type: ignore[union-attr]
    first_back = back_calls[0].ext_fields
    assert first_back["group"] == "G" and first_back["delayLevel"] == "0" and first_back["maxReconsumeTimes"] == "16"
    offsets = {c.ext_fields["offset"] for c in back_calls}
    assert offsets == {str(stored("T", 0, 0, b"").physical_offset), str(stored("T", 0, 1, b"").physical_offset)}
    (resend,) = broker.of_code(RequestCode.SEND_MESSAGE_V2)
    h = SendMessageRequestHeader.from_ext(resend.ext_fields)
    props = decode_properties(h.properties or "")
    assert h.topic == RETRY and h.reconsumeTimes == 1 and h.maxReconsumeTimes == 16
    assert props[Prop.RETRY_TOPIC] == "T" and props[Prop.DELAY] == "3"
    assert props[Prop.UNIQ_KEY] == resend_uniq(back_calls) and resend.body in (b"first", b"second")


def resend_uniq(back_calls: list[RemotingCommand]) -> str:
    return back_calls[1].ext_fields["originMsgId"]


async def test_retry_topic_messages_show_their_original_topic(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW), RETRY: (1, 1, RW)})
    broker.stored_offsets = {(RETRY, 0): 0}
    rec = stored(RETRY, 0, 0, b"again", RETRY_TOPIC="T")
    rec.reconsume_times = 1
    broker.pull_script[(RETRY, 0)] = [(0, [rec], 1)]
    got: list[MessageExt] = []

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:  # async listeners run on the loop
        got.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("G", namesrv, instance_name="c3")
    consumer.subscribe("T")
    consumer.register_listener(listener)
    broker.consumer_ids = [consumer.config.client_id]
    async with consumer:
        await aeventually(lambda: got, "the retried message")
    assert got[0].topic == "T" and got[0].reconsume_times == 1 and got[0].body == b"again"


async def test_orderly_locks_first_retries_in_place_and_unlocks(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW), RETRY: (1, 1, RW)})
    broker.stored_offsets = {("T", 0): 0, (RETRY, 0): 0}
    broker.pull_script[("T", 0)] = [(0, [stored("T", 0, i, f"m{i}".encode()) for i in range(3)], 3)]
    seen: list[int] = []

    def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        seen.extend(m.queue_offset for m in msgs)
        if seen == [0]:
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer("G", namesrv, instance_name="c4", suspend_current_queue_time=0.01)
    consumer.subscribe("T")
    consumer.register_listener(listener, orderly=True)
    broker.consumer_ids = [consumer.config.client_id]
    async with consumer:
        await aeventually(lambda: len(seen) == 4, "four deliveries")
        assert seen == [0, 0, 1, 2]  # the suspended message is retried before anything behind it
        first_lock = broker.requests.index(broker.of_code(RequestCode.LOCK_BATCH_MQ)[0])
        first_pull = broker.requests.index(broker.of_code(RequestCode.PULL_MESSAGE)[0])
        assert first_lock < first_pull
        await aeventually(lambda: consumer._offset_store.get(MessageQueue("T", "broker-a", 0)) == 3, "offset 3")  # type: ignore[union-attr]
    unlocked = [orjson.loads(c.body) for c in broker.of_code(RequestCode.UNLOCK_BATCH_MQ)]
    assert {(m["topic"], m["queueId"]) for u in unlocked for m in u["mqSet"]} >= {("T", 0)}
    final = {
        (c.ext_fields["topic"], c.ext_fields["queueId"]): c.ext_fields["commitOffset"]
        for c in broker.of_code(RequestCode.UPDATE_CONSUMER_OFFSET)
    }
    assert final[("T", "0")] == "3"


async def test_broadcasting_keeps_offsets_locally(namesrv: str, make_broker: MakeBroker, tmp_path: object) -> None:
    from pathlib import Path

    broker = await make_broker("broker-a", {"T": (2, 2, RW)})
    broker.pull_script[("T", 1)] = [(0, [stored("T", 1, 0, b"x")], 1)]
    got: list[MessageExt] = []
    consumer = PushConsumer(
        "BG",
        namesrv,
        message_model=MessageModel.BROADCASTING,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        offset_store_dir=str(tmp_path),
    )
    consumer.subscribe("T")
    consumer.register_listener(lambda msgs: got.extend(msgs) or ConsumeStatus.CONSUME_SUCCESS)
    async with consumer:
        assert len(consumer.assigned_queues()) == 2  # every queue; no retry topic in broadcasting
        await aeventually(lambda: got, "the message")
    assert not broker.of_code(RequestCode.GET_CONSUMER_LIST_BY_GROUP)
    assert not broker.of_code(RequestCode.QUERY_CONSUMER_OFFSET)
    saved = orjson.loads((Path(str(tmp_path)) / "BG.json").read_bytes())
    assert {"topic": "T", "brokerName": "broker-a", "queueId": 1, "offset": 1} in saved["offsetTable"]


async def test_start_needs_a_listener_and_a_subscription(namesrv: str) -> None:
    consumer = PushConsumer("G", namesrv)
    with pytest.raises(MQClientError, match="listener"):
        await consumer.start()
    consumer.register_listener(ok)
    with pytest.raises(MQClientError, match="subscribe"):
        await consumer.start()
    with pytest.raises(MQClientError):
        consumer.subscribe("bad topic!")


async def test_orderly_waits_for_the_broker_lock_and_renews_it(namesrv: str, make_broker: MakeBroker) -> None:
    clock = FakeClock()
    broker = await make_broker("broker-a", {"T": (1, 1, RW), RETRY: (1, 1, RW)})
    broker.stored_offsets = {("T", 0): 0, (RETRY, 0): 0}
    granted: set[tuple[str, int]] = set()

    def lock(_conn: object, cmd: RemotingCommand) -> RemotingCommand:
        asked = orjson.loads(cmd.body)["mqSet"]
        ok = [m for m in asked if (m["topic"], m["queueId"]) in granted]
        return cmd.response(body=orjson.dumps({"lockOKMQSet": ok}))

    broker.handlers[RequestCode.LOCK_BATCH_MQ] = lock
    consumer = PushConsumer("G", namesrv, instance_name="c5", clock=clock)
    consumer.subscribe("T")
    consumer.register_listener(lambda msgs: ConsumeOrderlyStatus.SUCCESS, orderly=True)
    broker.consumer_ids = [consumer.config.client_id]
    async with consumer:
        assert consumer.assigned_queues() == []  # another consumer still holds the locks
        assert not broker.of_code(RequestCode.PULL_MESSAGE)
        granted |= {("T", 0), (RETRY, 0)}
        await clock.advance(20)  # the next rebalance locks and starts pulling
        await aeventually(lambda: len(consumer.assigned_queues()) == 2, "both queues locked")
        await aeventually(lambda: pulls(broker, "T"), "a pull after the lock")
        locks_before = len(broker.of_code(RequestCode.LOCK_BATCH_MQ))
        await clock.advance(20)  # the 20 s re-lock (and a rebalance) renew the locks
        await aeventually(lambda: len(broker.of_code(RequestCode.LOCK_BATCH_MQ)) > locks_before, "a re-lock")
