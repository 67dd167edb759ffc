"""Fuzzing the 5.x gRPC door: protobuf requests mutated from real ones go to a live ``txmq dev``'s gRPC door over
several channels while a well-behaved gRPC client on its own channel keeps sending, receiving and acknowledging.

The seeds are real requests: a session with grpc's generated stubs runs every RPC the door serves against the fuzz
broker (routes, heartbeats, sends of every message type, a transaction ended both ways, receive, ack, a changed
invisible time, a forward to the dead-letter queue, Telemetry settings of a producer and of a consumer, the client's
termination), the receipt handles and transaction ids in them being the ones the broker gave, and every request it
serialized is kept with the status the door answered. The RPCs txmq does not serve (offsets, pull, recall, lite
subscriptions) get a seed built from their request type. Each fuzzed request applies one to three mutations to the
serialized bytes, drawn from a seeded generator (the same seed, the same requests):

* wire level, field by field (the protobuf wire format parsed, mutated, written back, nested messages included): a
  field dropped, repeated, moved to another field number, given another wire type, a varint set to an extreme
  (0, -1 as ten bytes, 2^31, 2^63 - 1, 2^64 - 1), a length-delimited field replaced by odd text (separators, control
  characters, invalid UTF-8, 70 000 characters), an unknown field added;
* byte level: truncated, bits flipped, random bytes inserted, or replaced by random bytes;
* on the call: odd ``x-mq-client-id`` / ``x-mq-language`` metadata.

Telemetry streams get a run of mutated commands each. A share of connections goes around grpc's client altogether:
the HTTP/2 preface then garbage, or a gRPC message whose length prefix lies or claims an unknown compression.

Counted: broker crashes, unhandled exceptions in the broker log, calls the door failed with a gRPC status instead of
an answer (UNKNOWN, INTERNAL, DATA_LOSS: an exception escaped the handler, or the answer did not serialize), and the
good client's errors (a refused send, a message it sent not received within its deadline, a body that differs, a
failed ack). No seed names the good client's topic or group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message_factory import GetMessageClass
from google.protobuf.timestamp_pb2 import Timestamp

from txmq.chaos.common import check_broker, flip_bits
from txmq.chaos.fuzz import unhandled_lines
from txmq.chaos.report import PartResult
from txmq.client import Admin
from txmq.door_grpc.pb import definition_pb2 as d
from txmq.door_grpc.pb import service_pb2 as s
from txmq.door_grpc.pb import service_pb2_grpc
from txmq.net.connection import connect
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.testing import DevCluster

log = logging.getLogger("txmq.chaos")

SERVICE = "apache.rocketmq.v2.MessagingService"
FUZZ_TOPIC, FUZZ_FIFO_TOPIC, FUZZ_TX_TOPIC = "GrpcFuzzTopic", "GrpcFuzzFifo", "GrpcFuzzTx"
FUZZ_GROUP = "GrpcFuzzGroup"
GOOD_TOPIC, GOOD_GROUP = "GrpcGoodTopic", "GrpcGoodGroup"
# A fuzzed call failing with one of these statuses means the door did not answer it: an exception escaped the
# handler (UNKNOWN), or its answer could not be sent (INTERNAL). The door answers every problem in the response.
DOOR_FAILURES = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS}
CALL_TIMEOUT = 4.0


@dataclass
class GrpcFuzzSettings:
    requests: int = 2_000
    seed: int = 20261125
    channels: int = 4
    in_flight: int = 8  # concurrent calls per channel
    raw_share: float = 0.01  # of the requests: raw connections that break HTTP/2 or gRPC's framing
    telemetry_per_stream: int = 4


@dataclass
class Seed:
    method: str
    data: bytes
    captured: bool  # from the real session (False: built for an RPC the session cannot use)


def _methods() -> dict[str, Any]:
    return {m.name: m for m in s.DESCRIPTOR.services_by_name["MessagingService"].methods}


def _kind(method: Any) -> str:
    if method.client_streaming and method.server_streaming:
        return "stream_stream"
    if method.server_streaming:
        return "unary_stream"
    return "unary_unary"


def _message_id(n: int) -> str:
    return f"01{n:030X}"


def _message(topic: str, body: bytes, n: int, **system: Any) -> d.Message:
    return d.Message(
        topic=d.Resource(name=topic),
        body=body,
        user_properties=system.pop("user_properties", {}),
        system_properties=d.SystemProperties(
            message_id=_message_id(n),
            body_encoding=system.pop("body_encoding", d.IDENTITY),
            born_host="127.0.0.1",
            born_timestamp=Timestamp(seconds=int(time.time()), nanos=1000),
            body_digest=d.Digest(type=d.CRC32, checksum=f"{zlib.crc32(body) & 0xFFFFFFFF:08X}"),
            **system,
        ),
    )


# -- capture ------------------------------------------------------------------------------------------------------


async def create_groups(broker_addr: str, groups: list[str]) -> None:
    """Subscription groups for the 5.x consumers (over the 4.x door, as ``mqadmin updateSubGroup`` does)."""
    host, _, port = broker_addr.rpartition(":")
    conn = await connect(host, int(port))
    try:
        for group in groups:
            body = orjson.dumps({"groupName": group, "retryMaxTimes": 3, "consumeEnable": True})
            resp = await conn.request(
                RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body), timeout=10
            )
            if resp.code != 0:
                raise RuntimeError(f"creating group {group} failed: {resp.remark}")
    finally:
        conn.close()


class Recorder:
    """Calls the door with grpc's stubs and keeps every request's serialized bytes, by method."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stub = service_pb2_grpc.MessagingServiceStub(channel)
        self.seeds: list[Seed] = []
        self.answers: Counter[str] = Counter()

    async def call(self, method: str, request: Any, metadata: Any = None) -> Any:
        self.seeds.append(Seed(method, request.SerializeToString(), True))
        answer = await getattr(self.stub, method)(request, timeout=10, metadata=metadata)
        self.answers[f"{method} {d.Code.Name(answer.status.code)}"] += 1
        return answer

    async def stream(self, method: str, request: Any) -> list[Any]:
        self.seeds.append(Seed(method, request.SerializeToString(), True))
        answers = [a async for a in getattr(self.stub, method)(request, timeout=10)]
        for a in answers:
            if a.HasField("status"):
                self.answers[f"{method} {d.Code.Name(a.status.code)}"] += 1
        return answers


async def capture_session(endpoint: str) -> tuple[list[Seed], Counter[str]]:
    """A session using every RPC the door serves; returns the requests it sent (and the door's answers)."""
    meta = (("x-mq-client-id", "grpc-fuzz-seeder@1"), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "v2"))
    async with grpc.aio.insecure_channel(endpoint) as channel:
        rec = Recorder(channel)
        endpoints = d.Endpoints(scheme=d.IPv4, addresses=[d.Address(host="127.0.0.1", port=8081)])
        for topic in (FUZZ_TOPIC, FUZZ_FIFO_TOPIC, FUZZ_TX_TOPIC):
            await rec.call("QueryRoute", s.QueryRouteRequest(topic=d.Resource(name=topic), endpoints=endpoints))
        await rec.call("Heartbeat", s.HeartbeatRequest(client_type=d.PRODUCER), meta)
        await rec.call(
            "Heartbeat", s.HeartbeatRequest(group=d.Resource(name=FUZZ_GROUP), client_type=d.PUSH_CONSUMER), meta
        )
        await rec.call(
            "QueryAssignment",
            s.QueryAssignmentRequest(
                topic=d.Resource(name=FUZZ_TOPIC), group=d.Resource(name=FUZZ_GROUP), endpoints=endpoints
            ),
        )
        # Telemetry: a producer's settings and a consumer's, one stream each.
        publishing = d.Settings(
            client_type=d.PRODUCER,
            access_point=endpoints,
            request_timeout=Duration(seconds=3),
            publishing=d.Publishing(topics=[d.Resource(name=FUZZ_TX_TOPIC)], validate_message_type=True),
            user_agent=d.UA(language=d.PYTHON, version="5.0.0", platform="linux", hostname="fuzz"),
        )
        subscription = d.Settings(
            client_type=d.SIMPLE_CONSUMER,
            access_point=endpoints,
            subscription=d.Subscription(
                group=d.Resource(name=FUZZ_GROUP),
                subscriptions=[
                    d.SubscriptionEntry(
                        topic=d.Resource(name=FUZZ_TOPIC), expression=d.FilterExpression(type=d.TAG, expression="*")
                    )
                ],
                long_polling_timeout=Duration(seconds=1),
            ),
        )
        for settings in (publishing, subscription):
            command = s.TelemetryCommand(settings=settings)
            rec.seeds.append(Seed("Telemetry", command.SerializeToString(), True))
            call = rec.stub.Telemetry(metadata=meta, timeout=10)
            await call.write(command)
            answer = await call.read()
            rec.answers[f"Telemetry {d.Code.Name(answer.status.code)}"] += 1
            stack = s.TelemetryCommand(thread_stack_trace=s.ThreadStackTrace(nonce="n1", thread_stack_trace="t"))
            rec.seeds.append(Seed("Telemetry", stack.SerializeToString(), True))
            await call.write(stack)
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass
        # Sends: plain with tag, keys and properties; gzip; FIFO; delayed; a batch; transactional.
        n = 0

        def nxt() -> int:
            nonlocal n
            n += 1
            return n

        await rec.call(
            "SendMessage",
            s.SendMessageRequest(
                messages=[
                    _message(
                        FUZZ_TOPIC,
                        b"hello",
                        nxt(),
                        tag="TagA",
                        keys=["k1", "k2"],
                        user_properties={"a": "1"},
                        message_type=d.NORMAL,
                    )
                ]
            ),
            meta,
        )
        await rec.call(
            "SendMessage",
            s.SendMessageRequest(
                messages=[_message(FUZZ_TOPIC, zlib.compress(b"z" * 6000, wbits=31), nxt(), body_encoding=d.GZIP)]
            ),
        )
        await rec.call(
            "SendMessage",
            s.SendMessageRequest(
                messages=[_message(FUZZ_FIFO_TOPIC, b"fifo", nxt(), message_group="g1", message_type=d.FIFO)]
            ),
        )
        await rec.call(
            "SendMessage",
            s.SendMessageRequest(
                messages=[
                    _message(
                        FUZZ_TOPIC,
                        b"later",
                        nxt(),
                        message_type=d.DELAY,
                        delivery_timestamp=Timestamp(seconds=int(time.time()) + 1),
                    )
                ]
            ),
        )
        await rec.call(
            "SendMessage",
            s.SendMessageRequest(
                messages=[_message(FUZZ_TOPIC, f"b{i}".encode(), nxt(), queue_id=i) for i in range(3)]
            ),
        )
        tx_ids = []
        for _ in range(2):
            sent = await rec.call(
                "SendMessage",
                s.SendMessageRequest(
                    messages=[
                        _message(
                            FUZZ_TX_TOPIC,
                            b"tx",
                            nxt(),
                            message_type=d.TRANSACTION,
                            orphaned_transaction_recovery_duration=Duration(seconds=30),
                        )
                    ]
                ),
                meta,
            )
            entry = sent.entries[0]
            tx_ids.append((entry.message_id, entry.transaction_id))
        for (message_id, tx_id), resolution in zip(tx_ids, (d.COMMIT, d.ROLLBACK), strict=True):
            await rec.call(
                "EndTransaction",
                s.EndTransactionRequest(
                    topic=d.Resource(name=FUZZ_TX_TOPIC),
                    message_id=message_id,
                    transaction_id=tx_id,
                    resolution=resolution,
                    source=d.SOURCE_CLIENT,
                ),
            )

        # Receive (the door's pop), then ack one, change another's invisible time, forward a third to the DLQ.
        def receive(expression: str) -> s.ReceiveMessageRequest:
            return s.ReceiveMessageRequest(
                group=d.Resource(name=FUZZ_GROUP),
                message_queue=d.MessageQueue(topic=d.Resource(name=FUZZ_TOPIC), id=-1, broker=d.Broker(name="b")),
                filter_expression=d.FilterExpression(type=d.TAG, expression=expression),
                batch_size=4,
                invisible_duration=Duration(seconds=20),
                long_polling_timeout=Duration(seconds=1),
            )

        # A tag filter first (it passes over the untagged messages of the queues it reads), then more to take.
        await rec.stream("ReceiveMessage", receive("TagA || TagB"))
        await rec.call(
            "SendMessage",
            s.SendMessageRequest(
                messages=[_message(FUZZ_TOPIC, f"c{i}".encode(), nxt(), queue_id=i) for i in range(4)]
            ),
        )
        handles: list[tuple[str, str]] = []
        deadline = time.monotonic() + 15
        while len(handles) < 3 and time.monotonic() < deadline:
            for answer in await rec.stream("ReceiveMessage", receive("*")):
                if answer.HasField("message"):
                    handles.append(
                        (answer.message.system_properties.message_id, answer.message.system_properties.receipt_handle)
                    )
        if len(handles) < 3:
            raise RuntimeError(f"the seeding session received {len(handles)} messages, not 3")
        (m1, h1), (m2, h2), (m3, h3) = handles[:3]
        await rec.call(
            "AckMessage",
            s.AckMessageRequest(
                group=d.Resource(name=FUZZ_GROUP),
                topic=d.Resource(name=FUZZ_TOPIC),
                entries=[s.AckMessageEntry(message_id=m1, receipt_handle=h1)],
            ),
        )
        await rec.call(
            "ChangeInvisibleDuration",
            s.ChangeInvisibleDurationRequest(
                group=d.Resource(name=FUZZ_GROUP),
                topic=d.Resource(name=FUZZ_TOPIC),
                receipt_handle=h2,
                invisible_duration=Duration(seconds=5),
                message_id=m2,
            ),
        )
        await rec.call(
            "ForwardMessageToDeadLetterQueue",
            s.ForwardMessageToDeadLetterQueueRequest(
                group=d.Resource(name=FUZZ_GROUP),
                topic=d.Resource(name=FUZZ_TOPIC),
                receipt_handle=h3,
                message_id=m3,
                delivery_attempt=1,
                max_delivery_attempts=3,
            ),
        )
        await rec.call(
            "NotifyClientTermination", s.NotifyClientTerminationRequest(group=d.Resource(name=FUZZ_GROUP)), meta
        )
    seeds = list(rec.seeds)
    # The RPCs txmq does not serve: a seed built from the request type, naming the fuzz topic and group.
    mq = d.MessageQueue(topic=d.Resource(name=FUZZ_TOPIC), id=0, permission=d.READ_WRITE, broker=d.Broker(name="b"))
    built = {
        "PullMessage": s.PullMessageRequest(
            group=d.Resource(name=FUZZ_GROUP),
            message_queue=mq,
            offset=0,
            batch_size=8,
            filter_expression=d.FilterExpression(type=d.TAG, expression="*"),
            long_polling_timeout=Duration(seconds=1),
        ),
        "UpdateOffset": s.UpdateOffsetRequest(group=d.Resource(name=FUZZ_GROUP), message_queue=mq, offset=1),
        "GetOffset": s.GetOffsetRequest(group=d.Resource(name=FUZZ_GROUP), message_queue=mq),
        "QueryOffset": s.QueryOffsetRequest(message_queue=mq, query_offset_policy=d.END),
        "RecallMessage": s.RecallMessageRequest(topic=d.Resource(name=FUZZ_TOPIC), recall_handle="h"),
        "SyncLiteSubscription": s.SyncLiteSubscriptionRequest(
            topic=d.Resource(name=FUZZ_TOPIC), group=d.Resource(name=FUZZ_GROUP)
        ),
    }
    for method, request in built.items():
        seeds.append(Seed(method, request.SerializeToString(), False))
    named = [x.method for x in seeds if GOOD_TOPIC.encode() in x.data or GOOD_GROUP.encode() in x.data]
    assert not named, f"seeds name the good client's topic or group: {named}"
    return seeds, rec.answers


# -- mutation -----------------------------------------------------------------------------------------------------

_VARINTS = [0, 1, 2, 3, 99, 127, 128, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**64 - 1, 2**64 - 2]
_TEXTS: list[bytes] = [
    b"",
    b" ",
    b"\x00",
    b"a\x01b\x02c",
    b"\x01\x02\x01\x02",
    b"k=v\x01",
    b"%RETRY%",
    b"%DLQ%",
    b"TBW102",
    b"RMQ_SYS_TRANS_HALF_TOPIC",
    b"SCHEDULE_TOPIC_XXXX",
    b"||",
    b"a||b",
    b"*",
    b"-1",
    b"99999999999999999999999",
    b"\xff\xfe\xfd",  # not UTF-8
    b"\xc3\x28",
    "\u00e9\u4e2d\U0001f600".encode(),
    b"a" * 300,
    b"x" * 70_000,
    b"[::1]:99999",
    b"300.1.2.3:1",
    b"UNIQ_KEY",
    b"TAGS",
    b"__CHECK_IMMUNITY_TIME",
]


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("bad varint")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


Field = tuple[int, int, Any]  # (field number, wire type, value: int or bytes)


def parse_wire(data: bytes) -> list[Field] | None:
    """The fields of a serialized protobuf message, or None when the bytes are not one."""
    fields: list[Field] = []
    i = 0
    try:
        while i < len(data):
            key, i = _read_varint(data, i)
            number, wire = key >> 3, key & 7
            if number == 0:
                return None
            if wire == 0:
                value, i = _read_varint(data, i)
            elif wire == 1:
                if i + 8 > len(data):
                    return None
                value, i = data[i : i + 8], i + 8
            elif wire == 2:
                length, i = _read_varint(data, i)
                if i + length > len(data):
                    return None
                value, i = data[i : i + length], i + length
            elif wire == 5:
                if i + 4 > len(data):
                    return None
                value, i = data[i : i + 4], i + 4
            else:
                return None
            fields.append((number, wire, value))
    except ValueError:
        return None
    return fields


def write_wire(fields: list[Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        if wire == 0:
            out += _varint(value)
        elif wire == 2:
            out += _varint(len(value)) + value
        else:
            out += value
    return bytes(out)


def _mutate_fields(rng: random.Random, fields: list[Field], depth: int = 0) -> list[Field]:
    fields = list(fields)
    choice = rng.random()
    if not fields or choice < 0.08:  # an unknown (or any) field added
        wire = rng.choice([0, 1, 2, 5])
        value: Any = {0: rng.choice(_VARINTS), 1: rng.randbytes(8), 2: rng.choice(_TEXTS), 5: rng.randbytes(4)}[wire]
        fields.insert(
            rng.randint(0, len(fields)), (rng.choice([1, 2, 3, 4, 5, 6, 7, 15, 16, 99, 536870911]), wire, value)
        )
        return fields
    i = rng.randrange(len(fields))
    number, wire, value = fields[i]
    if choice < 0.18:
        del fields[i]
    elif choice < 0.26:
        fields.insert(i, fields[i])  # repeated (a non-repeated field: the last one wins)
    elif choice < 0.32:
        fields[i] = (rng.choice([n for n, _, _ in fields] + [number + 1, max(1, number - 1)]), wire, value)
    elif choice < 0.38:  # another wire type for the same field
        other = rng.choice([w for w in (0, 1, 2, 5) if w != wire])
        fields[i] = (
            number,
            other,
            {0: rng.choice(_VARINTS), 1: rng.randbytes(8), 2: rng.choice(_TEXTS), 5: rng.randbytes(4)}[other],
        )
    elif wire == 0:
        fields[i] = (number, 0, rng.choice([*_VARINTS, rng.getrandbits(64), value ^ (1 << rng.randrange(64))]))
    elif wire == 2:
        inner = parse_wire(value) if value else None
        if inner is not None and depth < 4 and rng.random() < 0.6:
            fields[i] = (number, 2, write_wire(_mutate_fields(rng, inner, depth + 1)))
        elif rng.random() < 0.7:
            fields[i] = (number, 2, rng.choice(_TEXTS))
        else:
            fields[i] = (number, 2, _mutate_bytes(rng, value))
    else:
        fields[i] = (number, wire, rng.randbytes(len(value)))
    return fields


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    choice = rng.randrange(4)
    if choice == 0 and data:
        return data[: rng.randrange(len(data))]
    if choice == 1 and data:
        return flip_bits(rng, data, 6)
    if choice == 2:
        j = rng.randint(0, len(data))
        return data[:j] + rng.randbytes(rng.randint(1, 16)) + data[j:]
    return rng.randbytes(rng.choice([0, 1, 5, 40, 300]))


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to three mutations of a serialized request (mostly field-aware, sometimes blind bytes)."""
    for _ in range(rng.randint(1, 3)):
        fields = parse_wire(data)
        if fields is not None and rng.random() < 0.85:
            data = write_wire(_mutate_fields(rng, fields))
        else:
            data = _mutate_bytes(rng, data)
    return data


_ODD_META = ["", " ", "x" * 2000, "a@b@c", "PYTHON", "JAVA", "UNKNOWN-LANGUAGE", "v2", "0", "-1", "%", "a b"]


def fuzz_metadata(rng: random.Random) -> list[tuple[str, str]] | None:
    if rng.random() > 0.2:
        return None
    return [
        ("x-mq-client-id", rng.choice([*_ODD_META, f"fuzz@{rng.randrange(50)}"])),
        ("x-mq-language", rng.choice(_ODD_META)),
    ]


# -- the run ------------------------------------------------------------------------------------------------------


class GoodClient:
    """A well-behaved 5.x client on its own channel: send a message, receive it, ack it; every failure counted."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.ok = 0
        self.errors: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        async with grpc.aio.insecure_channel(self.endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    await self._round(stub, n)
                except Exception as exc:
                    self.errors.append(f"round {n}: {type(exc).__name__}: {exc}"[:300])
                await asyncio.sleep(0.02)

    async def _round(self, stub: Any, n: int) -> None:
        route = await stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name=GOOD_TOPIC)), timeout=10)
        if route.status.code != d.OK or not route.message_queues:
            self.errors.append(f"round {n}: route {d.Code.Name(route.status.code)} {route.status.message}")
            return
        body = f"good-{n}".encode()
        sent = await stub.SendMessage(s.SendMessageRequest(messages=[_message(GOOD_TOPIC, body, n)]), timeout=10)
        if sent.status.code != d.OK:
            self.errors.append(f"round {n}: send {d.Code.Name(sent.status.code)} {sent.status.message}")
            return
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            got: list[d.Message] = []
            async for answer in stub.ReceiveMessage(
                s.ReceiveMessageRequest(
                    group=d.Resource(name=GOOD_GROUP),
                    message_queue=d.MessageQueue(topic=d.Resource(name=GOOD_TOPIC), id=-1),
                    filter_expression=d.FilterExpression(type=d.TAG, expression="*"),
                    batch_size=16,
                    invisible_duration=Duration(seconds=60),
                    long_polling_timeout=Duration(seconds=2),
                ),
                timeout=10,
            ):
                if answer.HasField("status") and answer.status.code not in (d.OK, d.MESSAGE_NOT_FOUND):
                    self.errors.append(f"round {n}: receive {d.Code.Name(answer.status.code)} {answer.status.message}")
                    return
                if answer.HasField("message"):
                    got.append(answer.message)
            mine = False
            for message in got:
                if message.topic.name != GOOD_TOPIC or not message.body.startswith(b"good-"):
                    self.errors.append(f"round {n}: received {message.topic.name} {message.body[:40]!r}")
                elif message.body == body:
                    if message.system_properties.message_id != _message_id(n):
                        self.errors.append(f"round {n}: message id {message.system_properties.message_id}")
                    mine = True
                ack = await stub.AckMessage(
                    s.AckMessageRequest(
                        group=d.Resource(name=GOOD_GROUP),
                        topic=d.Resource(name=GOOD_TOPIC),
                        entries=[
                            s.AckMessageEntry(
                                message_id=message.system_properties.message_id,
                                receipt_handle=message.system_properties.receipt_handle,
                            )
                        ],
                    ),
                    timeout=10,
                )
                if ack.status.code != d.OK:
                    self.errors.append(f"round {n}: ack {d.Code.Name(ack.status.code)} {ack.status.message}")
            if mine:
                self.ok += 1
                return
        self.errors.append(f"round {n}: {body!r} was not received within 15 s")


class Blaster:
    """Sends fuzzed requests over one channel, ``in_flight`` at a time, counting how each call ended."""

    def __init__(
        self, endpoint: str, seeds: list[Seed], rng: random.Random, stats: Counter[str], settings: GrpcFuzzSettings
    ) -> None:
        self.endpoint = endpoint
        self.seeds = seeds
        self.rng = rng
        self.stats = stats
        self.settings = settings
        self.failures: list[str] = []
        self.methods = _methods()
        self.by_method: dict[str, list[Seed]] = {}
        for seed in seeds:
            self.by_method.setdefault(seed.method, []).append(seed)
        self.method_names = sorted(self.by_method)

    async def run(self, count: int) -> None:
        remaining = count
        async with grpc.aio.insecure_channel(
            self.endpoint, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        ) as channel:
            calls = {
                name: getattr(channel, _kind(m))(
                    f"/{SERVICE}/{name}", request_serializer=None, response_deserializer=None
                )
                for name, m in self.methods.items()
            }

            async def worker() -> None:
                nonlocal remaining
                while remaining > 0:
                    # Every RPC as often as another, whatever its number of seeds.
                    seed = self.rng.choice(self.by_method[self.rng.choice(self.method_names)])
                    if seed.method == "Telemetry":
                        batch = min(remaining, self.settings.telemetry_per_stream)
                        remaining -= batch
                        await self._telemetry(calls["Telemetry"], seed, batch)
                    else:
                        remaining -= 1
                        await self._unary(calls[seed.method], seed)

            await asyncio.gather(*(worker() for _ in range(self.settings.in_flight)))

    def _ended(self, method: str, exc: grpc.aio.AioRpcError | None, data: bytes) -> None:
        if exc is None:
            self.stats["answered"] += 1  # unary calls (and ReceiveMessage streams) the door answered
            return
        code = exc.code()
        self.stats[f"grpc {code.name}"] += 1
        if code in DOOR_FAILURES:
            self.failures.append(f"{method} {code.name} {exc.details()!r} on request {data[:200].hex()}")

    async def _unary(self, call: Any, seed: Seed) -> None:
        data = mutate(self.rng, seed.data)
        metadata = fuzz_metadata(self.rng)
        self.stats["requests"] += 1
        self.stats[f"requests {seed.method}"] += 1
        try:
            answer = call(data, timeout=CALL_TIMEOUT, metadata=metadata)
            if self.methods[seed.method].server_streaming:
                async for reply in answer:
                    self._count_reply(seed.method, reply)
            else:
                self._count_reply(seed.method, await answer)
        except grpc.aio.AioRpcError as exc:
            self._ended(seed.method, exc, data)
        else:
            self._ended(seed.method, None, data)

    def _count_reply(self, method: str, reply: bytes) -> None:
        response_type = GetMessageClass(self.methods[method].output_type)
        try:
            parsed = response_type.FromString(reply)
        except Exception as exc:  # the door's answer is not its protobuf type
            self.failures.append(f"{method}: the answer does not parse: {exc}")
            return
        if parsed.HasField("status"):
            code = parsed.status.code
            self.stats[f"status {d.Code.Name(code) if code in d.Code.values() else code}"] += 1

    async def _telemetry(self, call: Any, seed: Seed, batch: int) -> None:
        metadata = fuzz_metadata(self.rng)
        datas = [mutate(self.rng, self.rng.choice(self.by_method["Telemetry"]).data) for _ in range(batch)]
        self.stats["requests"] += batch
        self.stats["requests Telemetry"] += batch
        self.stats["telemetry_streams"] += 1
        stream = call(timeout=CALL_TIMEOUT, metadata=metadata)

        async def write() -> None:
            for data in datas:
                await stream.write(data)
            await stream.done_writing()

        writer = asyncio.ensure_future(write())
        try:
            async for reply in stream:
                self._count_reply("Telemetry", reply)
            await writer
            self.stats["telemetry_streams_ended_by_the_door"] += 1
        except grpc.aio.AioRpcError as exc:
            # The door keeps a Telemetry stream open until the client goes: the deadline ends it.
            if exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
                self._ended("Telemetry", exc, b"".join(datas))
            else:
                self.stats["telemetry_ended_by_deadline"] += 1
        except Exception as exc:  # a write into a stream the door already closed
            self.stats[f"telemetry_write_ended {type(exc).__name__}"] += 1
        finally:
            if not writer.done():
                writer.cancel()
            with contextlib.suppress(BaseException):
                await writer


async def raw_connection(port: int, rng: random.Random, seeds: list[Seed], stats: Counter[str]) -> None:
    """One connection around grpc's client: HTTP/2 or gRPC framing broken on purpose."""
    seed = rng.choice([x for x in seeds if x.method != "Telemetry"])
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    kind = rng.randrange(4)
    if kind == 0:
        payload = rng.randbytes(rng.randint(1, 300))
    elif kind == 1:
        payload = preface + rng.randbytes(rng.randint(1, 300))
    else:
        # A valid HTTP/2 request whose gRPC message lies: its length prefix (kind 2) or an unknown compression (3).
        message = seed.data
        if kind == 2:
            prefix = b"\x00" + struct.pack(">I", rng.choice([len(message) + 1, 2**31 - 1, 2**32 - 1]))
        else:
            prefix = b"\x01" + struct.pack(">I", len(message))
        payload = preface + _h2_settings() + _h2_headers(seed.method) + _h2_data(prefix + message)
    stats["raw_connections"] += 1
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    except (OSError, TimeoutError):
        stats["raw_connect_failures"] += 1
        return
    try:
        writer.write(payload)
        await asyncio.wait_for(writer.drain(), 5)
        with contextlib.suppress(TimeoutError):
            while await asyncio.wait_for(reader.read(65536), 1.0):
                pass
    except (OSError, TimeoutError, ConnectionError):
        stats["raw_write_failures"] += 1
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _h2_settings() -> bytes:
    return _h2_frame(4, 0, 0, b"")


def _h2_headers(method: str) -> bytes:
    def literal(name: bytes, value: bytes) -> bytes:
        return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value

    block = b"".join(
        literal(n, v)
        for n, v in [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", f"/{SERVICE}/{method}".encode()),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
    )
    return _h2_frame(1, 0x4, 1, block)  # END_HEADERS


def _h2_data(payload: bytes) -> bytes:
    return _h2_frame(0, 0x1, 1, payload)  # END_STREAM


async def run_grpc_fuzz_campaign(settings: GrpcFuzzSettings, work_dir: Path, progress: Any = None) -> PartResult:
    result = PartResult("grpc-fuzz")
    result.zero("broker_crashes", "broker_unhandled_exceptions", "door_failures", "good_client_errors")
    started = time.monotonic()
    rng = random.Random(settings.seed)
    cluster = DevCluster(work_dir / "grpc-fuzz-cluster", {"mappedFileSizeCommitLog": str(16 * 1024 * 1024)})
    stats: Counter[str] = Counter()
    good: GoodClient | None = None
    try:
        cluster.start(timeout=60)
        async with Admin(cluster.namesrv_addr, instance_name="grpc-fuzz-admin") as admin:
            (cluster_name,) = (await admin.cluster_info()).clusters
            for topic in (FUZZ_TOPIC, FUZZ_FIFO_TOPIC, FUZZ_TX_TOPIC, GOOD_TOPIC):
                await admin.create_topic(topic, cluster=cluster_name, read_queue_nums=4, write_queue_nums=4)
        await create_groups(cluster.broker_addr, [FUZZ_GROUP, GOOD_GROUP])
        endpoint = cluster.grpc_endpoint
        seeds, answers = await capture_session(endpoint)
        not_ok = {k: v for k, v in answers.items() if not k.endswith((" OK", "ReceiveMessage MESSAGE_NOT_FOUND"))}
        result.info["seeds"] = len(seeds)
        result.info["seed_methods"] = sorted({x.method for x in seeds})
        result.info["captured_methods"] = len({x.method for x in seeds if x.captured})
        result.info["built_methods"] = len({x.method for x in seeds if not x.captured})
        result.info["seed_session_answers"] = dict(answers)
        if not_ok:
            raise RuntimeError(f"the seeding session was refused: {not_ok}")
        good = GoodClient(endpoint)
        good_task = asyncio.ensure_future(good.run())
        raw = round(settings.requests * settings.raw_share)
        per = (settings.requests - raw) // settings.channels
        counts = [per] * settings.channels
        counts[0] += settings.requests - raw - per * settings.channels
        rngs = [random.Random(rng.getrandbits(64)) for _ in range(settings.channels + 1)]
        blasters = [Blaster(endpoint, seeds, r, stats, settings) for r in rngs[:-1]]
        chunk = 2_000
        done = [0] * settings.channels
        raw_done = 0
        while any(a < b for a, b in zip(done, counts, strict=True)) or raw_done < raw:
            steps = [min(chunk, c - a) for a, c in zip(done, counts, strict=True)]
            raw_step = min(raw - raw_done, max(1, chunk * settings.channels * raw // max(1, settings.requests)))

            async def raws(n: int) -> None:
                for _ in range(n):
                    await raw_connection(cluster.grpc_port, rngs[-1], seeds, stats)

            await asyncio.gather(*(b.run(n) for b, n in zip(blasters, steps, strict=True) if n), raws(raw_step))
            done = [a + n for a, n in zip(done, steps, strict=True)]
            raw_done += raw_step
            check_broker(cluster, result, f"after {stats['requests']} requests", restart=True)
            if progress:
                progress(
                    f"grpc-fuzz: {stats['requests']}/{settings.requests - raw} requests, {stats['raw_connections']} "
                    f"raw connections; good client {good.ok} ok, {len(good.errors)} errors"
                )
        await asyncio.sleep(1.0)
        good.stop.set()
        await asyncio.wait_for(good_task, 60)
        check_broker(cluster, result, "by the end", restart=False)
        for blaster in blasters:
            for failure in blaster.failures:
                result.fail("door_failures", failure)
        for error in good.errors:
            result.fail("good_client_errors", error)
        result.info["good_client_round_trips"] = good.ok
        for line in unhandled_lines(cluster.log_text()):
            result.fail("broker_unhandled_exceptions", line)
        result.info.update(sorted(stats.items()))
    except Exception as exc:
        log.exception("gRPC fuzz campaign stopped")
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        cluster.stop()
        result.seconds = time.monotonic() - started
    result.info["requests_per_second"] = round(stats["requests"] / max(result.seconds, 1e-9))
    return result
