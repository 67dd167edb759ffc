"""The gRPC fuzzer's mutator (``txmq.chaos.fuzz_grpc``): the protobuf wire format it parses and writes back is the
one protobuf itself reads, and the same seed draws the same requests."""

from __future__ import annotations

import random

from google.protobuf.duration_pb2 import Duration

from txmq.chaos.fuzz_grpc import _message, mutate, parse_wire, write_wire
from txmq.door_grpc.pb import definition_pb2 as d
from txmq.door_grpc.pb import service_pb2 as s


def real_requests() -> list[bytes]:
    return [
        s.SendMessageRequest(
            messages=[_message("T", b"body", 7, tag="a", keys=["k"], user_properties={"p": "1"}, queue_id=3)]
        ).SerializeToString(),
        s.ReceiveMessageRequest(
            group=d.Resource(name="G"),
            message_queue=d.MessageQueue(topic=d.Resource(name="T"), id=-1),
            batch_size=16,
            invisible_duration=Duration(seconds=-5, nanos=3),
        ).SerializeToString(),
        s.TelemetryCommand(settings=d.Settings(client_type=d.PRODUCER)).SerializeToString(),
    ]


def test_the_wire_parser_round_trips_real_requests() -> None:
    for data in real_requests():
        fields = parse_wire(data)
        assert fields is not None and fields
        assert write_wire(fields) == data
    assert parse_wire(b"\x0a\xff") is None  # a length beyond the end
    assert parse_wire(b"\x07") is None  # wire type 7 does not exist


def test_mutations_are_replayable_and_mostly_still_parse() -> None:
    seeds = real_requests()
    a = [mutate(random.Random(11), seed) for seed in seeds for _ in range(50)]
    b = [mutate(random.Random(11), seed) for seed in seeds for _ in range(50)]
    assert a == b
    rng = random.Random(3)
    out = [mutate(rng, seeds[0]) for _ in range(2000)]
    assert sum(o != seeds[0] for o in out) > 1900
    # Most mutations keep a message protobuf can read (so the door's handlers, not only its parser, see them).
    parsed = 0
    for o in out:
        try:
            s.SendMessageRequest.FromString(o)
            parsed += 1
        except Exception:
            pass
    assert 0.3 * len(out) < parsed < len(out)
