"""A real broker process on loopback: send/pull/long polling, bad input, and kill -9 during sync sends."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
import time

import pytest

from txmq.net import Connection, connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from txmq.protocol.record import decode_records, encode_properties


def _addr(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def send_cmd(topic: str, body: bytes, queue_id: int = 0, props: dict[str, str] | None = None) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producerGroup="PG",
        topic=topic,
        queueId=queue_id,
        bornTimestamp=int(time.time() * 1000),
        properties=encode_properties(props or {}),
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext(), body)


def pull_cmd(topic: str, queue_id: int, offset: int, *, suspend_ms: int = 0, expression: str = "*") -> RemotingCommand:
    header = PullMessageRequestHeader(
        consumerGroup="CG",
        topic=topic,
        queueId=queue_id,
        queueOffset=offset,
        maxMsgNums=32,
        sysFlag=0x4 | (0x2 if suspend_ms else 0),
        commitOffset=0,
        suspendTimeoutMillis=suspend_ms,
        subscription=expression,
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext())


async def pull_all(conn: Connection, topic: str, queue_id: int) -> list:
    records, offset = [], 0
    while True:
        resp = await conn.request(pull_cmd(topic, queue_id, offset), timeout=10)
        if resp.code != ResponseCode.SUCCESS:
            return records
        records.extend(decode_records(resp.body))
        offset = int(resp.ext_fields["nextBeginOffset"])


async def test_send_then_pull_and_long_poll_wakes_on_new_message(txmq_cluster) -> None:
    conn = await connect(*_addr(txmq_cluster.broker_addr))
    topic = f"LongPoll{random.randrange(1 << 30)}"
    resp = await conn.request(send_cmd(topic, b"first", props={"TAGS": "A", "KEYS": "k1"}), timeout=5)
    assert resp.code == 0 and resp.ext_fields["queueOffset"] == "0" and len(resp.ext_fields["msgId"]) == 32
    # A pull at the end of the queue is held until the next message arrives, not answered at once.
    held = asyncio.ensure_future(conn.request(pull_cmd(topic, 0, 1, suspend_ms=20_000), timeout=30))
    await asyncio.sleep(0.3)
    assert not held.done()
    started = time.monotonic()
    assert (await conn.request(send_cmd(topic, b"second", props={"TAGS": "B"}), timeout=5)).code == 0
    woke = await held
    assert time.monotonic() - started < 10
    assert woke.code == 0 and [r.body for r in decode_records(woke.body)] == [b"second"]
    # Tag filtering: only B.
    resp = await conn.request(pull_cmd(topic, 0, 0, expression="B"), timeout=5)
    assert [r.body for r in decode_records(resp.body)] == [b"second"]
    assert resp.ext_fields["nextBeginOffset"] == "2"
    # A held pull with nothing arriving times out with PULL_NOT_FOUND.
    resp = await conn.request(pull_cmd(topic, 0, 2, suspend_ms=500), timeout=10)
    assert resp.code == ResponseCode.PULL_NOT_FOUND and resp.ext_fields["nextBeginOffset"] == "2"
    # Offsets and queries.
    q = await conn.request(RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": "0"}), 5)
    assert q.ext_fields["offset"] == "2"
    q = await conn.request(
        RemotingCommand.request(
            RequestCode.QUERY_MESSAGE,
            {"topic": topic, "key": "k1", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": str(2**62)},
        ),
        5,
    )
    assert q.code == 0 and [r.body for r in decode_records(q.body)] == [b"first"]
    conn.close()


async def test_lite_pull_message_is_a_pull_by_another_code(txmq_cluster) -> None:
    """RocketMQ 5 clients' DefaultLitePullConsumer pulls with LITE_PULL_MESSAGE (361), the same header and reply as
    PULL_MESSAGE; the Java broker serves both with one processor."""
    conn = await connect(*_addr(txmq_cluster.broker_addr))
    topic = f"LitePull{random.randrange(1 << 30)}"
    assert (await conn.request(send_cmd(topic, b"lite", props={"TAGS": "A"}), timeout=5)).code == 0
    lite = pull_cmd(topic, 0, 0)
    lite = RemotingCommand.request(RequestCode.LITE_PULL_MESSAGE, lite.ext_fields)
    resp = await conn.request(lite, timeout=5)
    assert resp.code == ResponseCode.SUCCESS and [r.body for r in decode_records(resp.body)] == [b"lite"]
    assert resp.ext_fields["nextBeginOffset"] == "1"
    conn.close()


async def test_send_errors_use_rocketmq_codes(txmq_cluster) -> None:
    conn = await connect(*_addr(txmq_cluster.broker_addr))
    bad = await conn.request(send_cmd("bad topic!", b"x"), timeout=5)
    assert bad.code == ResponseCode.SYSTEM_ERROR and "illegal" in bad.remark
    sys_topic = await conn.request(send_cmd("SCHEDULE_TOPIC_XXXX", b"x"), timeout=5)
    assert sys_topic.code == ResponseCode.NO_PERMISSION
    too_far = await conn.request(send_cmd("QueueRange", b"x", queue_id=999), timeout=5)
    assert too_far.code == ResponseCode.SYSTEM_ERROR and "queueId" in too_far.remark
    missing = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "PG"}, b"x")
    resp = await conn.request(missing, timeout=5)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "'topic' is missing" in resp.remark
    unknown = await conn.request(RemotingCommand.request(7777), timeout=5)
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    pull_unknown = await conn.request(pull_cmd("NoSuchTopicHere", 0, 0), timeout=5)
    assert pull_unknown.code == ResponseCode.TOPIC_NOT_EXIST
    conn.close()


def _raw(addr: str, payload: bytes, *, read: bool = True) -> bytes:
    """Send raw bytes; return what the server answers before it closes (b'' when it just closes)."""
    with socket.create_connection(_addr(addr), timeout=5) as s:
        s.sendall(payload)
        if not read:
            return b""
        s.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


async def test_bad_input_never_stops_the_broker_serving_others(txmq_cluster) -> None:
    addr = txmq_cluster.broker_addr
    good = await connect(*_addr(addr))
    stop = asyncio.Event()
    acked: list[int] = []

    async def well_behaved() -> None:
        i = 0
        while not stop.is_set():
            resp = await good.request(send_cmd("GoodClient", f"ok-{i}".encode()), timeout=5)
            assert resp.code == 0
            acked.append(i)
            i += 1

    worker = asyncio.create_task(well_behaved())
    rng = random.Random(1234)
    header_json = b'{"code": 310, "flag": 0, "opaque": 1, "extFields": {"b": "T"'  # cut short: invalid JSON
    attacks = [
        bytes(rng.getrandbits(8) for _ in range(4096)),
        struct.pack(">i", 2**31 - 1) + b"\x00" * 64,  # a 2 GiB length prefix
        struct.pack(">ii", 100, 50) + b"{}",  # truncated frame, then close
        struct.pack(">ii", 4 + len(header_json), len(header_json)) + header_json,
        struct.pack(">ii", 8, 0x05000000 | 4) + b"abcd",  # unknown serialize type 5
        struct.pack(">i", -5),
    ]
    loop = asyncio.get_running_loop()
    for payload in attacks * 3:
        await loop.run_in_executor(None, _raw, addr, payload)
    for _ in range(30):
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300)))
        await loop.run_in_executor(None, _raw, addr, junk)
    before = len(acked)
    await asyncio.sleep(0.5)
    stop.set()
    await worker
    assert len(acked) > before > 0, "the well-behaved client stopped being served"
    # The broker is still whole: the good client's messages are all there.
    records = await pull_all(good, "GoodClient", 0)
    assert [r.body for r in records][-len(acked) :] == [f"ok-{i}".encode() for i in range(len(acked))]
    good.close()


@pytest.mark.slow
async def test_kill_9_during_sync_sends_loses_no_acknowledged_message(make_cluster) -> None:
    cluster = make_cluster()
    conn = await connect(*_addr(cluster.broker_addr))
    acked: dict[bytes, int] = {}
    failures = 0

    async def sender(n: int) -> None:
        nonlocal failures
        i = 0
        while True:
            body = f"s{n}-{i}-".encode() + os.urandom(8).hex().encode()
            try:
                resp = await conn.request(send_cmd("CrashTopic", body), timeout=5)
            except Exception:
                failures += 1
                return
            if resp.code == 0:
                acked[body] = int(resp.ext_fields["queueOffset"])
            i += 1

    tasks = [asyncio.create_task(sender(n)) for n in range(16)]
    await asyncio.sleep(1.5)
    cluster.kill()
    await asyncio.gather(*tasks)
    assert len(acked) > 100
    cluster.start()
    fresh = await connect(*_addr(cluster.broker_addr))
    records = await pull_all(fresh, "CrashTopic", 0)
    bodies = [r.body for r in records]
    assert len(bodies) == len(set(bodies)), "a message appears twice in the queue"
    missing = set(acked) - set(bodies)
    assert not missing, f"{len(missing)} acknowledged messages lost"
    for r in records:
        if r.body in acked:
            assert r.queue_offset == acked[r.body]
    assert [r.queue_offset for r in records] == list(range(len(records)))
    fresh.close()
    assert "recover" in cluster.log_text().lower()
