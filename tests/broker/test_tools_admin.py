"""The requests RocketMQ's mqadmin sends to a broker, sent the way MQClientAPIImpl sends them, on an in-process broker.

Each test pins a reply shape mqadmin parses (AdminBrokerProcessor / Broker2Client in RocketMQ 4.9.8); the Java tool
itself runs in tests/compat/test_mqadmin.py.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from txmq.broker.tools_admin import TpsSampler, java_name, properties_text
from txmq.config import read_properties
from txmq.net import Connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.record import encode_properties
from txmq.testing import InProcessBroker

_uniq = itertools.count(1)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[InProcessBroker]:
    harness = InProcessBroker(tmp_path, broker_name="broker-t", broker_cluster_name="ClusterT")
    await harness.start()
    yield harness
    await harness.stop()


async def call(conn: Connection, code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
    return await conn.request(RemotingCommand.request(code, ext or {}, body), timeout=5)


async def create_topic(conn: Connection, topic: str, queues: int) -> None:
    ext = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": str(queues),
        "writeQueueNums": str(queues),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
    }
    resp = await call(conn, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def send(conn: Connection, topic: str, queue_id: int, body: bytes) -> None:
    props = encode_properties({"UNIQ_KEY": f"UNIQ{next(_uniq):028d}", "TAGS": "A"})
    header = SendMessageRequestHeader(
        producerGroup="PG", topic=topic, queueId=queue_id, sysFlag=0, bornTimestamp=1, properties=props
    )
    resp = await conn.request(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext(), body), timeout=5)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def heartbeat(
    conn: Connection, client_id: str, *, producer: str = "", consumer: str = "", topic: str = ""
) -> None:
    data: dict[str, object] = {"clientID": client_id, "producerDataSet": [], "consumerDataSet": []}
    if producer:
        data["producerDataSet"] = [{"groupName": producer}]
    if consumer:
        data["consumerDataSet"] = [
            {
                "groupName": consumer,
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [], "subVersion": 1}],
                "unitMode": False,
            }
        ]
    resp = await call(conn, RequestCode.HEART_BEAT, body=orjson.dumps(data))
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def commit_offset(conn: Connection, group: str, topic: str, queue_id: int, offset: int) -> None:
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "commitOffset": str(offset)}
    resp = await call(conn, RequestCode.UPDATE_CONSUMER_OFFSET, ext)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


# -- GET_BROKER_CONFIG (26) ----------------------------------------------------------------------------------------


async def test_broker_config_is_a_properties_text_with_a_data_version(broker: InProcessBroker) -> None:
    conn = await broker.connect()
    resp = await call(conn, RequestCode.GET_BROKER_CONFIG)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    props = read_properties(resp.body.decode("ascii"))
    assert props["brokerName"] == "broker-t"
    assert props["brokerClusterName"] == "ClusterT"
    assert props["listenPort"] == str(broker.broker.config.listen_port)  # type: ignore[union-attr]
    assert props["brokerIP1"] == "127.0.0.1"
    assert props["flushDiskType"] == "SYNC_FLUSH"
    assert props["autoCreateTopicEnable"] == "true"
    assert props["mappedFileSizeCommitLog"] == str(1 << 20)
    version = orjson.loads(resp.ext_fields["version"])
    assert version["counter"] >= 1 and "timestamp" in version


def test_properties_text_escapes_what_java_properties_load_would_misread() -> None:
    text = properties_text({"path": "C:\\data", "a=b": " lead", "name": "caf\u00e9", "z": "x:y"})
    assert text.splitlines() == ["a\\=b=\\ lead", "name=caf\\u00e9", "path=C:\\\\data", "z=x:y"]
    assert java_name("broker_cluster_name") == "brokerClusterName"
    assert java_name("broker_ip1") == "brokerIP1"


# -- GET_BROKER_RUNTIME_INFO (28): the keys clusterList reads ------------------------------------------------------


async def test_runtime_info_has_the_keys_cluster_list_parses(broker: InProcessBroker) -> None:
    conn = await broker.connect()
    await create_topic(conn, "RT", 1)
    await send(conn, "RT", 0, b"x")
    resp = await call(conn, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    table = orjson.loads(resp.body)["table"]
    assert all(isinstance(v, str) for v in table.values())
    for key in (
        "putTps",
        "getTransferedTps",
        "sendThreadPoolQueueSize",
        "pullThreadPoolQueueSize",
        "sendThreadPoolQueueHeadWaitTimeMills",
        "pullThreadPoolQueueHeadWaitTimeMills",
        "pageCacheLockTimeMills",
        "commitLogDiskRatio",
        "msgPutTotalTodayMorning",
    ):
        assert key in table, key
    # clusterList does putTps.split(" ")[0] and Double.parseDouble on it, and Long.valueOf(earliestMessageTimeStamp).
    assert len(table["putTps"].split(" ")) == 3
    assert int(table["earliestMessageTimeStamp"]) > 0
    assert 0.0 <= float(table["commitLogDiskRatio"]) <= 1.0
    # txmq's structured statistics are JSON text, not Python reprs.
    assert orjson.loads(table["store.topic_puts"]) == {"RT": 1}


def test_tps_windows_fill_as_samples_arrive() -> None:
    sampler = TpsSampler()
    assert sampler.tps(1) == "0.00 0.00 0.00"  # never blank: clusterList parses the first figure as a double
    for second in range(11):
        sampler.sample(float(second), put_total=second * 5, get_total=second * 2)
    assert sampler.tps(1) == "5.00 5.00 5.00"  # a window not yet full covers the samples there are
    assert sampler.tps(2) == "2.00 2.00 2.00"
    for second in range(11, 61):
        sampler.sample(float(second), put_total=55 + (second - 10) * 1, get_total=20)
    assert sampler.tps(1).split(" ")[:2] == ["1.00", f"{(105 - 0) / 60:.2f}"]
    assert sampler.runtime_info()["getTransferedTps"].split(" ")[0] == "0.00"


# -- GET_PRODUCER_CONNECTION_LIST (204) ----------------------------------------------------------------------------


async def test_producer_connections_list_live_producers(broker: InProcessBroker) -> None:
    producer = await broker.connect()
    await heartbeat(producer, "10.0.0.1@p1", producer="PG_LIVE")
    admin = await broker.connect()
    resp = await call(admin, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG_LIVE"})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    (conn,) = orjson.loads(resp.body)["connectionSet"]
    assert conn["clientId"] == "10.0.0.1@p1"
    assert conn["clientAddr"].startswith("127.0.0.1:")
    assert isinstance(conn["version"], int) and conn["language"]

    resp = await call(admin, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG_NONE"})
    assert resp.code == ResponseCode.SYSTEM_ERROR
    assert resp.remark == "the producer group[PG_NONE] not exist"


# -- QUERY_TOPIC_CONSUME_BY_WHO (300) ------------------------------------------------------------------------------


async def test_topic_consumed_by_online_subscribers_and_groups_with_offsets(broker: InProcessBroker) -> None:
    conn = await broker.connect()
    await create_topic(conn, "WHO", 2)
    await heartbeat(conn, "c1", consumer="CG_ONLINE", topic="WHO")
    await commit_offset(conn, "CG_OFFLINE", "WHO", 0, 0)
    await commit_offset(conn, "CG_ELSEWHERE", "OTHER", 0, 0)
    resp = await call(conn, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "WHO"})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert sorted(orjson.loads(resp.body)["groupList"]) == ["CG_OFFLINE", "CG_ONLINE"]


# -- GET_CONSUME_STATS (208) ---------------------------------------------------------------------------------------


async def test_consume_stats_of_an_online_group_cover_only_its_subscriptions(broker: InProcessBroker) -> None:
    conn = await broker.connect()
    await create_topic(conn, "SUBBED", 1)
    await create_topic(conn, "DROPPED", 1)
    await commit_offset(conn, "CG_S", "SUBBED", 0, 0)
    await commit_offset(conn, "CG_S", "DROPPED", 0, 0)
    resp = await call(conn, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "CG_S"})
    assert b'"topic":"DROPPED"' in resp.body and b'"topic":"SUBBED"' in resp.body
    await heartbeat(conn, "c1", consumer="CG_S", topic="SUBBED")
    resp = await call(conn, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "CG_S"})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert b'"topic":"SUBBED"' in resp.body
    assert b'"topic":"DROPPED"' not in resp.body  # RocketMQ skips topics an online group no longer subscribes to


# -- INVOKE_BROKER_TO_RESET_OFFSET (222) ---------------------------------------------------------------------------


async def test_reset_offset_needs_an_online_group_with_offsets_and_tells_its_consumers(broker: InProcessBroker) -> None:
    told: list[RemotingCommand] = []

    def consumer_side(_conn: Connection, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            told.append(cmd)

    conn = await broker.connect(consumer_side)
    await create_topic(conn, "RESET", 2)
    for i in range(3):
        await send(conn, "RESET", 0, b"m%d" % i)
    await send(conn, "RESET", 1, b"n")
    ext = {"topic": "RESET", "group": "CG_R", "timestamp": "0", "isForce": "true"}

    resp = await call(conn, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext)
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "THe consumer group <CG_R> not exist")

    await commit_offset(conn, "CG_R", "RESET", 0, 3)
    await commit_offset(conn, "CG_R", "RESET", 1, 1)
    resp = await call(conn, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext)
    # mqadmin falls back to rewriting offsets itself on exactly this code.
    assert resp.code == ResponseCode.CONSUMER_NOT_ONLINE
    assert resp.remark.startswith("Consumer not online, so can not reset offset, Group: CG_R Topic: RESET")

    await heartbeat(conn, "c1", consumer="CG_R", topic="RESET")
    resp = await call(conn, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    expected = (
        b'{"offsetTable":{{"brokerName":"broker-t","queueId":0,"topic":"RESET"}:0,'
        b'{"brokerName":"broker-t","queueId":1,"topic":"RESET"}:0}}'
    )
    assert resp.body == expected  # ResetOffsetBody, MessageQueue keys in fastjson's object-key form
    query = {"consumerGroup": "CG_R", "topic": "RESET", "queueId": "0"}
    offset = await call(conn, RequestCode.QUERY_CONSUMER_OFFSET, query)
    assert offset.ext_fields["offset"] == "0"
    for _ in range(100):
        if told:
            break
        await call(conn, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert told and told[0].ext_fields["group"] == "CG_R" and told[0].body == expected

    # timestamp -1 means "now": every queue to its max offset.
    resp = await call(conn, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {**ext, "timestamp": "-1"})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert b'"queueId":0,"topic":"RESET"}:3' in resp.body and b'"queueId":1,"topic":"RESET"}:1' in resp.body

    resp = await call(conn, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {**ext, "topic": "NOPE"})
    assert resp.code == ResponseCode.SYSTEM_ERROR
    assert "no topic in this broker. topic=NOPE" in resp.remark


# -- refused tool requests -----------------------------------------------------------------------------------------


async def test_update_broker_config_is_refused_with_a_reason(broker: InProcessBroker) -> None:
    conn = await broker.connect()
    resp = await call(conn, RequestCode.UPDATE_BROKER_CONFIG, body=b"brokerPermission=4\n")
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert resp.remark.startswith("not supported by txmq: ")
    config = read_properties((await call(conn, RequestCode.GET_BROKER_CONFIG)).body.decode("ascii"))
    assert config["brokerPermission"] == "6"
