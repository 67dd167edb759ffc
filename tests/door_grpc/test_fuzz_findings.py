"""Regression tests of what the gRPC door's fuzzing (``txmq chaos --parts grpc-fuzz``) found: each request here is
one the fuzzer produced (reduced by hand), answered with a clear status while the broker keeps serving."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from tests.cluster_harness import free_port

from txmq.door_grpc.pb import definition_pb2 as d
from txmq.door_grpc.pb import service_pb2 as s
from txmq.door_grpc.pb import service_pb2_grpc
from txmq.testing import InProcessBroker


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[tuple[InProcessBroker, Any]]:
    port = free_port()
    harness = InProcessBroker(tmp_path, grpc_listen_port=port, min_invisible_time_mills_for_recv=1000)
    await harness.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield harness, service_pb2_grpc.MessagingServiceStub(channel)
    finally:
        await channel.close()
        await harness.stop()


def message(topic: str, body: bytes = b"x", message_id: str = "01AB", **fields: Any) -> d.Message:
    user = fields.pop("user_properties", {})
    return d.Message(
        topic=d.Resource(name=topic),
        body=body,
        user_properties=user,
        system_properties=d.SystemProperties(message_id=message_id, body_encoding=d.IDENTITY, **fields),
    )


async def send(stub: Any, msg: d.Message) -> s.SendMessageResponse:
    return await stub.SendMessage(s.SendMessageRequest(messages=[msg]), timeout=10)


async def create_group(harness: InProcessBroker, group: str) -> None:
    import orjson

    from txmq.protocol.codes import RequestCode
    from txmq.protocol.frame import RemotingCommand

    conn = await harness.connect()
    body = orjson.dumps({"groupName": group, "retryMaxTimes": 3})
    resp = await conn.request(
        RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body), timeout=5
    )
    assert resp.code == 0, resp.remark


async def receive_all(stub: Any, topic: str, group: str) -> list[d.Message]:
    request = s.ReceiveMessageRequest(
        group=d.Resource(name=group),
        message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=-1),
        filter_expression=d.FilterExpression(type=d.TAG, expression="*"),
        batch_size=32,
        invisible_duration=Duration(seconds=30),
        long_polling_timeout=Duration(seconds=0),
    )
    out: list[d.Message] = []
    for _ in range(3):
        out += [r.message async for r in stub.ReceiveMessage(request, timeout=5) if r.HasField("message")]
    return out


# Found by the fuzzer: a text field of a 5.x message carrying the record's separators (\x01 between a property's
# name and value, \x02 between properties) was written into the stored properties string as is, so one user property
# could set others: a delay level, a transaction flag, another message id. Each is refused now.
INJECTIONS = [
    ({"user_properties": {"k": "v\x02DELAY\x013"}}, d.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ({"user_properties": {"k\x01UNIQ_KEY": "v"}}, d.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ({"keys": ["a\x02TRAN_MSG\x01true"]}, d.ILLEGAL_MESSAGE_KEY),
    ({"tag": "a\x02KEYS\x01b"}, d.ILLEGAL_MESSAGE_TAG),
    ({"message_group": "g\x00"}, d.ILLEGAL_MESSAGE_GROUP),
    ({"message_id": "01\x02TAGS\x01x"}, d.ILLEGAL_MESSAGE_ID),
]


@pytest.mark.parametrize(("fields", "code"), INJECTIONS)
async def test_separators_in_a_messages_text_fields_are_refused(door: Any, fields: dict[str, Any], code: int) -> None:
    harness, stub = door
    await create_group(harness, "InjG")
    fields = dict(fields)
    answer = await send(stub, message("InjT", b"bad", message_id=fields.pop("message_id", "01AB"), **fields))
    assert answer.status.code == code, answer
    assert "control character" in answer.status.message
    # Nothing of it was stored, and a well-formed message with odd (printable) text still round-trips exactly.
    good = await send(
        stub, message("InjT", b"good", "01CD", tag="t\u00e9", keys=["k 1"], user_properties={"n\u4e2d": "v=|;"})
    )
    assert good.status.code == d.OK, good
    [got] = await receive_all(stub, "InjT", "InjG")
    assert got.body == b"good"
    assert dict(got.user_properties) == {"n\u4e2d": "v=|;"}
    assert got.system_properties.tag == "t\u00e9" and list(got.system_properties.keys) == ["k", "1"]
    assert got.system_properties.message_type == d.NORMAL


# Found by the fuzzer: ReceiveMessage with a group named "x\x00..." auto-created the group; when the lease expired
# its retry copy went to a topic whose consume-queue directory cannot exist, and every checkpoint of the store
# failed from then on. Each RPC naming a consumer group now checks the name first.
BAD_GROUPS = ["bad\x00group", "../../escape", "G\n", "x" * 121]


@pytest.mark.parametrize("group", BAD_GROUPS)
async def test_an_illegal_group_name_is_refused_by_every_rpc_naming_one(door: Any, group: str) -> None:
    harness, stub = door
    assert (await send(stub, message("GrpT"))).status.code == d.OK
    resource = d.Resource(name=group)
    topic = d.Resource(name="GrpT")
    request = s.ReceiveMessageRequest(
        group=resource,
        message_queue=d.MessageQueue(topic=topic, id=-1),
        filter_expression=d.FilterExpression(type=d.TAG, expression="*"),
        batch_size=1,
        invisible_duration=Duration(seconds=1),
    )
    answers = [r async for r in stub.ReceiveMessage(request, timeout=5)]
    assert [a.status.code for a in answers] == [d.ILLEGAL_CONSUMER_GROUP]
    calls = [
        stub.QueryAssignment(s.QueryAssignmentRequest(topic=topic, group=resource), timeout=5),
        stub.AckMessage(
            s.AckMessageRequest(group=resource, topic=topic, entries=[s.AckMessageEntry(receipt_handle="h")]),
            timeout=5,
        ),
        stub.ChangeInvisibleDuration(
            s.ChangeInvisibleDurationRequest(
                group=resource, topic=topic, receipt_handle="h", invisible_duration=Duration(seconds=5)
            ),
            timeout=5,
        ),
        stub.ForwardMessageToDeadLetterQueue(
            s.ForwardMessageToDeadLetterQueueRequest(group=resource, topic=topic, receipt_handle="h"), timeout=5
        ),
        stub.Heartbeat(s.HeartbeatRequest(group=resource, client_type=d.SIMPLE_CONSUMER), timeout=5),
    ]
    for call in calls:
        answer = await call
        assert answer.status.code == d.ILLEGAL_CONSUMER_GROUP, answer
    # Telemetry: the Settings of a consumer of that group are refused on the stream.
    stream = stub.Telemetry(timeout=5)
    await stream.write(
        s.TelemetryCommand(
            settings=d.Settings(client_type=d.SIMPLE_CONSUMER, subscription=d.Subscription(group=resource))
        )
    )
    reply = await stream.read()
    assert reply.status.code == d.ILLEGAL_CONSUMER_GROUP
    stream.cancel()
    assert group not in harness.broker.subscriptions.groups
    assert not list(harness.root.rglob("*escape*"))


async def test_a_topic_name_with_a_trailing_newline_is_refused(door: Any) -> None:
    _, stub = door
    route = await stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="NlT\n")), timeout=5)
    assert route.status.code == d.ILLEGAL_TOPIC
    sent = await send(stub, message("NlT\n"))
    assert sent.status.code == d.BAD_REQUEST and "illegal characters" in sent.status.message
    stream = stub.Telemetry(timeout=5)
    await stream.write(
        s.TelemetryCommand(
            settings=d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(topics=[d.Resource(name="NlT\n")]))
        )
    )
    assert (await stream.read()).status.code == d.ILLEGAL_TOPIC
    stream.cancel()


async def test_times_beyond_64_bits_are_refused_with_a_clear_status(door: Any) -> None:
    """A born time past 2^63 ms was refused only by the store ("storing failed: MESSAGE_ILLEGAL"); a delivery time
    past it was stored as a TIMER_DELIVER_MS no Java client can parse."""
    _, stub = door
    born = await send(stub, message("TimeT", born_timestamp=Timestamp(seconds=2**62)))
    assert born.status.code == d.BAD_REQUEST and "born_timestamp" in born.status.message
    late = await send(stub, message("TimeT", delivery_timestamp=Timestamp(seconds=2**62)))
    assert late.status.code == d.ILLEGAL_DELIVERY_TIME
    ok = await send(stub, message("TimeT", born_timestamp=Timestamp(seconds=1_700_000_000)))
    assert ok.status.code == d.OK
