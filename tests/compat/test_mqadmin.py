"""RocketMQ's own operator tool, ``mqadmin`` (MQAdminStartup from rocketmq-tools 4.9.8), against ``txmq dev``.

The tool's classpath is resolved by Maven (tests/compat/mqadmin/build.sh). Each command runs in its own JVM against
a real txmq process; the tests read what mqadmin prints. mqadmin exits 0 even when a command fails (it prints the
exception), so success is judged by the output: the expected figures and no Java exception.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster_harness import DevCluster
from listeners import Collector
from txmq.client import Message
from txmq.client.sync import Admin, Producer, PushConsumer
from txmq.testing import eventually

pytestmark = pytest.mark.slow

MQADMIN_DIR = Path(__file__).parent / "mqadmin"
LIB_DIR = MQADMIN_DIR / "target" / "lib"
MAIN_CLASS = "org.apache.rocketmq.tools.command.MQAdminStartup"
COMMAND_TIMEOUT = 90.0
# mqadmin writes each queried body here (QueryMsgByIdSubCommand.createBodyFile); the path is fixed in the tool.
BODY_DIR = Path("/tmp/rocketmq/msgbodys")


@dataclass
class Run:
    command: str
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    def ok(self) -> Run:
        """The command succeeded: mqadmin printed no exception (it prints one for any failed request)."""
        assert "Exception" not in self.text and "\tat " not in self.text, f"mqadmin {self.command}:\n{self.text}"
        return self


@pytest.fixture(scope="session")
def mqadmin_classpath() -> str:
    if shutil.which("java") is None:
        pytest.fail("java is not installed: the mqadmin compatibility tests need a JRE (11 or newer)")
    if not list(LIB_DIR.glob("rocketmq-tools-*.jar")):
        built = subprocess.run(
            ["bash", str(MQADMIN_DIR / "build.sh")], capture_output=True, text=True, timeout=900, check=False
        )
        if built.returncode != 0:
            pytest.fail(f"building mqadmin's classpath failed:\n{built.stdout}\n{built.stderr}")
    return str(LIB_DIR / "*")


@pytest.fixture(scope="session")
def mqadmin_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mqadmin-home")


@pytest.fixture
def mqadmin(mqadmin_classpath: str, mqadmin_home: Path, txmq_cluster: DevCluster) -> Iterator[Callable[..., Run]]:
    """``mqadmin("topicList")`` runs one mqadmin command against the session's txmq; the broker must not fail."""
    log_before = len(txmq_cluster.log_text())

    def run(command: str, *args: str) -> Run:
        cmd = [
            "java",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Drocketmq.home.dir={MQADMIN_DIR}",  # conf/logback_tools.xml, read at start
            f"-Dtxmq.mqadmin.logDir={mqadmin_home}",
            f"-Drocketmq.client.logRoot={mqadmin_home}",
            f"-Duser.home={mqadmin_home}",
            "-cp",
            mqadmin_classpath,
            MAIN_CLASS,
            command,
            "-n",
            txmq_cluster.namesrv_addr,
            *args,
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"mqadmin {command} {' '.join(args)} hung for {COMMAND_TIMEOUT} s: {exc.stdout!r}")
        return Run(f"{command} {' '.join(args)}", done.stdout, done.stderr)

    yield run
    new_log = txmq_cluster.log_text()[log_before:]
    assert "Traceback" not in new_log, new_log


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _table(text: str, sep: str) -> dict[str, str]:
    """``key <sep> value`` lines (brokerStatus uses ':', getBrokerConfig '=')."""
    rows = {}
    for line in text.splitlines():
        key, found, value = line.partition(sep)
        if found and key.strip() and not key.startswith("="):
            rows[key.strip()] = value.strip()
    return rows


def _rows(text: str, first: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.split()[:1] == [first]]


# -- cluster and broker ----------------------------------------------------------------------------------------------


def test_cluster_list_shows_the_broker_and_its_runtime_figures(
    mqadmin: Callable[..., Run], txmq_cluster: DevCluster
) -> None:
    out = mqadmin("clusterList").ok().stdout
    (row,) = _rows(out, "DefaultCluster")
    assert row[1:5] == ["broker-a", "0", txmq_cluster.broker_addr, "V4_9_8"]
    # "#InTPS(LOAD)" is "<putTps>(<send queue>,<head wait>ms)": figures, not "null".
    assert re.fullmatch(r"\d+\.\d\d\(0,0ms\)", row[5]), row
    assert "null" not in out


def test_broker_status_prints_the_runtime_table(mqadmin: Callable[..., Run], txmq_cluster: DevCluster) -> None:
    with Producer(_name("PG"), txmq_cluster.namesrv_addr) as producer:
        producer.send(Message(_name("StatusTopic"), b"counted"))
    status = _table(mqadmin("brokerStatus", "-b", txmq_cluster.broker_addr).ok().stdout, " : ")
    assert status["brokerVersionDesc"] == "V4_9_8"
    assert int(status["msgPutTotalTodayNow"]) >= 1
    assert int(status["commitLogMaxOffset"]) > 0
    assert int(status["earliestMessageTimeStamp"]) > 0
    assert len(status["putTps"].split()) == 3 and float(status["putTps"].split()[0]) >= 0
    assert 0 <= float(status["commitLogDiskRatio"]) <= 1


def test_get_broker_config_by_broker_and_by_cluster(mqadmin: Callable[..., Run], txmq_cluster: DevCluster) -> None:
    by_broker = mqadmin("getBrokerConfig", "-b", txmq_cluster.broker_addr).ok().stdout
    assert f"============{txmq_cluster.broker_addr}============" in by_broker
    config = _table(by_broker, "=  ")
    assert config["brokerName"] == "broker-a"
    assert config["brokerClusterName"] == "DefaultCluster"
    assert config["listenPort"] == str(txmq_cluster.broker_port)
    assert config["messageDelayLevel"] == txmq_cluster.conf["messageDelayLevel"]
    assert config["mappedFileSizeCommitLog"] == txmq_cluster.conf["mappedFileSizeCommitLog"]
    assert config["flushDiskType"] == "SYNC_FLUSH"

    by_cluster = mqadmin("getBrokerConfig", "-c", "DefaultCluster").ok().stdout
    assert f"============Master: {txmq_cluster.broker_addr}============" in by_cluster
    assert _table(by_cluster, "=  ")["brokerName"] == "broker-a"


def test_update_broker_config_is_refused_cleanly(mqadmin: Callable[..., Run], txmq_cluster: DevCluster) -> None:
    run = mqadmin("updateBrokerConfig", "-b", txmq_cluster.broker_addr, "-k", "brokerPermission", "-v", "4")
    assert "CODE: 3  DESC: not supported by txmq: updating the broker configuration at runtime" in run.text


# -- topics ----------------------------------------------------------------------------------------------------------


def test_topic_create_list_route_status_delete(mqadmin: Callable[..., Run], txmq_cluster: DevCluster) -> None:
    topic = _name("AdminTopic")
    created = mqadmin("updateTopic", "-t", topic, "-c", "DefaultCluster", "-r", "3", "-w", "3").ok().stdout
    assert f"create topic to {txmq_cluster.broker_addr} success." in created
    assert f"TopicConfig [topicName={topic}, readQueueNums=3, writeQueueNums=3, perm=RW-" in created

    assert topic in mqadmin("topicList").ok().stdout.split()

    route = mqadmin("topicRoute", "-t", topic).ok().stdout
    assert f'"brokerAddrs":{{0:"{txmq_cluster.broker_addr}"' in route.replace("\n", "").replace("\t", "")
    assert '"brokerName":"broker-a"' in route and '"readQueueNums":3' in route and '"writeQueueNums":3' in route

    with Producer(_name("PG"), txmq_cluster.namesrv_addr) as producer:
        for _ in range(3):
            producer.send(Message(topic, b"x"))
    status = _rows(mqadmin("topicStatus", "-t", topic).ok().stdout, "broker-a")
    assert [r[1:3] for r in status] == [["0", "0"], ["1", "0"], ["2", "0"]]
    assert sum(int(r[3]) for r in status) == 3  # max offsets: every message counted once

    deleted = mqadmin("deleteTopic", "-t", topic, "-c", "DefaultCluster").ok().stdout
    assert f"delete topic [{topic}] from cluster [DefaultCluster] success." in deleted
    assert f"delete topic [{topic}] from NameServer success." in deleted
    assert topic not in mqadmin("topicList").ok().stdout.split()
    # mqadmin's own report of a topic without a route (the name server's TOPIC_NOT_EXIST, 17).
    assert "CODE: 17  DESC: No topic route info in name server for the topic: " + topic in (
        mqadmin("topicRoute", "-t", topic).text
    )


# -- messages --------------------------------------------------------------------------------------------------------


def test_send_query_and_consume_messages(mqadmin: Callable[..., Run], txmq_cluster: DevCluster) -> None:
    topic, key, body = _name("MsgTopic"), _name("key"), _name("body")
    mqadmin("updateTopic", "-t", topic, "-c", "DefaultCluster", "-r", "1", "-w", "1").ok()

    sent = _rows(mqadmin("sendMessage", "-t", topic, "-p", body, "-k", key, "-c", "TagM").ok().stdout, "broker-a")
    ((_, queue_id, result, msg_id),) = sent
    assert (queue_id, result) == ("0", "SEND_OK")

    by_key = mqadmin("queryMsgByKey", "-t", topic, "-k", key).ok().stdout
    assert [msg_id, "0", "0"] in [line.split() for line in by_key.splitlines()]

    by_offset = mqadmin("queryMsgByOffset", "-t", topic, "-b", "broker-a", "-i", "0", "-o", "0").ok().stdout
    shown = _table(by_offset, ": ")
    assert (shown["Topic"], shown["Tags"], shown["Keys"], shown["Queue Offset"]) == (topic, "[TagM]", f"[{key}]", "0")
    assert shown["Store Host"] == txmq_cluster.broker_addr
    assert (BODY_DIR / msg_id).read_text() == body
    offset_id = shown["OffsetID"]

    by_id = _table(mqadmin("queryMsgById", "-i", offset_id).ok().stdout, ": ")
    assert (by_id["OffsetID"], by_id["Topic"], by_id["Keys"]) == (offset_id, topic, f"[{key}]")
    assert f"UNIQ_KEY={msg_id}" in by_id["Properties"]

    consumed = mqadmin("consumeMessage", "-t", topic, "-b", "broker-a", "-i", "0", "-o", "0", "-c", "1").ok().stdout
    assert f"MSGID: {msg_id} " in consumed and consumed.rstrip().count(f"BODY: {body}") == 1
    assert "print msg finished. status=NO_NEW_MSG, offset=1" in consumed


# -- groups and live clients -----------------------------------------------------------------------------------------


def test_update_sub_group(mqadmin: Callable[..., Run], txmq_cluster: DevCluster) -> None:
    group = _name("SubGroup")
    out = mqadmin("updateSubGroup", "-g", group, "-c", "DefaultCluster", "-r", "3", "-q", "2").ok().stdout
    assert f"create subscription group to {txmq_cluster.broker_addr} success." in out
    assert f"SubscriptionGroupConfig [groupName={group}, consumeEnable=true" in out
    # The broker applies the group's settings: its retry topic gets the 2 queues asked for (-q).
    topic = _name("SubTopic")
    consumer = PushConsumer(group, txmq_cluster.namesrv_addr)
    consumer.subscribe(topic)
    consumer.register_listener(Collector())
    with Admin(txmq_cluster.namesrv_addr) as admin:
        admin.create_topic(topic, cluster="DefaultCluster", read_queue_nums=1, write_queue_nums=1)
        with consumer:
            eventually(lambda: _retry_queues(admin, group) == 2, "the group's retry topic with 2 queues")


def _retry_queues(admin: Admin, group: str) -> int:
    try:
        return sum(q.read_queue_nums for q in admin.topic_route(f"%RETRY%{group}").queue_datas)
    except Exception:
        return 0


def test_live_producer_and_consumer_progress_and_offset_reset(
    mqadmin: Callable[..., Run], txmq_cluster: DevCluster
) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, pgroup, cgroup = _name("LiveTopic"), _name("LivePG"), _name("LiveCG")
    bodies = [f"live-{i}".encode() for i in range(6)]
    collector = Collector()
    with Admin(ns) as admin, Producer(pgroup, ns) as producer:
        admin.create_topic(topic, cluster="DefaultCluster", read_queue_nums=2, write_queue_nums=2)
        results = [producer.send(Message(topic, b, tags="TagL", keys=b.decode())) for b in bodies]
        consumer = PushConsumer(cgroup, ns)
        consumer.subscribe(topic, "*")
        consumer.register_listener(collector)
        consumer.start()
        try:
            eventually(lambda: sorted(collector.bodies()) == bodies, "the consumer to receive every message")
            eventually(
                lambda: _lag(admin, cgroup, topic) == 0, "the consumer's offsets to reach the broker's", timeout=30
            )

            conns = mqadmin("producerConnection", "-g", pgroup, "-t", topic).ok().stdout
            assert re.search(
                rf"^0001\s+{re.escape(producer.client_id)}\s+127\.0\.0\.1:\d+\s+PYTHON\s+V4_9_8$", conns, re.M
            )

            cc = mqadmin("consumerConnection", "-g", cgroup).ok().stdout
            assert re.search(rf"^{re.escape(consumer.client_id)}\s+127\.0\.0\.1:\d+\s+PYTHON\s+V4_9_8$", cc, re.M)
            assert re.search(rf"^{topic}\s+\*$", cc, re.M)
            assert "ConsumeType: CONSUME_PASSIVELY" in cc and "MessageModel: CLUSTERING" in cc

            progress = mqadmin("consumerProgress", "-g", cgroup).ok().stdout
            rows = _rows(progress, topic)
            assert [r[1:3] for r in rows] == [["broker-a", "0"], ["broker-a", "1"]]
            assert sum(int(r[3]) for r in rows) == len(bodies)
            assert all(r[3] == r[4] and r[5] == "0" for r in rows), rows  # consumer offset == broker offset
            assert "Diff Total: 0" in progress

            groups = _rows(mqadmin("consumerProgress").ok().stdout, cgroup)
            assert [g[1:5] for g in groups] == [["1", "V4_9_8", "PUSH", "CLUSTERING"]]

            who = mqadmin("topicList", "-c").ok().stdout
            assert ["DefaultCluster", topic, cgroup] in [line.split() for line in who.splitlines()]

            tracked = mqadmin("queryMsgById", "-i", results[0].offset_msg_id).ok().stdout
            assert f"MessageTrack [consumerGroup={cgroup}, trackType=CONSUMED, exceptionDesc=null]" in tracked

            # Online group: the broker rewinds it (INVOKE_BROKER_TO_RESET_OFFSET) and the consumer re-reads it all.
            reset = mqadmin("resetOffsetByTime", "-g", cgroup, "-t", topic, "-s", "0").ok().stdout
            assert f"rollback consumer offset by specified group[{cgroup}], topic[{topic}], force[true]" in reset
            assert sorted(r[1:3] for r in _rows(reset, "broker-a")) == [["0", "0"], ["1", "0"]]
            eventually(
                lambda: sorted(collector.bodies()) == sorted(bodies * 2), "every message a second time after the reset"
            )
        finally:
            consumer.shutdown()

        # Offline group: mqadmin falls back to rewriting the offsets itself (CONSUMER_NOT_ONLINE, then
        # SEARCH_OFFSET_BY_TIMESTAMP and UPDATE_CONSUMER_OFFSET per queue).
        eventually(lambda: not _online(admin, cgroup), "the consumer to leave its group")
        offline = mqadmin("resetOffsetByTime", "-g", cgroup, "-t", topic, "-s", "0").ok().stdout
        assert f"rollback consumer offset by specified consumerGroup[{cgroup}], topic[{topic}]" in offline
        rolled = _rows(offline, "broker-a")
        assert sorted(r[1] for r in rolled) == ["0", "1"] and all(r[-1] == "0" for r in rolled)
        assert _lag(admin, cgroup, topic) == len(bodies)


def _lag(admin: Admin, group: str, topic: str) -> int | None:
    try:
        stats = admin.consume_stats(group, topic)
    except Exception:
        return None
    return stats.diff_total if stats.offset_table else None


def _online(admin: Admin, group: str) -> bool:
    try:
        return bool(admin.consumer_ids(group))
    except Exception:
        return False
