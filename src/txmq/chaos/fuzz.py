"""Fuzzing the 4.x door: frames mutated from real requests go to a live ``txmq dev`` over several connections
while a well-behaved client on its own connection keeps sending and reading back.

The seeds are captured, not invented: txmq's own client runs a session against the fuzz broker (sends of every
kind, a transaction committed and one rolled back, a push consumer and an orderly one with a send-back, a pull
consumer, the admin calls) and every request frame it writes to the broker is recorded. Request codes that session
does not use get a seed built with ``txmq.protocol`` from the fields their handlers read. Each fuzzed frame applies
one to three mutations, drawn from a seeded generator (the same seed, the same frames):

* header: a field dropped, set to a wrong type (number, array, object, null), a huge or negative number, an empty
  or non-UTF-8-looking string, random extra fields, another request code, a oneway flag, a binary (ROCKETMQ)
  header instead of JSON;
* body: truncated, bit-flipped, replaced, a batch whose inner records lie about their lengths or carry broken
  property strings, a properties field with stray separators;
* frame: a length prefix that is huge, negative or larger than what follows (truncated frame), raw random bytes.

A frame-level mutation makes the broker hang up on that connection (the expected answer); the fuzzer opens another.
Counted: broker crashes (the process died), unhandled exceptions in the broker log, the good client's errors. Not
a Hypothesis search: a million frames against a live socket need a generator that costs microseconds per frame and
replays from a seed; Hypothesis's engine (shrinking, a database) is kept for the regression tests of what this finds.

State-changing admin codes that a valid request would legitimately use to break every other client (broker config
updates, wiping the broker's write permission, ACL edits) are left out, and no seed names the good client's topic or
group, so a fuzzed frame can only hurt the good client through a bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import random
import struct
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from txmq.chaos.common import check_broker, flip_bits
from txmq.chaos.report import PartResult
from txmq.client import (
    Admin,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    TransactionProducer,
)
from txmq.errors import FrameError
from txmq.net.connection import Connection
from txmq.protocol.codes import RequestCode, ResponseCode, TxmqRequestCode
from txmq.protocol.frame import FrameDecoder, RemotingCommand, decode_frame, encode_frame
from txmq.testing import DevCluster

log = logging.getLogger("txmq.chaos")

FUZZ_TOPIC, FUZZ_GROUP = "FuzzTopic", "FuzzGroup"
GOOD_TOPIC, GOOD_GROUP = "ChaosGoodTopic", "ChaosGoodProducers"
FAST = {"rebalance_interval": 1.0, "poll_name_server_interval": 2.0, "heartbeat_interval": 2.0}
# Valid requests with these codes change what every client sees (the broker's config and write permission, ACL
# accounts): a broker that obeys them is right, so they are not fuzzed.
EXCLUDED_CODES = {
    RequestCode.UPDATE_BROKER_CONFIG,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER,
    RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
    RequestCode.DELETE_ACL_CONFIG,
    RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
}
# Codes a client receives, not sends; a broker must still answer them sanely.
GENERIC_FIELDS = {
    "topic": FUZZ_TOPIC,
    "consumerGroup": FUZZ_GROUP,
    "group": FUZZ_GROUP,
    "producerGroup": FUZZ_GROUP,
    "queueId": "0",
    "offset": "0",
    "commitOffset": "0",
    "timestamp": "0",
    "key": "k1",
    "maxNum": "32",
    "beginTimestamp": "0",
    "endTimestamp": "99999999999999",
    "clientID": "fuzz@1",
    "clientId": "fuzz@1",
    "msgId": "7F00000100002A9F0000000000000000",
    "commitLogOffset": "0",
    "tranStateTableOffset": "0",
    "transactionId": "7F00000100002A9F0000000000000000",
    "commitOrRollback": "8",
    "fromTransactionCheck": "false",
    "namespace": "ns",
    "brokerName": "broker-a",
    "cluster": "DefaultCluster",
}


_RESPONSE_CODES = {int(c) for c in ResponseCode}


@dataclass
class FuzzSettings:
    frames: int = 20_000
    seed: int = 20261125
    connections: int = 4
    frames_per_connection: int = 400  # then the connection is closed (drops its long polls) and another opened


# -- capture ------------------------------------------------------------------------------------------------------


class Capture:
    """Records the requests txmq's client writes to one port, by wrapping ``Connection.request`` and
    ``Connection.send_oneway`` in this process. (Not ``Connection._send``: when the hot path runs compiled, the
    connection's own methods call it directly and a wrapper there never sees a frame.)"""

    def __init__(self, port: int) -> None:
        self.port = port
        self.frames: list[RemotingCommand] = []
        self._originals: dict[str, Any] = {}

    def _record(self, conn: Connection, cmd: RemotingCommand, oneway: bool) -> None:
        peer = getattr(conn, "peer", None)
        if peer is not None and peer[1] == self.port:
            frame = copy.deepcopy(cmd)
            frame.flag = (frame.flag | 2) & ~1 if oneway else frame.flag & ~3
            self.frames.append(frame)

    def __enter__(self) -> Capture:
        request, send_oneway = Connection.request, Connection.send_oneway
        capture = self

        async def recording_request(conn: Connection, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
            capture._record(conn, cmd, False)
            return await request(conn, cmd, timeout)

        def recording_oneway(conn: Connection, cmd: RemotingCommand) -> None:
            capture._record(conn, cmd, True)
            send_oneway(conn, cmd)

        self._originals = {"request": request, "send_oneway": send_oneway}
        Connection.request = recording_request  # type: ignore[method-assign]
        Connection.send_oneway = recording_oneway  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(Connection, name, original)


async def capture_session(cluster: DevCluster) -> list[RemotingCommand]:
    """Run a client session touching every request family and return the request frames sent to the broker."""
    ns = cluster.namesrv_addr
    async with Admin(ns, instance_name="fz-admin0") as admin:  # not captured: no seed may name the good topic
        (cluster_name,) = (await admin.cluster_info()).clusters
        await admin.create_topic(GOOD_TOPIC, cluster=cluster_name, read_queue_nums=2, write_queue_nums=2)
    with Capture(cluster.broker_port) as cap:
        async with Admin(ns, instance_name="fz-admin") as admin:
            await admin.create_topic(FUZZ_TOPIC, cluster=cluster_name, read_queue_nums=4, write_queue_nums=4)
            for _ in range(100):
                with contextlib.suppress(Exception):
                    await admin.topic_route(FUZZ_TOPIC)
                    await admin.topic_route(GOOD_TOPIC)
                    break
                await asyncio.sleep(0.1)
        async with Producer("FuzzProducers", ns, instance_name="fz-p", **FAST) as producer:
            sent = await producer.send(
                Message(FUZZ_TOPIC, b"hello", tags="TagA", keys=["k1", "k2"], properties={"a": "1"})
            )
            await producer.send(Message(FUZZ_TOPIC, b"z" * 6000))  # compressed
            await producer.send(Message(FUZZ_TOPIC, b"later", delay_level=1))
            await producer.send_orderly(Message(FUZZ_TOPIC, b"ordered"), 3)
            await producer.send_oneway(Message(FUZZ_TOPIC, b"oneway"))
            await producer.send_batch([Message(FUZZ_TOPIC, f"b{i}".encode(), keys=f"bk{i}") for i in range(3)])

        class Listener:
            def execute_local_transaction(self, message: Any, arg: Any) -> LocalTransactionState:
                return arg

            def check_local_transaction(self, message: Any) -> LocalTransactionState:
                return LocalTransactionState.COMMIT

        async with TransactionProducer("FuzzTx", ns, Listener(), instance_name="fz-tx", **FAST) as txp:
            await txp.send_message_in_transaction(Message(FUZZ_TOPIC, b"tx-commit"), LocalTransactionState.COMMIT)
            await txp.send_message_in_transaction(Message(FUZZ_TOPIC, b"tx-rollback"), LocalTransactionState.ROLLBACK)
            async with txp.transaction() as tx:
                await tx.send(Message(FUZZ_TOPIC, b"several-1"))
                await tx.send(Message(FUZZ_TOPIC, b"several-2"))
        failed_once: set[bytes] = set()

        def concurrent(msgs: list[MessageExt]) -> ConsumeStatus:
            if msgs[0].body not in failed_once:
                failed_once.add(msgs[0].body)
                return ConsumeStatus.RECONSUME_LATER  # CONSUMER_SEND_MSG_BACK
            return ConsumeStatus.CONSUME_SUCCESS

        def orderly(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
            return ConsumeOrderlyStatus.SUCCESS

        push = PushConsumer(
            FUZZ_GROUP,
            ns,
            instance_name="fz-c",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            persist_consumer_offset_interval=0.5,
            **FAST,
        )
        push.subscribe(FUZZ_TOPIC, "TagA || *")
        push.register_listener(concurrent)
        ordered = PushConsumer(
            FUZZ_GROUP + "Orderly",
            ns,
            instance_name="fz-oc",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            **FAST,
        )
        ordered.subscribe(FUZZ_TOPIC)
        ordered.register_listener(orderly, orderly=True)
        async with push, ordered:
            deadline = time.monotonic() + 10
            while len(failed_once) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.5)
        async with PullConsumer("FuzzPull", ns, instance_name="fz-pull") as puller:
            for mq in await puller.fetch_queues(FUZZ_TOPIC):
                await puller.pull(mq, "*", 0, 8)
                await puller.max_offset(mq)
                await puller.min_offset(mq)
                await puller.search_offset(mq, int(time.time() * 1000))
                await puller.earliest_msg_store_time(mq)
                await puller.update_offset(mq, 1)
                await puller.persist_offset(mq)
                await puller.fetch_offset(mq)
        async with Admin(ns, instance_name="fz-admin2") as admin:
            calls = [
                admin.topic_stats(FUZZ_TOPIC),
                admin.consume_stats(FUZZ_GROUP),
                admin.consumer_connections(FUZZ_GROUP),
                admin.broker_runtime_info(cluster.broker_addr),
                admin.view_message(sent.offset_msg_id),
                admin.query_message_by_key(FUZZ_TOPIC, "k1"),
                admin.list_transactions(),
                admin.transaction_counters(),
                admin.dead_letters(FUZZ_GROUP),
            ]
            for call in calls:
                with contextlib.suppress(Exception):
                    await call
    frames = [f for f in cap.frames if f.code not in EXCLUDED_CODES]
    named = [f.code for f in frames if GOOD_TOPIC.encode() in f.body or GOOD_TOPIC in str(f.ext_fields)]
    assert not named, f"captured seeds name the good client's topic: codes {named}"
    return frames


def seed_frames(captured: list[RemotingCommand]) -> tuple[list[RemotingCommand], set[int], set[int]]:
    """The captured frames plus a built one for every request code the session did not use; also returns the
    captured and the built codes."""
    captured_codes = {f.code for f in captured}
    built: set[int] = set()
    seeds = list(captured)
    all_codes = {int(c) for c in RequestCode} | {int(c) for c in TxmqRequestCode}
    for code in sorted(all_codes - captured_codes - {int(c) for c in EXCLUDED_CODES}):
        body = orjson.dumps({"limit": 10}) if code in {int(c) for c in TxmqRequestCode} else b""
        seeds.append(RemotingCommand(code=code, ext_fields=dict(GENERIC_FIELDS), body=body))
        built.add(code)
    return seeds, captured_codes, built


# -- mutation -----------------------------------------------------------------------------------------------------

_ODD_STRINGS = [
    "",
    " ",
    "-1",
    "0",
    "2147483648",
    "-9223372036854775809",
    "99999999999999999999999",
    "1e309",
    "NaN",
    "true",
    "null",
    "\x00",
    "\x01\x02",
    "%RETRY%",
    "a" * 300,
    "é" * 40,
    "\ud7ff",
    "TBW102",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "SCHEDULE_TOPIC_XXXX",
    "||",
    "a=b\x01c",
    "0x10",
    "1.5",
    "[]",
    "{}",
]
_ODD_VALUES: list[Any] = [
    None,
    0,
    -1,
    2**31,
    2**63,
    -(2**63) - 1,
    1.5e300,
    float("inf") if False else 1e308,
    True,
    [],
    [1, "a"],
    {},
    {"x": {"y": 1}},
    "x" * 5000,
]


def _rand_string(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(_ODD_STRINGS)
    return "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(0, 24)))


def _json_header(cmd: RemotingCommand, rng: random.Random, ext: dict[str, Any]) -> dict[str, Any]:
    header: dict[str, Any] = {
        "code": cmd.code,
        "language": cmd.language,
        "version": cmd.version,
        "opaque": cmd.opaque,
        "flag": cmd.flag,
        "serializeTypeCurrentRPC": "JSON",
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["extFields"] = ext
    return header


def _frame_from_header(header_bytes: bytes, body: bytes, serialize_type: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header_bytes) + len(body), (serialize_type << 24) | len(header_bytes)) + (
        header_bytes + body
    )


def _mutate_properties(rng: random.Random, props: str) -> str:
    choice = rng.randrange(5)
    if choice == 0:
        return props + "\x01\x01\x02\x02"
    if choice == 1:
        return props.replace("\x02", "", 1)
    if choice == 2:
        return "\x01".join(rng.choice(["a", "", "\x02", "UNIQ_KEY", "DELAY\x01-5", "TAGS"]) for _ in range(6))
    if choice == 3:
        return props + "DELAY\x01" + rng.choice(["-1", "99999", "x"]) + "\x02"
    return "\x02" * rng.randint(1, 20)


def _mutate_batch_body(rng: random.Random, body: bytes) -> bytes:
    """A batch body is a run of inner records (int32 total, magic, crc, flag, body, properties): lie in one."""
    data = bytearray(body or b"\x00" * 32)
    if len(data) < 8:
        return bytes(data) + struct.pack(">i", rng.choice([-1, 2**31 - 1, 0, 7]))
    where = rng.choice([0, 8, 12, 16, 20]) if rng.random() < 0.6 else rng.randrange(len(data) - 4)
    where = min(where, len(data) - 4)
    struct.pack_into(">i", data, where, rng.choice([-1, 0, 1, 4, 2**31 - 1, len(data) * 3, -(2**31)]))
    return bytes(data)


def _mutate_body(rng: random.Random, cmd: RemotingCommand) -> bytes:
    body = cmd.body
    choice = rng.randrange(6)
    if choice == 0 and body:
        return body[: rng.randrange(len(body))]
    if choice == 1 and body:
        return flip_bits(rng, body, 8)
    if choice == 2:
        return rng.randbytes(rng.choice([0, 1, 7, 64, 4096]))
    if choice == 3 and cmd.code == RequestCode.SEND_BATCH_MESSAGE:
        return _mutate_batch_body(rng, body)
    if choice == 4:
        return rng.choice(
            [
                b"{",
                b"[]",
                b"null",
                b'{"heartbeat": 1}',
                orjson.dumps({"a": [None] * 10}),
                b"\x78\x9c" + rng.randbytes(20),
            ]
        )  # zlib magic, then garbage
    return zlib.compress(rng.randbytes(32))


def _mutate_ext(rng: random.Random, ext: dict[str, Any]) -> dict[str, Any]:
    ext = dict(ext)
    choice = rng.randrange(7)
    keys = list(ext)
    if choice == 0 and keys:
        del ext[rng.choice(keys)]
    elif choice == 1 and keys:
        ext[rng.choice(keys)] = rng.choice(_ODD_VALUES)
    elif choice == 2 and keys:
        ext[rng.choice(keys)] = _rand_string(rng)
    elif choice == 3:
        ext[_rand_string(rng)] = _rand_string(rng)
    elif choice == 4 and "properties" in ext:
        ext["properties"] = _mutate_properties(rng, str(ext["properties"]))
    elif choice == 5 and keys:
        key = rng.choice(keys)
        ext[key] = str(rng.choice([-1, 0, 2**31 - 1, 2**31, 2**63 - 1, -(2**63), 10**30]))
    else:
        for key in keys:
            if rng.random() < 0.3:
                ext[key] = _rand_string(rng)
    return ext


def fuzz_frame(rng: random.Random, seeds: list[RemotingCommand]) -> tuple[bytes, bool]:
    """One fuzzed frame, and whether the codec refuses it (the broker then hangs up on that connection)."""
    frame = _fuzz_frame(rng, seeds)
    try:
        decode_frame(frame)
    except (FrameError, ValueError, struct.error):
        return frame, True
    return frame, False


def _fuzz_frame(rng: random.Random, seeds: list[RemotingCommand]) -> bytes:
    seed = rng.choice(seeds)
    cmd = RemotingCommand(
        code=seed.code,
        opaque=rng.randrange(1, 2**31 - 1),
        flag=seed.flag & ~1,
        remark=seed.remark,
        ext_fields=dict(seed.ext_fields),
        body=seed.body,
        language=rng.choice(["JAVA", "CPP", "PYTHON", "GO"]),
        version=seed.version,
    )
    kind = rng.random()
    if kind < 0.04:  # frame level: the connection is expected to close
        good = encode_frame(cmd)
        sub = rng.randrange(5)
        if sub == 0:
            return struct.pack(">i", rng.choice([2**31 - 1, 16 * 1024 * 1024 + 1, 2**30])) + good[4:]
        if sub == 1:
            return struct.pack(">i", rng.choice([-1, 0, 3, -(2**31)])) + good[4:]
        if sub == 2:
            return rng.randbytes(rng.randint(8, 256))
        if sub == 3:  # header length beyond the frame
            return good[:4] + struct.pack(">I", 0x00FFFFFF) + good[8:]
        return good + rng.randbytes(rng.randint(1, 12))  # a good frame, then garbage (a torn next frame)
    ext: dict[str, Any] = dict(cmd.ext_fields)
    body = cmd.body
    header_override: dict[str, Any] | None = None
    for _ in range(rng.randint(1, 3)):
        m = rng.random()
        if m < 0.45:
            ext = _mutate_ext(rng, ext)
        elif m < 0.7:
            body = _mutate_body(rng, RemotingCommand(code=cmd.code, ext_fields=cmd.ext_fields, body=body))
        elif m < 0.78:
            cmd.code = rng.choice([s.code for s in seeds] + [rng.randint(-5, 2000)])
        elif m < 0.84:
            cmd.flag = rng.choice([0, 2, 3, 1, 255])  # oneway, a response flag on a request, garbage
        elif m < 0.92:
            header_override = {
                k: rng.choice(_ODD_VALUES)
                for k in rng.sample(
                    ["code", "opaque", "flag", "version", "language", "extFields", "remark"], rng.randint(1, 3)
                )
            }
        else:
            cmd.version = rng.choice([-1, 0, 2**31 - 1, 121, 409])
    if cmd.flag & 1:
        cmd.flag &= ~1
    if rng.random() < 0.1:  # binary header
        try:
            cmd.ext_fields = {str(k): str(v) for k, v in ext.items()}
            cmd.body = body
            cmd.serialize_type = 1
            return encode_frame(cmd)
        except Exception:
            pass
    header = _json_header(cmd, rng, ext)
    if header_override:
        header.update(header_override)
    try:
        raw = orjson.dumps(header, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        raw = orjson.dumps({k: str(v) for k, v in header.items()})
    if rng.random() < 0.03:
        raw = raw[: rng.randrange(len(raw))]  # invalid JSON: the connection closes
        return _frame_from_header(raw, body)
    return _frame_from_header(raw, body)


# -- the run ------------------------------------------------------------------------------------------------------


class GoodClient:
    """Sends a message to its own topic and pulls it back, over and over; every failure is counted."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.ok = 0
        self.errors: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        producer = Producer(GOOD_GROUP, self.ns, instance_name="good-p", **FAST)
        puller = PullConsumer("ChaosGoodReaders", self.ns, instance_name="good-r", **FAST)
        async with producer, puller:
            queues = {mq.queue_id: mq for mq in await puller.fetch_queues(GOOD_TOPIC)}
            n = 0
            while not self.stop.is_set():
                body = f"good-{n}".encode()
                n += 1
                try:
                    sent = await producer.send(Message(GOOD_TOPIC, body), timeout=10)
                    mq = queues[sent.message_queue.queue_id]
                    result = await puller.pull(mq, "*", sent.queue_offset, 1)
                    if result.status is not PullStatus.FOUND or result.messages[0].body != body:
                        self.errors.append(f"read back {result.status} {[m.body for m in result.messages]!r}")
                    else:
                        self.ok += 1
                except Exception as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.02)


async def _blast(
    port: int,
    rng: random.Random,
    seeds: list[RemotingCommand],
    count: int,
    per_conn: int,
    stats: Counter[str],
    *,
    breakers: bool,
) -> None:
    """Send ``count`` fuzzed frames over successive connections and count the answers by response code. With
    ``breakers`` only frames that break the framing are sent (one per connection: the broker hangs up); without,
    only frames that keep it (so the broker parses, dispatches and answers every one)."""
    sent = 0
    while sent < count:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        except (OSError, TimeoutError):
            stats["connect_failures"] += 1
            await asyncio.sleep(0.2)
            continue
        stats["connections"] += 1

        async def drain_replies(reader: asyncio.StreamReader = reader) -> None:
            decoder = FrameDecoder()
            with contextlib.suppress(Exception):
                while True:
                    chunk = await reader.read(65536)
                    if not chunk:
                        stats["closed_by_broker"] += 1
                        return
                    for reply in decoder.feed(chunk):
                        stats[
                            f"answered {ResponseCode(reply.code).name if reply.code in _RESPONSE_CODES else reply.code}"
                        ] += 1

        draining = asyncio.ensure_future(drain_replies())
        try:
            for _ in range(1 if breakers else min(per_conn, count - sent)):
                while True:
                    frame, breaks = fuzz_frame(rng, seeds)
                    if breaks == breakers:
                        break
                writer.write(frame)
                sent += 1
                stats["frames"] += 1
                stats["framing_breaks" if breaks else "well_framed"] += 1
                stats["bytes"] += len(frame)
                await asyncio.wait_for(writer.drain(), 10)
                if draining.done():
                    break
            # Give the answers time to come back before hanging up (long polls are cut short by the close).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(draining), 0.5 if breakers else 1.0)
        except (OSError, TimeoutError, ConnectionError, RuntimeError):  # RuntimeError: uvloop's closed transport
            stats["write_failures"] += 1
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            draining.cancel()


def unhandled_lines(text: str) -> list[str]:
    """The log records of exceptions no handler turned into an error reply: a record followed by a traceback (a
    handler's last-resort catch, asyncio's "exception was never retrieved"), or a CRITICAL one. One line each: the
    record, and after " => " the traceback's last exception line (what a report needs to tell the cause)."""
    out: list[str] = []
    last_record = ""
    counted = False
    in_traceback = False
    for line in text.splitlines():
        if line[:4].isdigit() and " " in line:  # a new record: "2026-11-25 06:08:51,891 LEVEL logger: message"
            last_record, counted, in_traceback = line, False, False
            if " CRITICAL " in line:
                out.append(line[:400])
                counted = True
        elif line.startswith("Traceback (most recent call last)"):
            in_traceback = True
            if not counted:
                out.append((last_record or line)[:400])
                counted = True
        elif in_traceback and line and not line[0].isspace() and out:
            # the exception line ("ValueError: ..."); with chained exceptions the last one is kept
            out[-1] = out[-1].split(" => ", 1)[0] + " => " + line[:300]
    return out


async def run_fuzz_campaign(settings: FuzzSettings, work_dir: Path, progress: Any = None) -> PartResult:
    result = PartResult("fuzz")
    result.zero("broker_crashes", "broker_unhandled_exceptions", "good_client_errors")
    started = time.monotonic()
    rng = random.Random(settings.seed)
    cluster = DevCluster(work_dir / "fuzz-cluster", {"mappedFileSizeCommitLog": str(16 * 1024 * 1024)})
    stats: Counter[str] = Counter()
    good: GoodClient | None = None
    try:
        cluster.start(timeout=60)
        captured = await capture_session(cluster)
        seeds, captured_codes, built_codes = seed_frames(captured)
        result.info["captured_frames"] = len(captured)
        result.info["captured_codes"] = len(captured_codes)
        result.info["built_codes"] = len(built_codes)
        result.info["captured_code_list"] = sorted(captured_codes)
        result.info["built_code_list"] = sorted(built_codes)
        good = GoodClient(cluster.namesrv_addr)
        good_task = asyncio.ensure_future(good.run())
        # One connection sends the frames that break the framing (a hang-up each), the others the rest.
        breaking = max(1, settings.frames // 20)
        per = (settings.frames - breaking) // settings.connections
        counts = [per] * settings.connections
        counts[0] += settings.frames - breaking - per * settings.connections
        counts.append(breaking)
        sub_rngs = [random.Random(rng.getrandbits(64)) for _ in counts]
        chunk = 5000
        done = [0] * len(counts)
        while any(d < c for d, c in zip(done, counts, strict=True)):
            steps = [min(chunk, c - d) for d, c in zip(done, counts, strict=True)]
            await asyncio.gather(
                *(
                    _blast(
                        cluster.broker_port,
                        r,
                        seeds,
                        n,
                        settings.frames_per_connection,
                        stats,
                        breakers=i == len(counts) - 1,
                    )
                    for i, (r, n) in enumerate(zip(sub_rngs, steps, strict=True))
                    if n
                )
            )
            done = [d + n for d, n in zip(done, steps, strict=True)]
            check_broker(cluster, result, f"after {stats['frames']} frames", restart=True)
            if progress:
                progress(
                    f"fuzz: {stats['frames']}/{settings.frames} frames, good client {good.ok} ok, "
                    f"{len(good.errors)} errors"
                )
        await asyncio.sleep(1.0)
        good.stop.set()
        await asyncio.wait_for(good_task, 30)
        check_broker(cluster, result, "by the end", restart=False)
        for error in good.errors:
            result.fail("good_client_errors", error)
        result.info["good_client_round_trips"] = good.ok
        for line in unhandled_lines(cluster.log_text()):
            result.fail("broker_unhandled_exceptions", line)
        result.info.update(stats)
    except Exception as exc:
        log.exception("fuzz campaign stopped")
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        cluster.stop()
        result.seconds = time.monotonic() - started
    result.info["frames_per_second"] = round(stats["frames"] / max(result.seconds, 1e-9))
    return result
