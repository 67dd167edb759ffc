"""The gRPC door in process, over real sockets with grpc's own client: bad input gets a clear status and the
broker keeps serving; receive / ack / redelivery / DLQ driven by the fake clock."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from tests.cluster_harness import free_port

from txmq.door_grpc.pb import definition_pb2 as d
from txmq.door_grpc.pb import service_pb2 as s
from txmq.door_grpc.pb import service_pb2_grpc
from txmq.testing import InProcessBroker, aeventually

MAX_BODY = 64 * 1024


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[tuple[InProcessBroker, service_pb2_grpc.MessagingServiceStub, int]]:
    port = free_port()
    harness = InProcessBroker(
        tmp_path,
        grpc_listen_port=port,
        max_message_size=MAX_BODY,
        auto_create_subscription_group=False,
        min_invisible_time_mills_for_recv=1000,
        message_delay_level="1s 1s 1s 1s",
    )
    await harness.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield harness, service_pb2_grpc.MessagingServiceStub(channel), port
    finally:
        await channel.close()
        await harness.stop()


def message(topic: str, body: bytes, message_id: str = "01AB", **system: Any) -> d.Message:
    return d.Message(
        topic=d.Resource(name=topic),
        body=body,
        system_properties=d.SystemProperties(message_id=message_id, body_encoding=d.IDENTITY, **system),
    )


async def send(stub: Any, *messages: d.Message) -> s.SendMessageResponse:
    return await stub.SendMessage(s.SendMessageRequest(messages=list(messages)), timeout=5)


async def receive(stub: Any, topic: str, group: str, invisible_s: int = 5) -> list[s.ReceiveMessageResponse]:
    request = s.ReceiveMessageRequest(
        group=d.Resource(name=group),
        message_queue=d.MessageQueue(topic=d.Resource(name=topic), id=-1),
        filter_expression=d.FilterExpression(type=d.TAG, expression="*"),
        batch_size=16,
        invisible_duration=Duration(seconds=invisible_s),
        long_polling_timeout=Duration(seconds=0),
    )
    return [r async for r in stub.ReceiveMessage(request, timeout=5)]


async def create_group(
    harness: InProcessBroker, group: str, retry_max_times: int = 16, *, orderly: bool = False
) -> None:
    import orjson

    from txmq.protocol.codes import RequestCode
    from txmq.protocol.frame import RemotingCommand

    conn = await harness.connect()
    body = orjson.dumps({"groupName": group, "retryMaxTimes": retry_max_times, "consumeMessageOrderly": orderly})
    resp = await conn.request(
        RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body), timeout=5
    )
    assert resp.code == 0, resp.remark


async def still_serving(stub: Any) -> None:
    route = await stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="TBW102")), timeout=5)
    assert route.status.code == d.OK


async def test_query_route_lists_the_brokers_grpc_endpoint(door: Any) -> None:
    _harness, stub, port = door
    route = await stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="RouteT")), timeout=5)
    assert route.status.code == d.OK
    assert {
        (q.broker.endpoints.addresses[0].host, q.broker.endpoints.addresses[0].port) for q in route.message_queues
    } == {("127.0.0.1", port)}
    assert all(q.permission == d.READ_WRITE and q.broker.id == 0 for q in route.message_queues)
    assert set(route.message_queues[0].accept_message_types) >= {d.NORMAL, d.FIFO, d.DELAY}


async def test_send_answers_one_entry_per_message(door: Any) -> None:
    _, stub, _ = door
    resp = await send(stub, message("SendT", b"x", "01A1"))
    assert resp.status.code == d.OK
    assert [(e.status.code, e.message_id) for e in resp.entries] == [(d.OK, "01A1")]


async def test_bad_messages_get_the_proxys_codes(door: Any) -> None:
    _, stub, _ = door
    too_big = await send(stub, message("BadT", b"x" * (MAX_BODY + 1)))
    assert too_big.status.code == d.MESSAGE_BODY_TOO_LARGE and "over the limit" in too_big.status.message
    empty = await send(stub, message("BadT", b""))
    assert empty.status.code == d.MESSAGE_BODY_EMPTY
    no_id = await send(stub, message("BadT", b"x", message_id=""))
    assert no_id.status.code == d.ILLEGAL_MESSAGE_ID
    bad_topic = await send(stub, message("no spaces allowed", b"x"))
    assert bad_topic.status.code == d.BAD_REQUEST and "topic" in bad_topic.status.message
    nothing = await stub.SendMessage(s.SendMessageRequest(), timeout=5)
    assert nothing.status.code == d.BAD_REQUEST
    route = await stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="")), timeout=5)
    assert route.status.code == d.ILLEGAL_TOPIC
    await still_serving(stub)


async def test_a_request_over_grpcs_limit_is_refused_by_grpc(door: Any) -> None:
    _, stub, _ = door
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await send(stub, message("HugeT", b"x" * (MAX_BODY + 2 * 1024 * 1024)))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await still_serving(stub)


async def test_unknown_topic_group_and_handle(door: Any) -> None:
    harness, stub, _ = door
    [unknown_topic] = await receive(stub, "NeverMade", "G")
    assert unknown_topic.status.code == d.TOPIC_NOT_FOUND
    await send(stub, message("KnownT", b"x"))
    [unknown_group] = await receive(stub, "KnownT", "NoSuchGroup")
    assert unknown_group.status.code == d.CONSUMER_GROUP_NOT_FOUND
    await create_group(harness, "G")
    ack = await stub.AckMessage(
        s.AckMessageRequest(
            group=d.Resource(name="G"),
            topic=d.Resource(name="KnownT"),
            entries=[s.AckMessageEntry(message_id="01", receipt_handle="made-up")],
        ),
        timeout=5,
    )
    assert ack.status.code == d.INVALID_RECEIPT_HANDLE
    [too_short] = await receive(stub, "KnownT", "G", invisible_s=0)
    assert too_short.status.code == d.ILLEGAL_INVISIBLE_TIME
    await still_serving(stub)


async def test_malformed_protobuf_is_a_bad_request_and_the_door_keeps_serving(door: Any) -> None:
    _, stub, port = door
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        raw = channel.unary_unary(
            "/apache.rocketmq.v2.MessagingService/SendMessage",
            request_serializer=lambda b: b,
            response_deserializer=s.SendMessageResponse.FromString,
        )
        answer = await raw(b"\xff\xff\xff\xff\x0f", timeout=5)
        assert answer.status.code == d.BAD_REQUEST
        assert "not a valid apache.rocketmq.v2.SendMessageRequest" in answer.status.message
        stream = channel.unary_stream(
            "/apache.rocketmq.v2.MessagingService/ReceiveMessage",
            request_serializer=lambda b: b,
            response_deserializer=s.ReceiveMessageResponse.FromString,
        )
        [only] = [r async for r in stream(b"\x0a\xff", timeout=5)]
        assert only.status.code == d.BAD_REQUEST
    await still_serving(stub)


def _h2_request(content_type: bytes) -> bytes:
    """An HTTP/2 POST to SendMessage with the given content type (HPACK literals, no Huffman)."""

    def literal(name: bytes, value: bytes) -> bytes:
        return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value

    block = b"".join(
        literal(n, v)
        for n, v in [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/apache.rocketmq.v2.MessagingService/SendMessage"),
            (b":authority", b"localhost"),
            (b"content-type", content_type),
            (b"te", b"trailers"),
        ]
    )

    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload

    body = b"\x00" + struct.pack(">I", 2) + b"\x08\x01"
    return (
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + frame(4, 0, 0, b"")  # SETTINGS
        + frame(1, 0x4, 1, block)  # HEADERS, END_HEADERS
        + frame(0, 0x1, 1, body)  # DATA, END_STREAM
    )


async def _exchange(port: int, data: bytes) -> bytes:
    def talk() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(data)
            chunks = []
            try:
                while len(b"".join(chunks)) < 65536:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
            except TimeoutError:
                pass
            return b"".join(chunks)

    return await asyncio.get_running_loop().run_in_executor(None, talk)


async def test_garbage_and_wrong_content_type_are_answered_and_the_door_keeps_serving(door: Any) -> None:
    _, stub, port = door
    await _exchange(port, b"\x16\x03\x01\x02\x00" + bytes(range(256)) * 4)  # a TLS hello's start and noise
    await _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await _exchange(port, _h2_request(b"text/plain"))
    # grpc core does not insist on application/grpc: the stream is answered with a gRPC status (here the door's
    # BAD_REQUEST for a request that carries no message) rather than left hanging.
    assert b"grpc-status" in answer, answer[:300]
    await still_serving(stub)


async def test_receive_ack_and_redelivery_after_the_invisible_duration(door: Any) -> None:
    harness, stub, _ = door
    await create_group(harness, "RG")
    await send(stub, message("RecvT", b"one", "01B1"), message("RecvT", b"two", "01B2"))
    first = await receive(stub, "RecvT", "RG", invisible_s=10)
    assert first[0].status.code == d.OK
    got = {r.message.system_properties.message_id: r.message for r in first if r.HasField("message")}
    assert set(got) == {"01B1", "01B2"}
    assert all(m.system_properties.delivery_attempt == 1 for m in got.values())
    ack = await stub.AckMessage(
        s.AckMessageRequest(
            group=d.Resource(name="RG"),
            topic=d.Resource(name="RecvT"),
            entries=[s.AckMessageEntry(message_id="01B1", receipt_handle=got["01B1"].system_properties.receipt_handle)],
        ),
        timeout=5,
    )
    assert ack.status.code == d.OK
    [empty] = await receive(stub, "RecvT", "RG")
    assert empty.status.code == d.MESSAGE_NOT_FOUND
    await harness.clock.advance(11)

    async def redelivered() -> list[d.Message]:
        return [r.message for r in await receive(stub, "RecvT", "RG") if r.HasField("message")]

    again = await aeventually(redelivered, "the unacked message comes back")
    assert [(m.system_properties.message_id, m.system_properties.delivery_attempt, m.topic.name) for m in again] == [
        ("01B2", 2, "RecvT")
    ]
    # The first handle was replaced by the redelivery.
    stale = await stub.AckMessage(
        s.AckMessageRequest(
            group=d.Resource(name="RG"),
            topic=d.Resource(name="RecvT"),
            entries=[s.AckMessageEntry(message_id="01B2", receipt_handle=got["01B2"].system_properties.receipt_handle)],
        ),
        timeout=5,
    )
    assert stale.status.code == d.INVALID_RECEIPT_HANDLE


async def test_forward_to_dead_letter_queue(door: Any) -> None:
    harness, stub, _ = door
    await create_group(harness, "DG")
    await send(stub, message("DlqT", b"poison", "01C1"))
    [_, _, received] = await receive(stub, "DlqT", "DG")
    handle = received.message.system_properties.receipt_handle
    resp = await stub.ForwardMessageToDeadLetterQueue(
        s.ForwardMessageToDeadLetterQueueRequest(
            group=d.Resource(name="DG"),
            topic=d.Resource(name="DlqT"),
            receipt_handle=handle,
            message_id="01C1",
            delivery_attempt=1,
            max_delivery_attempts=1,
        ),
        timeout=5,
    )
    assert resp.status.code == d.OK
    broker = harness.broker
    assert broker is not None
    [(phys, size, _)] = broker.store.read_consume_queue("%DLQ%DG", 0, 0, 10)
    dead = broker.store.read_message(phys, size)
    assert dead is not None and dead.body == b"poison" and dead.properties["UNIQ_KEY"] == "01C1"
    await harness.clock.advance(60)
    [empty] = await receive(stub, "DlqT", "DG")
    assert empty.status.code == d.MESSAGE_NOT_FOUND


async def test_telemetry_answers_settings_with_the_brokers_limits(door: Any) -> None:
    _, stub, _ = door
    call = stub.Telemetry(timeout=5)
    await call.write(
        s.TelemetryCommand(
            settings=d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(topics=[d.Resource(name="T")]))
        )
    )
    reply = await call.read()
    assert reply.status.code == d.OK
    assert reply.settings.publishing.max_body_size == MAX_BODY
    await call.write(
        s.TelemetryCommand(
            settings=d.Settings(
                client_type=d.PUSH_CONSUMER, subscription=d.Subscription(group=d.Resource(name="SomeGroup"))
            )
        )
    )
    reply = await call.read()
    assert reply.settings.backoff_policy.max_attempts == 17  # retryMaxTimes 16 + the first delivery
    assert reply.settings.subscription.long_polling_timeout.seconds > 0
    await call.done_writing()
    call.cancel()


def tx_message(topic: str, body: bytes, message_id: str) -> d.Message:
    return message(topic, body, message_id, message_type=d.TRANSACTION)


async def end(stub: Any, topic: str, entry: s.SendResultEntry, resolution: int, source: int = d.SOURCE_CLIENT) -> Any:
    request = s.EndTransactionRequest(
        topic=d.Resource(name=topic),
        message_id=entry.message_id,
        transaction_id=entry.transaction_id,
        resolution=resolution,  # type: ignore[arg-type]
        source=source,  # type: ignore[arg-type]
    )
    return await stub.EndTransaction(request, timeout=5)


async def test_first_decision_wins_and_a_conflicting_one_is_refused(door: Any) -> None:
    harness, stub, _ = door
    await create_group(harness, "TxG")
    [entry] = (await send(stub, tx_message("TxT", b"tx", "01D1"))).entries
    assert entry.status.code == d.OK and entry.transaction_id
    [nothing] = await receive(stub, "TxT", "TxG")
    assert nothing.status.code == d.MESSAGE_NOT_FOUND  # a half message is not delivered
    assert (await end(stub, "TxT", entry, d.COMMIT)).status.code == d.OK
    conflict = await end(stub, "TxT", entry, d.ROLLBACK)
    assert conflict.status.code == d.BAD_REQUEST and "commit" in conflict.status.message.lower()
    assert (await end(stub, "TxT", entry, d.COMMIT)).status.code == d.OK  # the same decision again: nothing done
    delivered = [r.message for r in await receive(stub, "TxT", "TxG") if r.HasField("message")]
    assert [(m.system_properties.message_id, m.body) for m in delivered] == [("01D1", b"tx")]
    bad = await end(stub, "TxT", s.SendResultEntry(message_id="01D1", transaction_id="nonsense"), d.COMMIT)
    assert bad.status.code == d.INVALID_TRANSACTION_ID


async def test_orphan_check_goes_to_a_producers_telemetry_stream(door: Any) -> None:
    harness, stub, _ = door
    await harness.stop()
    await harness.start(transaction_time_out=1000, transaction_check_interval=1000)  # checks every second
    call = stub.Telemetry(timeout=30)
    await call.write(
        s.TelemetryCommand(
            settings=d.Settings(client_type=d.PRODUCER, publishing=d.Publishing(topics=[d.Resource(name="OrphanT")]))
        )
    )
    assert (await call.read()).status.code == d.OK
    [entry] = (await send(stub, tx_message("OrphanT", b"orphan", "01E1"))).entries
    await harness.advance(3, step=1)
    check = await asyncio.wait_for(call.read(), 10)
    command = check.recover_orphaned_transaction_command
    assert command.transaction_id == entry.transaction_id
    assert (command.message.topic.name, command.message.body) == ("OrphanT", b"orphan")
    answer = await end(stub, "OrphanT", entry, d.COMMIT, d.SOURCE_SERVER_CHECK)
    assert answer.status.code == d.OK
    call.cancel()
    await create_group(harness, "OrphanG")
    delivered = [r.message for r in await receive(stub, "OrphanT", "OrphanG") if r.HasField("message")]
    assert [m.system_properties.message_id for m in delivered] == ["01E1"]


async def ack_all(stub: Any, topic: str, group: str, messages: list[d.Message]) -> None:
    entries = [
        s.AckMessageEntry(message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle)
        for m in messages
    ]
    request = s.AckMessageRequest(group=d.Resource(name=group), topic=d.Resource(name=topic), entries=entries)
    assert (await stub.AckMessage(request, timeout=5)).status.code == d.OK


async def test_a_fifo_group_gets_a_queue_in_order_and_an_expired_message_back_in_place(door: Any) -> None:
    harness, stub, _ = door
    await create_group(harness, "FifoG", retry_max_times=2, orderly=True)
    group_msg = {"message_group": "order-1"}
    await send(stub, message("FifoT", b"m0", "01F0", **group_msg), message("FifoT", b"m1", "01F1", **group_msg))

    async def got() -> list[d.Message]:
        return [r.message for r in await receive(stub, "FifoT", "FifoG") if r.HasField("message")]

    first = await got()
    assert [(m.body, m.system_properties.delivery_attempt) for m in first] == [(b"m0", 1), (b"m1", 1)]
    await send(stub, message("FifoT", b"m2", "01F2", **group_msg))
    assert await got() == []  # the queue is held: m2 waits behind m0 and m1
    await harness.clock.advance(6)
    again = await aeventually(got, "the held messages come back in place")
    assert [(m.body, m.system_properties.delivery_attempt, m.topic.name) for m in again] == [
        (b"m0", 2, "FifoT"),
        (b"m1", 2, "FifoT"),
    ]
    await ack_all(stub, "FifoT", "FifoG", again)
    assert [m.body for m in await got()] == [b"m2"]
    call = stub.Telemetry(timeout=5)
    settings = d.Settings(client_type=d.PUSH_CONSUMER, subscription=d.Subscription(group=d.Resource(name="FifoG")))
    await call.write(s.TelemetryCommand(settings=settings))
    assert (await call.read()).settings.subscription.fifo is True
    call.cancel()


async def test_calls_pipelined_on_one_connection_are_taken_in_bunches(door: Any) -> None:
    """The extra acceptors (server.py) are in use with this grpcio, and calls they take are served as grpc.aio's own
    loop serves them: 300 sends at once on one channel each get their own entry, with distinct offsets, and an
    unknown method is still UNIMPLEMENTED."""
    harness, stub, port = door
    assert harness.broker.app.grpc_door.accepting_in_bunches
    responses = await asyncio.gather(
        *(send(stub, message("BunchT", b"b", f"01B{i:04d}", queue_id=0)) for i in range(300))
    )
    assert all(r.status.code == d.OK for r in responses)
    assert sorted(r.entries[0].offset for r in responses) == list(range(300))
    assert sorted(r.entries[0].message_id for r in responses) == [f"01B{i:04d}" for i in range(300)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        unknown = channel.unary_unary("/apache.rocketmq.v2.MessagingService/NoSuchMethod")
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await unknown(b"", timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
