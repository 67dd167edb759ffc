"""A SYNC_MASTER waits for its slave on every append an acknowledgement depends on, through both doors (issue 21):
END_TRANSACTION's committed copy and op marker, the delay service's re-puts, gRPC sends; a slave's gRPC door refuses
writes; the promoted slave serves both doors. Real processes: a name server, a master and a slave ``txmq broker``.

The slave is frozen with SIGSTOP to show the master holds its answer (and its delay offset) until the slave has the
bytes, then the master is killed with SIGKILL right after it answered and the promoted slave must have everything."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest

from txmq.client.sync import Admin, PullConsumer
from txmq.door_grpc.pb import definition_pb2 as d
from txmq.door_grpc.pb import service_pb2 as s
from txmq.door_grpc.pb import service_pb2_grpc
from txmq.door_grpc.telemetry import parse_transaction_id
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import FrameDecoder, RemotingCommand, encode_frame
from txmq.testing import ExtraBroker, NameServerProcess, eventually

BROKER = "broker-s"
TOPIC = "TopicSyncAppends"
LEVEL = 2  # messageDelayLevel below: 3 s, long enough to freeze the slave before the message is due


@dataclass
class Pair:
    namesrv: NameServerProcess
    master: ExtraBroker
    slave: ExtraBroker

    def stub(self, broker: ExtraBroker) -> Any:
        return service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(broker.grpc_endpoint))


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    namesrv = NameServerProcess(tmp_path / "namesrv.out").start()
    common = {
        "brokerName": BROKER,
        "brokerIP1": "127.0.0.1",
        "metricsPort": "0",
        "mappedFileSizeCommitLog": str(16 << 20),
        "messageDelayLevel": "1s 3s 5s",
        "transactionTimeOut": "1000",
        "transactionCheckInterval": "1000",
        "syncFlushTimeout": "60000",  # a frozen slave makes the master wait, not time out
    }
    master = ExtraBroker(tmp_path / "master", {**common, "brokerRole": "SYNC_MASTER"}, namesrv_port=namesrv.port)
    slave = ExtraBroker(
        tmp_path / "slave",
        {**common, "brokerRole": "SLAVE", "brokerId": "1", "slaveSyncInterval": "300"},
        namesrv_port=namesrv.port,
    )
    try:
        master.start()
        slave.start()
        with Admin(namesrv.addr) as admin:
            eventually(
                lambda: admin.broker_runtime_info(master.broker_addr).get("haSlavesInSync") == "1",
                "the slave is in sync",
                timeout=30,
            )
            admin.create_topic(TOPIC, cluster="DefaultCluster", read_queue_nums=2, write_queue_nums=2)
        yield Pair(namesrv, master, slave)
    finally:
        for b in (master, slave):
            if b.proc is not None and b.proc.poll() is None:
                os.killpg(b.proc.pid, signal.SIGCONT)
            b.kill()
        namesrv.stop()


def _message(body: bytes, message_id: str, **system: Any) -> d.Message:
    return d.Message(
        topic=d.Resource(name=TOPIC),
        body=body,
        system_properties=d.SystemProperties(message_id=message_id, body_encoding=d.IDENTITY, **system),
    )


def _send(stub: Any, message: d.Message, timeout: float = 30) -> s.SendMessageResponse:
    return stub.SendMessage(s.SendMessageRequest(messages=[message]), timeout=timeout)


def _end(stub: Any, tx_id: str, message_id: str, timeout: float = 60) -> s.EndTransactionResponse:
    request = s.EndTransactionRequest(
        topic=d.Resource(name=TOPIC),
        message_id=message_id,
        transaction_id=tx_id,
        resolution=d.COMMIT,
        source=d.SOURCE_CLIENT,
    )
    return stub.EndTransaction(request, timeout=timeout)


def _request(port: int, cmd: RemotingCommand, timeout: float = 60) -> RemotingCommand:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(encode_frame(cmd))
        decoder = FrameDecoder()
        while True:
            chunk = sock.recv(65536)
            assert chunk, "the broker closed the connection without an answer"
            if frames := decoder.feed(chunk):
                return frames[0]


def _end_4x(port: int, tx_id: str, message_id: str) -> RemotingCommand:
    """A non-oneway END_TRANSACTION COMMIT through the 4.x door (a producer waiting for its answer)."""
    phys, queue_offset = parse_transaction_id(tx_id)
    header = {
        "producerGroup": TOPIC,  # a 5.x half message's producer group is its topic
        "tranStateTableOffset": str(queue_offset),
        "commitLogOffset": str(phys),
        "commitOrRollback": "8",
        "fromTransactionCheck": "false",
        "msgId": message_id,
    }
    return _request(port, RemotingCommand.request(RequestCode.END_TRANSACTION, header))


def _bodies(namesrv: str, group: str) -> list[bytes]:
    out: list[bytes] = []
    with PullConsumer(group, namesrv) as consumer:
        for mq in consumer.fetch_queues(TOPIC):
            offset = 0
            while messages := consumer.pull(mq, "*", offset, 32).messages:
                out += [m.body for m in messages]
                offset = messages[-1].queue_offset + 1
    return out


def _not_answered_while_frozen(future: Future[Any], what: str) -> None:
    time.sleep(1.5)
    assert not future.done(), f"{what} was answered while the slave was frozen: {future.result()}"


def _kill_master_and_promote(pair: Pair) -> None:
    pair.master.kill()
    with Admin(pair.namesrv.addr) as admin:
        eventually(lambda: 0 not in admin.cluster_info().broker_addrs.get(BROKER, {0: ""}), "master gone", timeout=15)
        answer = admin.promote_broker(pair.slave.broker_addr)
        assert answer["brokerId"] == 0


def test_sync_master_commits_wait_for_the_slave_and_survive_the_kill_through_both_doors(pair: Pair) -> None:
    master, slave = pair.stub(pair.master), pair.stub(pair.slave)
    # A slave's gRPC door takes no writes (RocketMQ's SLAVE_NOT_AVAILABLE, as the proxy answers it).
    refused = _send(slave, _message(b"to-slave", "S0"))
    assert refused.status.code == d.HA_NOT_AVAILABLE and "SLAVE" in refused.status.message, refused
    halves = {}
    for mid in ("TX-GRPC", "TX-4X"):
        sent = _send(master, _message(mid.encode(), mid, message_type=d.TRANSACTION))
        assert sent.status.code == d.OK, sent
        halves[mid] = sent.entries[0].transaction_id
    end_on_slave = _end(slave, halves["TX-GRPC"], "TX-GRPC")
    assert end_on_slave.status.code == d.HA_NOT_AVAILABLE, end_on_slave

    assert pair.slave.proc is not None
    os.killpg(pair.slave.proc.pid, signal.SIGSTOP)
    with ThreadPoolExecutor(4) as pool:
        grpc_commit = pool.submit(_end, master, halves["TX-GRPC"], "TX-GRPC")
        remoting_commit = pool.submit(_end_4x, pair.master.broker_port, halves["TX-4X"], "TX-4X")
        plain = pool.submit(_send, master, _message(b"plain-grpc", "P1"), 60)
        # The master has stored the decisions and the send; it answers none of them before the slave has them.
        _not_answered_while_frozen(grpc_commit, "a gRPC EndTransaction COMMIT")
        _not_answered_while_frozen(remoting_commit, "a 4.x END_TRANSACTION COMMIT")
        _not_answered_while_frozen(plain, "a gRPC send")
        os.killpg(pair.slave.proc.pid, signal.SIGCONT)
        assert grpc_commit.result(60).status.code == d.OK
        answer = remoting_commit.result(60)
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        assert plain.result(60).status.code == d.OK
    # Acknowledged: kill the master at once; the promoted slave has both commits and the send.
    _kill_master_and_promote(pair)
    with Admin(pair.namesrv.addr) as admin:
        # Never reversed: the new master rebuilt its table from its copy and holds neither transaction in doubt.
        assert admin.list_transactions(topic=TOPIC) == []
    # The promoted slave's gRPC door takes sends and transactions.
    promoted = slave
    assert _send(promoted, _message(b"after-grpc", "A1")).status.code == d.OK
    tx = _send(promoted, _message(b"TX-AFTER", "TX-AFTER", message_type=d.TRANSACTION))
    assert tx.status.code == d.OK, tx
    assert _end(promoted, tx.entries[0].transaction_id, "TX-AFTER").status.code == d.OK
    expected = sorted([b"TX-GRPC", b"TX-4X", b"plain-grpc", b"after-grpc", b"TX-AFTER"])
    eventually(lambda: sorted(_bodies(pair.namesrv.addr, "CG_SYNC")) == expected, "every message on the new master")


def _delay_offsets(port: int) -> dict[str, Any]:
    answer = _request(port, RemotingCommand.request(RequestCode.GET_ALL_DELAY_OFFSET, {}), timeout=10)
    assert answer.code == ResponseCode.SUCCESS
    return orjson.loads(answer.body)  # type: ignore[no-any-return]


def test_sync_master_delay_offset_moves_past_a_delivery_only_once_the_slave_has_it(pair: Pair) -> None:
    from txmq.client import Message
    from txmq.client.sync import Producer

    with Producer("PG_DELAY", pair.namesrv.addr) as producer:
        result = producer.send(Message(TOPIC, b"delayed", delay_level=LEVEL))
        assert result.status.name == "SEND_OK", result
    assert pair.slave.proc is not None
    os.killpg(pair.slave.proc.pid, signal.SIGSTOP)
    time.sleep(5.0)  # due after 3 s: the master has re-put it by now
    frozen = _delay_offsets(pair.master.broker_port)
    assert frozen["offsetTable"].get(str(LEVEL), 0) == 0, frozen
    assert frozen["inFlight"].get(str(LEVEL)), frozen
    os.killpg(pair.slave.proc.pid, signal.SIGCONT)
    eventually(
        lambda: _delay_offsets(pair.master.broker_port)["offsetTable"].get(str(LEVEL)) == 1, "offset moves", timeout=30
    )
    # The slave copies the master's delay offsets every slaveSyncInterval: once its copy is past the delivery, a
    # promotion must not deliver it again (a copy from before would: at least once, as in RocketMQ).
    copied = pair.slave.data_dir / "store" / "config" / "delayOffset.json"
    eventually(
        lambda: copied.exists() and orjson.loads(copied.read_bytes())["offsetTable"].get(str(LEVEL)) == 1,
        "the slave copied the delay offset",
        timeout=30,
    )
    _kill_master_and_promote(pair)
    seen: list[list[bytes]] = []
    eventually(
        lambda: seen.append(_bodies(pair.namesrv.addr, "CG_DELAY")) or seen[-1] == [b"delayed"],
        "delivered once on the new master",
    )
    time.sleep(1.5)  # the promoted slave's own delay service must not deliver it again
    assert _bodies(pair.namesrv.addr, "CG_DELAY2") == [b"delayed"]
