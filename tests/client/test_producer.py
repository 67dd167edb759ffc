"""Producer against a real name server and scripted fake brokers: wire format, retries, broker choice, fallbacks."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable

import orjson
import pytest
from client_fakes import FakeBroker

from txmq.client import Message, MessageQueue, Producer, SendStatus
from txmq.client.wire import send_v2_ext
from txmq.errors import MQBrokerError, MQClientError, NoRouteError, RequestTimeoutError
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.record import Prop, decode_batch, decode_properties
from txmq.testing import FakeClock, aeventually

MakeBroker = Callable[..., Awaitable[FakeBroker]]
RW = 6


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("max_reconsume", [None, 16])
def test_direct_v2_ext_equals_the_typed_header(batch: bool, max_reconsume: int | None) -> None:
    typed = SendMessageRequestHeader(
        producerGroup="PG",
        topic="T",
        defaultTopic="TBW102",
        defaultTopicQueueNums=4,
        queueId=3,
        sysFlag=1,
        bornTimestamp=1700,
        flag=9,
        properties="A\x01b",
        reconsumeTimes=2,
        unitMode=False,
        maxReconsumeTimes=max_reconsume,
        batch=batch,
    ).to_v2_ext()
    assert send_v2_ext("PG", "T", 4, 3, 1, 1700, 9, "A\x01b", 2, max_reconsume, batch) == typed


def sends(broker: FakeBroker) -> list[RemotingCommand]:
    return broker.of_code(RequestCode.SEND_MESSAGE_V2) + broker.of_code(RequestCode.SEND_BATCH_MESSAGE)


def refuse(code: int) -> Callable[..., RemotingCommand]:
    return lambda _conn, cmd: cmd.response(code, f"refused with {code} for the test")


async def test_send_v2_wire_format_and_result(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (4, 4, RW)})
    async with Producer("PG", namesrv) as producer:
        msg = Message("T", b"hello", tags="TagA", keys=["k1", "k2"])
        msg.put_user_property("color", "red")
        result = await producer.send(msg)
    (cmd,) = sends(broker)
    assert cmd.code == RequestCode.SEND_MESSAGE_V2
    ext = cmd.ext_fields
    assert set("abcdefghijkl") - {"i", "j", "k", "l"} <= set(ext)  # one-letter V2 names
    assert "producerGroup" not in ext
    h = SendMessageRequestHeader.from_ext(ext)
    assert (h.producerGroup, h.topic, h.defaultTopic, h.defaultTopicQueueNums) == ("PG", "T", "TBW102", 4)
    assert 0 <= h.queueId < 4 and h.sysFlag == 0 and h.bornTimestamp > 0 and h.batch is False
    props = decode_properties(h.properties or "")
    assert props[Prop.TAGS] == "TagA" and props[Prop.KEYS] == "k1 k2" and props[Prop.WAIT] == "true"
    assert props["color"] == "red" and len(props[Prop.UNIQ_KEY]) == 32
    assert cmd.body == b"hello"
    assert result.status is SendStatus.SEND_OK
    assert result.msg_id == props[Prop.UNIQ_KEY] == msg.uniq_key
    assert result.message_queue == MessageQueue("T", "broker-a", h.queueId)
    assert result.offset_msg_id.startswith("7F000001") and result.region_id == "DefaultRegion"


async def test_half_messages_carry_the_prepared_sys_flag(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW)})
    async with Producer("PG", namesrv) as producer:
        await producer.send(Message("T", b"half", properties={Prop.TRAN_MSG: "true", Prop.PGROUP: "PG"}))
    assert int(sends(broker)[0].ext_fields["f"]) & 0x4


async def test_round_robin_spreads_over_brokers_and_queues(namesrv: str, make_broker: MakeBroker) -> None:
    a = await make_broker("broker-a", {"T": (2, 2, RW)})
    b = await make_broker("broker-b", {"T": (2, 2, RW)})
    async with Producer("PG", namesrv) as producer:
        results = [await producer.send(Message("T", b"x")) for _ in range(8)]
    assert {r.message_queue for r in results} == {
        MessageQueue("T", n, i) for n in ("broker-a", "broker-b") for i in (0, 1)
    }
    assert len(sends(a)) == len(sends(b)) == 4


async def test_retryable_error_moves_the_send_to_another_broker(namesrv: str, make_broker: MakeBroker) -> None:
    a = await make_broker("broker-a", {"T": (2, 2, RW)})
    b = await make_broker("broker-b", {"T": (2, 2, RW)})
    a.handlers[RequestCode.SEND_MESSAGE_V2] = refuse(ResponseCode.SERVICE_NOT_AVAILABLE)
    async with Producer("PG", namesrv) as producer:
        results = [await producer.send(Message("T", f"m{i}".encode())) for i in range(6)]
    assert all(r.message_queue.broker_name == "broker-b" for r in results)
    tried_on_a = [decode_properties(c.ext_fields["i"])[Prop.UNIQ_KEY] for c in sends(a)]
    assert tried_on_a, "round-robin should have picked broker-a first for some sends"
    assert len(tried_on_a) == len(set(tried_on_a))  # after a failure the retry avoids broker-a
    on_b = [decode_properties(c.ext_fields["i"])[Prop.UNIQ_KEY] for c in sends(b)]
    assert set(tried_on_a) <= set(on_b)  # the same message (same UNIQ_KEY) was retried on b
    assert sorted(on_b) == sorted(r.msg_id for r in results)


async def test_non_retryable_error_is_raised_with_the_remark(namesrv: str, make_broker: MakeBroker) -> None:
    a = await make_broker("broker-a", {"T": (1, 1, RW)})
    b = await make_broker("broker-b", {"T": (1, 1, RW)})
    for broker in (a, b):
        broker.handlers[RequestCode.SEND_MESSAGE_V2] = refuse(ResponseCode.MESSAGE_ILLEGAL)
    async with Producer("PG", namesrv) as producer:
        with pytest.raises(MQBrokerError) as info:
            await producer.send(Message("T", b"x"))
    assert info.value.code == 13
    assert "refused with 13 for the test" in str(info.value)
    assert len(sends(a)) + len(sends(b)) == 1


async def test_retries_are_bounded(namesrv: str, make_broker: MakeBroker) -> None:
    brokers = [await make_broker(f"broker-{n}", {"T": (1, 1, RW)}) for n in "abcd"]
    for broker in brokers:
        broker.handlers[RequestCode.SEND_MESSAGE_V2] = refuse(ResponseCode.TOPIC_NOT_EXIST)
    async with Producer("PG", namesrv, retry_times_when_send_failed=2) as producer:
        with pytest.raises(MQBrokerError) as info:
            await producer.send(Message("T", b"x"))
    assert info.value.code == 17
    assert sorted(len(sends(b)) for b in brokers) == [0, 1, 1, 1]  # three different brokers, once each


async def test_unreachable_broker_is_skipped(namesrv: str, make_broker: MakeBroker) -> None:
    dead = await make_broker("broker-a", {"T": (1, 1, RW)})
    live = await make_broker("broker-b", {"T": (1, 1, RW)})
    await dead.close(keep_route=True)  # the name server still routes to it; connecting is refused
    async with Producer("PG", namesrv) as producer:
        results = [await producer.send(Message("T", b"x")) for _ in range(4)]
    assert all(r.message_queue.broker_name == "broker-b" for r in results)
    assert len(sends(live)) == 4


async def test_orderly_send_uses_the_selector_and_does_not_move(namesrv: str, make_broker: MakeBroker) -> None:
    a = await make_broker("broker-a", {"T": (4, 4, RW)})
    b = await make_broker("broker-b", {"T": (4, 4, RW)})
    seen: list[list[MessageQueue]] = []

    def pick_last(queues: list[MessageQueue], _msg: Message, arg: int) -> MessageQueue:
        seen.append(list(queues))
        return queues[arg]

    async with Producer("PG", namesrv) as producer:
        r = await producer.send(Message("T", b"x"), selector=pick_last, arg=5)
        assert r.message_queue == MessageQueue("T", "broker-b", 1)
        keyed = {(await producer.send_orderly(Message("T", b"y"), "order-7")).message_queue for _ in range(5)}
        assert len(keyed) == 1
        b.handlers[RequestCode.SEND_MESSAGE_V2] = refuse(ResponseCode.SERVICE_NOT_AVAILABLE)
        with pytest.raises(MQBrokerError):
            await producer.send(Message("T", b"z"), selector=pick_last, arg=5)
    assert len(seen[0]) == 8
    assert len(sends(a)) + len(sends(b)) == 7  # 1 + 5 + the refused one, which was not retried elsewhere


async def test_unknown_topic_goes_through_tbw102(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"TBW102": (8, 8, 7)})
    async with Producer("PG", namesrv, default_topic_queue_nums=3) as producer:
        queues = await producer.fetch_publish_queues("Fresh")
        await producer.send(Message("Fresh", b"x"))
    assert queues == [MessageQueue("Fresh", "broker-a", i) for i in range(3)]
    h = SendMessageRequestHeader.from_ext(sends(broker)[0].ext_fields)
    assert (h.topic, h.defaultTopic, h.defaultTopicQueueNums) == ("Fresh", "TBW102", 3)
    assert 0 <= h.queueId < 3


async def test_no_route_without_auto_create(namesrv: str, make_broker: MakeBroker) -> None:
    await make_broker("broker-a", {"TBW102": (8, 8, 7)})
    async with Producer("PG", namesrv, auto_create_topic=False) as producer:
        with pytest.raises(NoRouteError, match="No route info of this topic: Nowhere"):
            await producer.send(Message("Nowhere", b"x"))


async def test_batch_is_one_request_with_per_entry_ids(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW)})
    msgs = [Message("T", f"body-{i}".encode(), tags=f"t{i}") for i in range(3)]
    async with Producer("PG", namesrv) as producer:
        result = await producer.send_batch(msgs)
        with pytest.raises(MQClientError, match="same topic"):
            await producer.send_batch([Message("T", b"a"), Message("U", b"b")])
        with pytest.raises(MQClientError, match="delayed"):
            await producer.send_batch([Message("T", b"a", delay_level=2)])
    (cmd,) = sends(broker)
    assert cmd.code == RequestCode.SEND_BATCH_MESSAGE and cmd.ext_fields["m"] == "true"
    entries = decode_batch(cmd.body)
    assert [e.body for e in entries] == [m.body for m in msgs]
    ids = [decode_properties(e.properties)[Prop.UNIQ_KEY] for e in entries]
    assert len(set(ids)) == 3 and result.msg_id == ",".join(ids)
    assert [decode_properties(e.properties)[Prop.TAGS] for e in entries] == ["t0", "t1", "t2"]


async def test_large_bodies_are_compressed(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW)})
    body = b"abc" * 5000
    async with Producer("PG", namesrv) as producer:
        await producer.send(Message("T", body))
        await producer.send(Message("T", b"small"))
    big, small = sends(broker)
    assert int(big.ext_fields["f"]) & 1 and zlib.decompress(big.body) == body
    assert int(small.ext_fields["f"]) == 0 and small.body == b"small"


async def test_oneway_and_async_sends(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW)})
    called: list[tuple[object, object]] = []
    async with Producer("PG", namesrv) as producer:
        await producer.send_oneway(Message("T", b"fire"))
        task = producer.send_async(Message("T", b"later"), callback=lambda r, e: called.append((r, e)))
        result = await task
        await aeventually(lambda: len(sends(broker)) == 2, "both sends")
    assert called == [(result, None)]
    oneway = next(c for c in sends(broker) if c.body == b"fire")
    assert oneway.flag & 2


async def test_messages_are_checked_before_sending(namesrv: str, make_broker: MakeBroker) -> None:
    await make_broker("broker-a", {"T": (1, 1, RW)})
    async with Producer("PG", namesrv) as producer:
        with pytest.raises(MQClientError, match="body length is zero"):
            await producer.send(Message("T", b""))
        with pytest.raises(MQClientError, match="illegal characters"):
            await producer.send(Message("bad topic", b"x"))
        with pytest.raises(MQClientError, match="forbidden"):
            await producer.send(Message("TBW102", b"x"))
    async with Producer("PG", namesrv, max_message_size=10) as producer:
        with pytest.raises(MQClientError, match="over max"):
            await producer.send(Message("T", b"x" * 11))
    with pytest.raises(MQClientError, match="not started"):
        await Producer("PG", namesrv).send(Message("T", b"x"))


async def test_heartbeat_body_and_unregister(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW)})
    producer = Producer("PG", namesrv, instance_name="hb-test")
    await producer.start()
    await producer.send(Message("T", b"x"))
    await producer.instance.send_heartbeat_to_all()
    client_id = producer.client_id
    await producer.shutdown()
    body = orjson.loads(broker.of_code(RequestCode.HEART_BEAT)[-1].body)
    assert body["clientID"] == client_id and client_id.endswith("@hb-test")
    assert body["producerDataSet"] == [{"groupName": "PG"}]
    assert body["consumerDataSet"] == []
    (unreg,) = broker.of_code(RequestCode.UNREGISTER_CLIENT)
    assert unreg.ext_fields == {"clientID": client_id, "producerGroup": "PG"}


async def test_default_client_id_is_ip_at_pid(namesrv: str, make_broker: MakeBroker) -> None:
    import os

    await make_broker("broker-a", {"T": (1, 1, RW)})
    async with Producer("PG", namesrv) as producer:
        ip, _, instance = producer.client_id.partition("@")
        assert ip.count(".") == 3
        assert instance.startswith(f"{os.getpid()}#")


async def test_heartbeats_and_route_refresh_run_on_the_clock(namesrv: str, make_broker: MakeBroker) -> None:
    clock = FakeClock()
    broker = await make_broker("broker-a", {"T": (1, 1, RW)})
    async with Producer("PG", namesrv, clock=clock) as producer:
        await producer.send(Message("T", b"x"))
        beats = len(broker.of_code(RequestCode.HEART_BEAT))
        await broker.register(namesrv, {"T": (3, 3, RW)})  # the topic grows
        assert len(await producer.fetch_publish_queues("T")) == 1  # cached until the next refresh
        await clock.advance(30)
        await aeventually(lambda: len(broker.of_code(RequestCode.HEART_BEAT)) > beats, "a periodic heartbeat")
        await aeventually(lambda: producer.instance.route("T").publish_queues().__len__() == 3, "route refresh")  # type: ignore[union-attr]


async def test_broker_initiated_requests_reach_registered_handlers(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW)})
    checks: list[RemotingCommand] = []
    async with Producer("PG", namesrv) as producer:
        producer.instance.register_request_handler(
            RequestCode.CHECK_TRANSACTION_STATE, lambda _c, cmd: checks.append(cmd)
        )
        await producer.send(Message("T", b"x"))
        (conn,) = broker.connections
        conn.send_oneway(RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {"msgId": "M1"}))
        unknown = await conn.request(RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO), 5)
        await aeventually(lambda: checks, "the check request")
    assert checks[0].ext_fields["msgId"] == "M1"
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_send_timeout_bounds_all_attempts(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, RW)})

    async def never(_conn: object, _cmd: RemotingCommand) -> None:
        await asyncio.Event().wait()

    broker.handlers[RequestCode.SEND_MESSAGE_V2] = never
    async with Producer("PG", namesrv) as producer:
        with pytest.raises(RequestTimeoutError):
            await producer.send(Message("T", b"x"), timeout=0.2)
    assert len(sends(broker)) == 1  # the timeout used up the budget; no retry after it


async def test_a_failed_send_refreshes_the_route_at_once(namesrv: str, make_broker: MakeBroker) -> None:
    a = await make_broker("broker-a", {"T": (1, 1, RW)})
    await make_broker("broker-b", {"T": (1, 1, RW)})
    async with Producer("PG", namesrv, clock=FakeClock()) as producer:  # the 30 s refresh never fires here
        await producer.send(Message("T", b"warm-up"))
        assert len(await producer.fetch_publish_queues("T")) == 2
        await a.register(namesrv, {"T": (1, 1, 4)})  # broker-a turns read-only ...
        a.handlers[RequestCode.SEND_MESSAGE_V2] = refuse(ResponseCode.NO_PERMISSION)  # ... and refuses sends
        for _ in range(4):
            assert (await producer.send(Message("T", b"x"))).message_queue.broker_name == "broker-b"
        await aeventually(
            lambda: [q.broker_name for q in producer.instance.route("T").publish_queues()] == ["broker-b"],  # type: ignore[union-attr]
            "the refreshed route",
        )
