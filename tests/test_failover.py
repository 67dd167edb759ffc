"""Controller mode with real processes: a private etcd, a name server and two ``txmq broker`` replicas of one
brokerName (issue 21: automatic failover, fencing, the old master's tail cut when it rejoins)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from txmq.broker.ha.epoch_file import read_epochs, write_epochs
from txmq.client import LocalTransactionState, Message
from txmq.client.sync import Admin, Producer, PullConsumer, TransactionProducer
from txmq.door_grpc.pb import definition_pb2 as d
from txmq.door_grpc.pb import service_pb2 as s
from txmq.door_grpc.pb import service_pb2_grpc
from txmq.errors import CorruptStoreError
from txmq.ha.election import EpochEntry
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import FrameDecoder, RemotingCommand, encode_frame
from txmq.testing import EtcdServer, ExtraBroker, NameServerProcess, etcd_binary, eventually

BROKER = "broker-fo"
TOPIC = "TopicFailover"


def _need_etcd() -> None:
    if etcd_binary() is None:
        if os.environ.get("TXMQ_REQUIRE_ETCD") == "1":
            pytest.fail("etcd is not installed (apt-get install etcd-server) and TXMQ_REQUIRE_ETCD=1")
        pytest.skip("etcd is not installed (apt-get install etcd-server)")


@dataclass
class Replicas:
    etcd: EtcdServer
    namesrv_addr: str
    brokers: list[ExtraBroker]

    def route(self) -> dict[int, str]:
        with Admin(self.namesrv_addr) as admin:
            return dict(admin.cluster_info().broker_addrs.get(BROKER, {}))

    def master(self) -> ExtraBroker:
        addr = self.route()[0]
        return next(b for b in self.brokers if b.broker_addr == addr)

    def other(self, broker: ExtraBroker) -> ExtraBroker:
        return next(b for b in self.brokers if b is not broker)

    def status(self, broker: ExtraBroker) -> dict[str, str]:
        with Admin(self.namesrv_addr) as admin:
            return admin.broker_runtime_info(broker.broker_addr)

    def wait_both_in_sync(self, timeout: float = 30) -> None:
        def ok() -> bool:
            try:
                route = self.route()
                if len(route) != 2 or 0 not in route:
                    return False
                return len(self.status(self.master()).get("haSyncStateSet", "").split(",")) == 2
            except Exception:
                return False

        eventually(ok, "a master and a slave, both in the in-sync set", timeout=timeout)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """One etcd, one name server and two replicas for the module (each test leaves both in sync)."""
    _need_etcd()
    tmp_path = tmp_path_factory.mktemp("failover")
    etcd = EtcdServer(tmp_path / "etcd").start()
    namesrv = NameServerProcess(tmp_path / "namesrv.out").start()
    port = namesrv.port
    common = {
        "brokerName": BROKER,
        "brokerIP1": "127.0.0.1",
        "metricsPort": "0",
        "mappedFileSizeCommitLog": str(16 << 20),
        "brokerRole": "SYNC_MASTER",
        "enableControllerMode": "true",
        "controllerAddr": etcd.endpoint,
        "transactionTimeOut": "1000",
        "transactionCheckInterval": "1000",
    }
    brokers = [ExtraBroker(tmp_path / f"replica{i}", {**common, "brokerId": str(i)}, namesrv_port=port) for i in (1, 2)]
    try:
        for b in brokers:
            b.start()
        r = Replicas(etcd, namesrv.addr, brokers)
        r.wait_both_in_sync()

        with Admin(r.namesrv_addr) as admin:
            admin.create_topic(TOPIC, cluster="DefaultCluster", read_queue_nums=4, write_queue_nums=4)
        yield r
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                os.killpg(b.proc.pid, signal.SIGCONT)
            b.kill()
        namesrv.stop()
        etcd.stop()


def _stored_bodies(namesrv: str) -> list[str]:
    bodies: list[str] = []
    with PullConsumer("FailoverReader", namesrv) as consumer:
        for mq in consumer.fetch_queues(TOPIC):
            offset = 0
            while True:
                result = consumer.pull(mq, "*", offset, 32)
                if result.status.name != "FOUND":
                    break
                bodies += [m.body.decode() for m in result.messages]
                offset = result.next_begin_offset
    return bodies


def _send_acked(producer: Producer, bodies: list[str], timeout: float = 30.0) -> list[str]:
    """Send each body until it is acknowledged (a client retries while the route still names a dead master)."""
    acked = []
    for body in bodies:
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = producer.send(Message(TOPIC, body.encode()))
                if result.status.name == "SEND_OK":
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
        acked.append(body)
    return acked


def _tail_body(k: int) -> bytes:
    return f"tail-{k}-".encode() + b"x" * (3_500_000)


def _raw_send(addr: str, body: bytes, timeout: float = 10.0) -> RemotingCommand | None:
    """One SEND_MESSAGE straight to ``addr``; None when the connection closed without an answer."""
    host, _, port = addr.rpartition(":")
    header = {
        "producerGroup": "PG_RAW",
        "topic": TOPIC,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "0",
        "sysFlag": "0",
        "bornTimestamp": str(int(time.time() * 1000)),
        "flag": "0",
        "properties": "",
        "reconsumeTimes": "0",
        "unitMode": "false",
        "batch": "false",
    }
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(encode_frame(RemotingCommand.request(RequestCode.SEND_MESSAGE, header, body)))
        decoder = FrameDecoder()
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            frames = decoder.feed(chunk)
            if frames:
                return frames[0]


def _grpc_send(broker: ExtraBroker, body: str, *, transactional: bool = False) -> s.SendMessageResponse:
    """One SendMessage through ``broker``'s gRPC door (the 5.x clients' path)."""
    system = d.SystemProperties(message_id=body, body_encoding=d.IDENTITY)
    if transactional:
        system.message_type = d.TRANSACTION
    message = d.Message(topic=d.Resource(name=TOPIC), body=body.encode(), system_properties=system)
    with grpc.insecure_channel(broker.grpc_endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        return stub.SendMessage(s.SendMessageRequest(messages=[message]), timeout=30)


def _grpc_commit(broker: ExtraBroker, tx_id: str) -> s.EndTransactionResponse:
    request = s.EndTransactionRequest(
        topic=d.Resource(name=TOPIC), transaction_id=tx_id, resolution=d.COMMIT, source=d.SOURCE_CLIENT
    )
    with grpc.insecure_channel(broker.grpc_endpoint) as channel:
        return service_pb2_grpc.MessagingServiceStub(channel).EndTransaction(request, timeout=30)


class _Undecided:
    """Leaves every transaction open (as a producer that died before END_TRANSACTION); a check decides by body."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, message: object) -> LocalTransactionState:
        body = message.body.decode()  # type: ignore[attr-defined]
        self.checked.append(body)
        return LocalTransactionState.COMMIT if body.startswith("tx-commit") else LocalTransactionState.ROLLBACK


def test_killed_master_fails_over_checks_its_open_transactions_and_comes_back_without_its_unacknowledged_tail(
    replicas: Replicas,
) -> None:
    replicas.wait_both_in_sync()
    old = replicas.master()
    new = replicas.other(old)
    epoch = int(replicas.status(old)["haEpoch"])
    listener = _Undecided()
    with (
        Producer("PG_FAILOVER", replicas.namesrv_addr) as producer,
        TransactionProducer("PG_FAILOVER_TX", replicas.namesrv_addr, listener) as tx_producer,
    ):
        acked = _send_acked(producer, [f"before-{i}" for i in range(50)])
        # Two transactions left open (as by a producer whose END_TRANSACTION never came): their half messages are
        # acknowledged, so on the slave; the new master must check them back with the producer group.
        for body in ("tx-commit-1", "tx-rollback-1"):
            result = tx_producer.send_message_in_transaction(Message(TOPIC, body.encode()))
            assert result.local_transaction_state is LocalTransactionState.UNKNOWN
        # Freeze the slave, then send more than the master ships ahead of what its slave acknowledged (8 MiB):
        # the master stores it all, the slave's socket gets at most the window, and the rest exists only on the
        # master when it is killed.
        os.killpg(new.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        answers: list[RemotingCommand | None] = []
        senders = [
            threading.Thread(target=lambda k=k: answers.append(_raw_send(old.broker_addr, _tail_body(k))))
            for k in range(4)
        ]
        for t in senders:
            t.start()
        time.sleep(2.0)  # stored on the master, waiting for the frozen slave
        old.kill()
        for t in senders:
            t.join(15)
        assert all(a is None or a.code != ResponseCode.SUCCESS for a in answers)
        os.killpg(new.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        eventually(lambda: replicas.route().get(0) == new.broker_addr, "the slave is elected", timeout=30)
        acked += _send_acked(producer, [f"after-{i}" for i in range(20)])
        # The elected replica's gRPC door takes sends and transactions.
        assert _grpc_send(new, "grpc-after").status.code == d.OK
        half = _grpc_send(new, "grpc-tx-after", transactional=True)
        assert half.status.code == d.OK, half
        assert _grpc_commit(new, half.entries[0].transaction_id).status.code == d.OK
        acked += ["grpc-after", "grpc-tx-after"]
        eventually(
            lambda: "tx-commit-1" in _stored_bodies(replicas.namesrv_addr),
            "the new master checked the open transaction back and committed it",
            timeout=60,
        )
        eventually(lambda: "tx-rollback-1" in listener.checked, "the other one is checked too", timeout=60)

    old.start()
    replicas.wait_both_in_sync()
    assert replicas.route()[0] == new.broker_addr
    # The old master, now a slave, serves a gRPC door that refuses writes.
    refused = _grpc_send(old, "to-the-old-master")
    assert refused.status.code == d.HA_NOT_AVAILABLE and "SLAVE" in refused.status.message, refused
    log_text = old.log_text()
    assert "dropped" in log_text and "that the new master never had" in log_text, log_text[-3000:]
    dropped = int(log_text.split("dropped ")[1].split(" bytes")[0])
    assert int(replicas.status(old)["haTruncatedBytes"]) == dropped > 0
    stored = _stored_bodies(replicas.namesrv_addr)
    assert set(acked) <= set(stored)  # nothing acknowledged lost
    assert stored.count("tx-commit-1") == 1
    assert "tx-rollback-1" not in stored
    tails = [b for b in stored if b.startswith("tail-")]
    assert len(tails) < 4  # what the new master never had was cut from the old master's log
    # The old master's epoch file now holds the controller's history: its epoch, then the new master's.
    epochs = read_epochs(str(old.data_dir / "store"))
    assert [e.epoch for e in epochs][-2:] == [epoch, epoch + 1]
    assert epochs[-1].start_offset > 0
    status = replicas.status(new)
    assert status["haEpoch"] == str(epoch + 1) and status["haControllerRole"] == "leading"
    shown = subprocess.run(
        [sys.executable, "-m", "txmq", "admin", "-n", replicas.namesrv_addr, "cluster", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    members = ",".join(sorted(b.broker_addr for b in replicas.brokers))
    assert f"leading, epoch {epoch + 1}, in-sync set [{members}]" in shown, shown
    assert f"following, epoch {epoch + 1}, in-sync set [{members}]" in shown, shown


def test_a_master_frozen_longer_than_its_lease_acknowledges_nothing_and_rejoins_as_a_slave(
    replicas: Replicas,
) -> None:
    replicas.wait_both_in_sync()
    old = replicas.master()
    new = replicas.other(old)
    with Producer("PG_FAILOVER", replicas.namesrv_addr) as producer:
        acked = _send_acked(producer, [f"before-{i}" for i in range(20)])
        os.killpg(old.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            eventually(lambda: replicas.route().get(0) == new.broker_addr, "the slave takes over", timeout=30)
            # The frozen master still holds its connections; a send queued to it now is read when it wakes up.
            answer: list[RemotingCommand | None] = []
            sender = threading.Thread(target=lambda: answer.append(_raw_send(old.broker_addr, b"split-brain?")))
            sender.start()
            time.sleep(0.5)
        finally:
            os.killpg(old.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        sender.join(20)
        assert answer, "no answer from the woken master"
        assert answer[0] is None or answer[0].code != ResponseCode.SUCCESS, answer[0]
        acked += _send_acked(producer, [f"after-{i}" for i in range(20)])
    replicas.wait_both_in_sync()
    assert replicas.route()[0] == new.broker_addr
    assert "rejoining as a slave" in old.log_text()
    assert "fenced" in old.log_text()
    stored = _stored_bodies(replicas.namesrv_addr)
    assert set(acked) <= set(stored)
    assert "split-brain?" not in stored  # the woken master stored it at most in a tail it then cut


def test_while_etcd_is_unreachable_the_master_acknowledges_nothing_and_serves_again_after(replicas: Replicas) -> None:
    replicas.wait_both_in_sync()
    master = replicas.master()
    etcd = replicas.etcd.proc
    assert etcd is not None
    os.killpg(etcd.pid, signal.SIGSTOP)
    try:
        time.sleep(3.0)  # longer than two thirds of the 3 s lease: the master cannot know it still leads
        answer = _raw_send(master.broker_addr, b"while-etcd-is-away")
        assert answer is not None and answer.code == ResponseCode.SERVICE_NOT_AVAILABLE, answer
        assert "fenced" in (answer.remark or "")
    finally:
        os.killpg(etcd.pid, signal.SIGCONT)
    with Producer("PG_FAILOVER", replicas.namesrv_addr) as producer:
        acked = _send_acked(producer, ["after-etcd-came-back"], timeout=60)
    replicas.wait_both_in_sync()
    assert "after-etcd-came-back" in _stored_bodies(replicas.namesrv_addr) and acked


def test_epoch_file_round_trips_and_refuses_garbage(tmp_path: Path) -> None:
    entries = [EpochEntry(1, 0), EpochEntry(3, 4096)]
    write_epochs(str(tmp_path), entries)
    assert read_epochs(str(tmp_path)) == entries
    assert read_epochs(str(tmp_path / "none")) == []
    (tmp_path / "epochFile").write_text("1 0\nthree 12\n")
    with pytest.raises(CorruptStoreError, match="epochFile:2"):
        read_epochs(str(tmp_path))
    (tmp_path / "epochFile").write_text("2 0\n1 12\n")
    with pytest.raises(CorruptStoreError, match="does not follow"):
        read_epochs(str(tmp_path))
