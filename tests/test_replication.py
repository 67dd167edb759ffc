"""Master/slave replication with real processes on loopback: a name server, a master and a slave ``txmq broker``
(issue 21, first step)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from cluster_harness import DevCluster, ExtraBroker
from txmq.client import ConsumeFromWhere, ConsumeStatus, Message
from txmq.client import PushConsumer as AsyncPushConsumer
from txmq.client.sync import Admin, Producer, PullConsumer
from txmq.errors import MQBrokerError
from txmq.ha.wire import Accept, MasterFrameDecoder, Refuse, encode_hello, encode_report
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import FrameDecoder, RemotingCommand, encode_frame
from txmq.store.commit_log import segment_name
from txmq.testing import NameServerProcess, aeventually, eventually

SEGMENT = 16 * 1024 * 1024
BROKER_CONF = {"mappedFileSizeCommitLog": str(SEGMENT), "transactionTimeOut": "1000"}


@dataclass
class Pair:
    namesrv: subprocess.Popen[bytes]
    namesrv_addr: str
    master: ExtraBroker
    slave: ExtraBroker

    def ha_port(self) -> int:
        return self.master.broker_port + 1  # free_port() keeps the neighbour free


def _start_namesrv(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    namesrv = NameServerProcess(tmp / "namesrv.out").start()
    assert namesrv.proc is not None
    return namesrv.proc, namesrv.addr


@pytest.fixture
def pair(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pair]:
    role = getattr(request, "param", "SYNC_MASTER")
    namesrv, addr = _start_namesrv(tmp_path)
    port = int(addr.rsplit(":", 1)[1])
    common = {**BROKER_CONF, "brokerName": "broker-r", "brokerIP1": "127.0.0.1", "grpcListenPort": "0"}
    master = ExtraBroker(tmp_path / "master", {**common, "brokerRole": role}, namesrv_port=port)
    slave = ExtraBroker(
        tmp_path / "slave",
        {**common, "brokerRole": "SLAVE", "brokerId": "1", "slaveSyncInterval": "500"},
        namesrv_port=port,
    )
    made = []
    try:
        made.append(master.start())
        made.append(slave.start())
        with Admin(addr) as admin:
            eventually(
                lambda: admin.broker_runtime_info(master.broker_addr).get("haSlavesInSync") == "1",
                "the slave is in sync",
                timeout=20,
            )
        yield Pair(namesrv, addr, master, slave)
    finally:
        for b in made:
            b.kill()
        namesrv.kill()
        namesrv.wait(10)


def _slave_log_bytes(pair: Pair, end: int) -> bytes:
    with open(pair.slave.data_dir / "store" / "commitlog" / segment_name(0), "rb") as f:
        return f.read(end)


def _master_log_bytes(pair: Pair, end: int) -> bytes:
    with open(pair.master.data_dir / "store" / "commitlog" / segment_name(0), "rb") as f:
        return f.read(end)


def test_sync_master_acknowledges_only_what_the_slave_has_on_disk(pair: Pair) -> None:
    with Producer("PG_REPL", pair.namesrv_addr) as producer:
        for i in range(20):
            result = producer.send(Message("TopicRepl", f"m{i}".encode(), tags="A"))
            assert result.status.name == "SEND_OK", result
            # Acknowledged: the record is already in the slave's commit-log file, byte for byte.
            size = 4096 * (i + 1)
            stored = _slave_log_bytes(pair, size)
            assert f"m{i}".encode() in stored
    with Admin(pair.namesrv_addr) as admin:
        info = admin.cluster_info()
        assert info.broker_addrs["broker-r"] == {0: pair.master.broker_addr, 1: pair.slave.broker_addr}


def _request(port: int, cmd: RemotingCommand) -> RemotingCommand:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(encode_frame(cmd))
        decoder = FrameDecoder()
        while True:
            chunk = s.recv(65536)
            assert chunk, "the broker closed the connection"
            frames = decoder.feed(chunk)
            if frames:
                return frames[0]


def _ha_exchange(port: int, payload: bytes) -> list[object]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        decoder = MasterFrameDecoder()
        frames: list[object] = []
        s.settimeout(5)
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            frames += decoder.feed(chunk)
        return frames


def test_bad_input_on_the_ha_port_is_refused_and_the_master_keeps_serving(pair: Pair) -> None:
    port = pair.ha_port()
    # Garbage, a stranger (an HTTP request), a RocketMQ-style bare offset: refused, connection closed.
    for junk in (os.urandom(64).replace(b"H", b"h").replace(b"R", b"r"), b"GET / HTTP/1.0\r\n\r\n"):
        frames = _ha_exchange(port, junk)
        assert frames and isinstance(frames[-1], Refuse), frames
    # A replica of another broker.
    frames = _ha_exchange(port, encode_hello("broker-other", SEGMENT))
    assert isinstance(frames[-1], Refuse) and "broker-other" in frames[-1].reason
    # A slave claiming an offset beyond the master's end.
    frames = _ha_exchange(port, encode_hello("broker-r", SEGMENT) + encode_report(1 << 40))
    assert isinstance(frames[0], Accept) and isinstance(frames[-1], Refuse)
    assert "beyond" in frames[-1].reason
    log_text = pair.master.log_text()
    assert "HA: refused" in log_text and "beyond this master's end" in log_text
    # The master still serves sends, and the real slave still replicates them.
    with Producer("PG_REPL", pair.namesrv_addr) as producer:
        result = producer.send(Message("TopicRepl", b"after-garbage"))
        assert result.status.name == "SEND_OK"


def test_slave_serves_pulls_and_refuses_writes_then_takes_over_reads_after_sigkill(pair: Pair) -> None:
    bodies = [f"body-{i}".encode() for i in range(60)]
    with Producer("PG_REPL", pair.namesrv_addr) as producer:
        for body in bodies:
            assert producer.send(Message("TopicFail", body)).status.name == "SEND_OK"
    # The slave's commit log is the master's, byte for byte.
    with Admin(pair.namesrv_addr) as admin:
        end = admin.broker_runtime_info(pair.master.broker_addr)["commitLogMaxOffset"]
    assert _slave_log_bytes(pair, int(end)) == _master_log_bytes(pair, int(end))
    # A slave refuses sends (RocketMQ: SERVICE_NOT_AVAILABLE from its store) and END_TRANSACTION.
    send_header = {
        "producerGroup": "PG",
        "topic": "TopicFail",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "0",
        "sysFlag": "0",
        "bornTimestamp": "0",
        "flag": "0",
        "properties": "",
    }
    end_tx_header = {
        "producerGroup": "PG",
        "tranStateTableOffset": "0",
        "commitLogOffset": "0",
        "commitOrRollback": "8",
        "fromTransactionCheck": "false",
        "msgId": "x",
    }
    slave_port = pair.slave.broker_port
    assert _request(slave_port, RemotingCommand.request(10, send_header, b"x")).code == (
        ResponseCode.SERVICE_NOT_AVAILABLE
    )
    assert _request(slave_port, RemotingCommand.request(37, end_tx_header)).code == ResponseCode.SLAVE_NOT_AVAILABLE

    pair.master.kill()
    with Admin(pair.namesrv_addr) as admin:
        # The name server drops the master when its connection closes; the slave stays in the route.
        eventually(
            lambda: admin.cluster_info().broker_addrs.get("broker-r") == {1: pair.slave.broker_addr},
            "master dropped",
            timeout=10,
        )
    seen: list[bytes] = []
    with PullConsumer("CG_FAIL", pair.namesrv_addr) as consumer:
        queues = consumer.fetch_queues("TopicFail")
        for mq in queues:
            offset = 0
            while True:
                result = consumer.pull(mq, "*", offset, 32)
                if not result.messages:
                    break
                seen += [m.body for m in result.messages]
                offset = result.next_begin_offset
    assert sorted(seen) == sorted(bodies)


def test_manual_promotion_makes_the_slave_the_master(pair: Pair) -> None:
    # Refused while the master is alive and registered.
    with Admin(pair.namesrv_addr) as admin, pytest.raises(MQBrokerError, match="still lists"):
        admin.promote_broker(pair.slave.broker_addr)
    with Producer("PG_REPL", pair.namesrv_addr) as producer:
        before = [producer.send(Message("TopicPromo", f"before-{i}".encode())) for i in range(10)]
        assert all(r.status.name == "SEND_OK" for r in before)
    pair.master.kill()
    with Admin(pair.namesrv_addr) as admin:
        eventually(
            lambda: 0 not in admin.cluster_info().broker_addrs.get("broker-r", {0: ""}), "master gone", timeout=10
        )
        answer = admin.promote_broker(pair.slave.broker_addr)
        assert answer["brokerRole"] == "ASYNC_MASTER" and answer["brokerId"] == 0
        assert admin.cluster_info().broker_addrs["broker-r"] == {0: pair.slave.broker_addr}
    assert "promoted:" in pair.slave.log_text()
    # The new master takes sends and serves every message, old and new.
    with Producer("PG_REPL", pair.namesrv_addr) as producer:
        after = producer.send(Message("TopicPromo", b"after"))
        assert after.status.name == "SEND_OK"
    seen: list[bytes] = []
    with PullConsumer("CG_PROMO", pair.namesrv_addr) as consumer:
        for mq in consumer.fetch_queues("TopicPromo"):
            offset = 0
            while messages := consumer.pull(mq, "*", offset, 32).messages:
                seen += [m.body for m in messages]
                offset = messages[-1].queue_offset + 1
    assert sorted(seen) == sorted([f"before-{i}".encode() for i in range(10)] + [b"after"])


class DevWithReplica(DevCluster):
    """``txmq dev --replicas 1``: a name server, a SYNC_MASTER and its slave in one process."""

    def _command(self, conf_path: Path) -> list[str]:
        return [*super()._command(conf_path), "--replicas", "1"]


def test_txmq_dev_with_a_replica(tmp_path: Path) -> None:
    dev = DevWithReplica(tmp_path / "dev", {**BROKER_CONF, "grpcListenPort": "0"})
    dev.start()
    try:
        assert any("slave 1" in line for line in dev.output)
        with Producer("PG_DEV", dev.namesrv_addr) as producer:
            assert producer.send(Message("TopicDev", b"hello")).status.name == "SEND_OK"
        with Admin(dev.namesrv_addr) as admin:
            addrs = admin.cluster_info().broker_addrs["broker-a"]
            assert sorted(addrs) == [0, 1]
            master = admin.broker_runtime_info(addrs[0])
            slave = admin.broker_runtime_info(addrs[1])
        assert master["brokerRole"] == "SYNC_MASTER" and master["haSlavesInSync"] == "1"
        assert slave["brokerRole"] == "SLAVE" and slave["haSlaveDurableOffset"] == master["commitLogMaxOffset"]
    finally:
        dev.stop()


def _offset_sum(port: int, key: str) -> int:
    body = _request(port, RemotingCommand.request(43, {})).body
    table = orjson.loads(body).get("offsetTable", {}) if body else {}
    return sum(int(v) for v in table.get(key, {}).values())


def test_push_consumers_continue_from_the_slave_after_the_master_is_killed(pair: Pair) -> None:
    total = 100
    bodies = {f"p{i}".encode() for i in range(total)}
    with Producer("PG_PUSH", pair.namesrv_addr) as producer:
        for body in sorted(bodies):
            assert producer.send(Message("TopicPush", body)).status.name == "SEND_OK"
    seen: Counter[bytes] = Counter()

    async def consume(until: Callable[[], bool], **options: Any) -> None:
        async def listener(msgs: list[Any]) -> ConsumeStatus:
            for m in msgs:
                seen[m.body] += 1
            await asyncio.sleep(0.05)  # slow enough that the first consumer stops half way
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = AsyncPushConsumer(
            "CG_PUSH",
            pair.namesrv_addr,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            consume_thread_max=1,
            **options,
        )
        consumer.subscribe("TopicPush")
        consumer.register_listener(listener)
        await consumer.start()
        try:
            await aeventually(until, "consumed enough", timeout=60)
        finally:
            await consumer.shutdown()  # commits its offsets (to the master, or to the slave when it is gone)

    asyncio.run(consume(lambda: len(seen) >= 10, pull_batch_size=1, pull_threshold_for_queue=1))
    first = len(seen)
    assert first < total
    # The slave follows the master's consumer offsets.
    key = "TopicPush@CG_PUSH"
    eventually(
        lambda: _offset_sum(pair.slave.broker_port, key) == _offset_sum(pair.master.broker_port, key) > 0,
        "the slave has the master's offsets",
        timeout=10,
    )
    pair.master.kill()
    with Admin(pair.namesrv_addr) as admin:
        eventually(
            lambda: 0 not in admin.cluster_info().broker_addrs.get("broker-r", {0: ""}), "master gone", timeout=10
        )
    asyncio.run(consume(lambda: set(seen) == bodies))
    redelivered = sum(seen.values()) - total
    assert redelivered < first  # resumed from the copied offsets, not from the start
    # The second consumer's progress was committed to the slave.
    assert _offset_sum(pair.slave.broker_port, key) == total
